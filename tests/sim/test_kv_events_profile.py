"""The profile's `sglang.kv_events`: validated as SGLang's KVEventsConfig, rendered by `launch` on every
server (and accepted by SGLang 0.5.23's own parser and config model), and given to the simulated
servers of the same profile, each on its own ports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.sglang import server_args
from infer_ctl.errors import ProfileError
from infer_ctl.launch.argcheck import parse_with_sglang, sglang_available
from infer_ctl.profile import Profile
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.sim.from_profile import specs_from_profile
from infer_ctl.sim.kv_ports import assign_kv_event_ports

KV = {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600", "topic": "kv"}
RENDERED = json.dumps(KV, sort_keys=True, separators=(",", ":"))


def _data(**sglang: Any) -> dict[str, Any]:
    return {
        "name": "kv",
        "nodes": [
            {"name": "pf-01", "host": "10.9.9.1", "roles": ["prefill"]},
            {"name": "dc-01", "host": "10.9.9.2", "roles": ["decode"]},
        ],
        "models": {"target": {"path": "/m"}},
        "sglang": {"kv_events": KV, **sglang,
                   "extra_args": {"prefill": ["--page-size", "16"], "decode": ["--page-size=16"]}},
    }  # fmt: skip


def _profile(**sglang: Any) -> Profile:
    return validate_profile_data(_data(**sglang))


def test_unknown_keys_and_values_are_refused_with_their_path() -> None:
    with pytest.raises(ProfileError, match=r"sglang\.kv_events\.endpont: unknown key 'endpont' \(did you mean 'endpoint'\?\)"):
        validate_profile_data({**_data(), "sglang": {"kv_events": {"publisher": "zmq", "endpont": "x"}}})
    with pytest.raises(ProfileError, match=r"sglang\.kv_events\.publisher"):
        validate_profile_data({**_data(), "sglang": {"kv_events": {"publisher": "kafka"}}})


def _dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    path = tmp_path / "kv.yaml"
    path.write_text(json.dumps(_data()))  # JSON is YAML
    assert main(["launch", "-p", str(path), "--dry-run", "--json"]) == 0
    results: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["results"]
    return results


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_launch_dry_run_renders_the_config_on_every_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = _dry_run(tmp_path, capsys)
    assert [r["instance"] for r in results] == ["pf-01-prefill", "dc-01-decode"]
    assert [_flag(r["argv"], "--kv-events-config") for r in results] == [RENDERED, RENDERED]


@pytest.mark.sglang
@pytest.mark.skipif(not sglang_available(), reason="sglang not importable: pip install 'inferctl[sglang]'")
def test_sglang_parses_the_rendered_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sglang.srt.disaggregation.kv_events import KVEventsConfig

    for r in _dry_run(tmp_path, capsys):
        parsed = parse_with_sglang(server_args(r["argv"]))
        assert parsed.kv_events_config == RENDERED
        cfg = KVEventsConfig.from_cli(parsed.kv_events_config)
        assert (cfg.publisher, cfg.endpoint, cfg.replay_endpoint, cfg.topic) == ("zmq", "tcp://*:5557", "tcp://*:5600", "kv")


def test_the_simulated_servers_of_the_profile_publish_as_launch_renders() -> None:
    specs = specs_from_profile(_profile())
    assert [s.kv_events_config for s in specs] == [RENDERED, RENDERED]
    assert [s.page_size for s in specs] == [16, 16]  # the roles' --page-size extra args
    moved = [json.loads(s.kv_events_config or "") for s in assign_kv_event_ports(specs)]
    assert [(c["endpoint"], c["replay_endpoint"]) for c in moved] == [
        ("tcp://*:5557", "tcp://*:5600"), ("tcp://*:5558", "tcp://*:5601")]  # fmt: skip
    # an extra arg replaces the profile's config for that server, in the simulator as in launch
    own = '{"publisher":"zmq","endpoint":"tcp://*:7000"}'
    data = _data()
    data["nodes"][1]["overrides"] = {"extra_args": ["--kv-events-config", own]}
    specs = specs_from_profile(validate_profile_data(data))
    assert [s.kv_events_config for s in specs] == [RENDERED, own]


def test_a_profile_without_kv_events_renders_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _data()
    del data["sglang"]["kv_events"]
    path = tmp_path / "plain.yaml"
    path.write_text(json.dumps(data))
    assert main(["launch", "-p", str(path), "--dry-run", "--json"]) == 0
    assert all("--kv-events-config" not in r["argv"] for r in json.loads(capsys.readouterr().out)["results"])
    assert all(s.kv_events_config is None for s in specs_from_profile(validate_profile_data(data)))
