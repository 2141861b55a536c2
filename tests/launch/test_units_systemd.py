"""The systemd units launch renders: accepted by systemd's own parser (`systemd-analyze verify`, from
apt's `systemd` package) for every shipped profile and variants, with a start limit, KillMode
control-group and a dedicated user; paths systemd would reject are refused when the profile loads; a
unit that hit its start limit is reported by `status` and `check servers`, and launch clears it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.cli.main import main
from infer_ctl.launch import supervisor
from infer_ctl.launch.render import instances, render_unit, unit_name
from infer_ctl.profile import Profile, load_profile
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.remote.local import LocalConnector
from infer_ctl.resources import builtin_profile_names

INSTALL = "apt-get update -qq && apt-get install -y -qq systemd (or scripts/install-test-deps.sh)"
needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason=f"systemd-analyze not installed: {INSTALL}"
)


def _variants() -> list[tuple[str, Profile]]:
    out = [(name, load_profile(f"builtin:{name}")) for name in builtin_profile_names()]
    ref = load_profile("builtin:reference-h100-h200").model_dump(mode="json", exclude_unset=True)
    root = {**ref, "sglang": {**ref["sglang"], "lifecycle": {"user": "root", "restart_limit_burst": 5}}}
    wide = {**ref, "models": {**ref["models"], "target": {**ref["models"]["target"], "tp": 16}},
            "sglang": {**ref["sglang"], "decode": {"tp": 8},
                       "extra_args": {"decode": ["--kv-events-config", '{"publisher":"zmq","topic":"a b%c"}']}}}  # fmt: skip
    out += [("reference, user root", validate_profile_data(root)), ("reference, tp16 over 2 nodes", validate_profile_data(wide))]
    return out


def _with_venv(profile: Profile, venv: Path) -> Profile:
    """The same profile with its venv under `venv`, holding an executable `<version>/bin/python`:
    `systemd-analyze verify` checks that ExecStart's binary exists on this machine."""
    python = venv / profile.sglang.version / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    data = profile.model_dump(mode="json", exclude_unset=True)
    data["sglang"] = {**data.get("sglang", {}), "venv": str(venv)}
    return validate_profile_data(data)


@needs_analyze
@pytest.mark.parametrize(("label", "profile"), _variants(), ids=lambda v: v if isinstance(v, str) else "")
def test_systemd_analyze_verify_accepts_every_rendered_unit(label: str, profile: Profile, tmp_path: Path) -> None:
    p = _with_venv(profile, tmp_path / "venvs")
    units = tmp_path / "units"
    units.mkdir()
    for inst in instances(p):
        (units / unit_name(inst)).write_text(render_unit(p, inst))
    files = sorted(str(f) for f in units.iterdir())
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", *files], capture_output=True, text=True,
                          timeout=60, check=False, cwd=units)  # fmt: skip
    # systemd only warns ("..., ignoring") about a key it cannot parse: any output is a finding
    assert (done.returncode, done.stdout + done.stderr) == (0, ""), label


def test_units_have_a_start_limit_control_group_kill_mode_and_a_dedicated_user() -> None:
    p = load_profile("builtin:reference-h100-h200")
    unit = render_unit(p, instances(p)[0]).splitlines()
    unit_section = unit[: unit.index("[Service]")]
    # 3 tries, each up to the start timeout (1800 s) plus RestartSec (15 s)
    assert {"StartLimitIntervalSec=5446", "StartLimitBurst=3"} <= set(unit_section)
    for line in ("User=inferctl-sglang", "Group=inferctl-sglang", "KillMode=control-group", "TimeoutStopSec=120",
                 "Restart=on-failure", "RestartSec=15"):  # fmt: skip
        assert line in unit, line
    assert "KillMode=mixed" not in unit
    data = p.model_dump(mode="json", exclude_unset=True)
    data["sglang"]["lifecycle"] = {"user": "root"}
    root = validate_profile_data(data)
    assert not [ln for ln in render_unit(root, instances(root)[0]).splitlines() if ln.startswith(("User=", "Group="))]


@pytest.mark.parametrize(("sglang", "field"), [
    ({"venv": "venvs"}, "sglang.venv: must be an absolute path on the nodes, got 'venvs'"),
    ({"log_dir": "logs/{node}"}, "sglang.log_dir: must be an absolute path on the nodes"),
    ({"lifecycle": {"config_dir": "~/etc"}}, "sglang.lifecycle.config_dir: must be an absolute path"),
    ({"lifecycle": {"config_dir": "/etc/infer ctl"}}, "sglang.lifecycle.config_dir: '/etc/infer ctl' contains ' '"),
    ({"log_dir": "/var/log/%n"}, "sglang.log_dir: '/var/log/%n' contains '%'"),
    ({"lifecycle": {"user": "Bad User"}}, "sglang.lifecycle.user"),
])  # fmt: skip
def test_paths_systemd_would_reject_are_exit_64_at_profile_load(
    sglang: dict[str, Any], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "name": "paths", "models": {"target": {"path": "/m"}}, "sglang": sglang,
        "nodes": [{"name": "pf-01", "host": "10.9.9.1", "roles": ["prefill"]},
                  {"name": "dc-01", "host": "10.9.9.2", "roles": ["decode"]}]}))  # fmt: skip
    assert main(["profile", "validate", "-p", str(path)]) == 64
    assert main(["launch", "-p", str(path), "--dry-run"]) == 64
    assert field in capsys.readouterr().err


STANDIN_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls.log"
case "$1" in
  is-active) echo failed; exit 3 ;;
  show) echo "Result=start-limit-hit"; echo "NRestarts=3" ;;
esac
exit 0
"""


@pytest.fixture
def start_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Profile, Path]:
    """Local nodes whose systemd (a stand-in systemctl first on PATH) gave up on the units."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(STANDIN_SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    profile = validate_profile_data({
        "name": "limits",
        "nodes": [{"name": "pf-01", "host": "127.0.0.1", "connection": "local", "roles": ["prefill"], "gpus": 0},
                  {"name": "dc-01", "host": "127.0.0.2", "connection": "local", "roles": ["decode"], "gpus": 0}],
        "models": {"target": {"path": "/m"}},
        "sglang": {"transfer_backend": "mooncake_tcp",
                   "lifecycle": {"supervisor": "systemd", "config_dir": str(tmp_path / "{node}")}},
    })  # fmt: skip
    for inst in instances(profile):
        Path(inst.config_dir).mkdir(parents=True, exist_ok=True)
        Path(inst.config_dir, f"sglang-{inst.role}.env").write_text("PYTHONUNBUFFERED=1\n")
    return profile, bin_dir / "calls.log"


def test_status_and_check_servers_report_a_unit_that_hit_its_start_limit(start_limited: Any) -> None:
    from infer_ctl.checks.servers import check_servers
    from infer_ctl.launch.commands import status
    from infer_ctl.remote.fleet import Fleet

    profile, _ = start_limited
    report = status(profile, None, None)
    limits = [f for f in report.findings if f.check == "status.start_limit"]
    assert [(f.subject, f.status.value) for f in limits] == [("pf-01-prefill", "fail"), ("dc-01-decode", "fail")]
    assert "systemd stopped restarting inferctl-sglang-prefill.service after 3 automatic restart(s)" in limits[0].message
    assert report.results is not None and report.results[0]["systemd_result"] == "start-limit-hit"
    with Fleet(profile) as fleet:
        found = check_servers(profile, fleet, list(profile.nodes))
    assert {f.subject for f in found if f.check == "servers.start_limit" and f.status.value == "fail"} == {
        "pf-01-prefill", "dc-01-decode"}  # fmt: skip


def test_launch_clears_the_start_limit_before_restarting(start_limited: Any) -> None:
    profile, calls = start_limited
    inst = instances(profile)[0]
    supervisor.start(LocalConnector("pf-01"), inst, "systemd", sudo=False, unit_changed=False)
    log = calls.read_text().splitlines()
    unit = unit_name(inst)
    assert log.index(f"reset-failed -- {unit}") < log.index(f"restart -- {unit}")


@needs_analyze
def test_the_router_unit_verifies_and_raises_the_descriptor_limit(tmp_path: Path) -> None:
    """templates/inferctl-router.service.j2: LimitNOFILE= set, systemd's parser accepts it."""
    import jinja2

    from infer_ctl.resources import templates_dir

    inferctl = tmp_path / "bin" / "inferctl"
    inferctl.parent.mkdir()
    inferctl.write_text("#!/bin/sh\nexit 0\n")
    inferctl.chmod(0o755)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    for user in ("inferctl", "root"):
        text = env.get_template("inferctl-router.service.j2").render(
            profile_name="prod", user=user, limit_nofile=1048576,
            exec_start=f"{inferctl} router serve -p /etc/inferctl/prod.yaml")
        assert "\nLimitNOFILE=1048576\n" in text
        unit = tmp_path / "inferctl-router.service"
        unit.write_text(text)
        done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                              timeout=60, check=False, cwd=tmp_path)
        assert (done.returncode, done.stdout + done.stderr) == (0, ""), user


def test_every_sglang_unit_sets_a_descriptor_limit() -> None:
    from infer_ctl.resources import templates_dir

    assert "LimitNOFILE={{ limit_nofile }}" in (templates_dir() / "sglang-server.service.j2").read_text()
    for role in ("prefill", "decode", "collocated"):
        assert '{% extends "sglang-server.service.j2" %}' in (templates_dir() / f"sglang-{role}.service.j2").read_text()
