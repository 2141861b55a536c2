"""The router's KV-events settings: profile keys (router.kv_events), `router serve --kv-*` flags, and
decode workers that keep a radix cache (SGLang's --disaggregation-decode-enable-radix-cache), which are
subscribed and shown in `router workers`; decodes without one are not."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.cli.main import main
from infer_ctl.errors import ProfileError, UsageError
from infer_ctl.profile import parse_profile_text
from infer_ctl.router.config import RouterConfig, from_profile
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.router.conftest import TIME_SCALE
from tests.router.kv_publisher import CLEARED, TestPublisher, stored
from tests.router.standin_http import StandinServer

BASE = """\
name: t
nodes:
  - {name: pf-01, host: 10.0.0.1, roles: [prefill]}
  - {name: dc-01, host: 10.0.0.2, roles: [decode]}
models: {target: {path: /models/on-the-nodes}}
"""


def _profile(tmp_path: Path, router: str) -> Any:
    prof = parse_profile_text(BASE + router, str(tmp_path / "p.yaml"))
    prof._base_dir = tmp_path  # as load_profile sets it: relative paths resolve against the profile's directory
    return prof


# ---- profile keys --------------------------------------------------------------------------------
def test_profile_keys_land_on_the_router_config(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    prof = _profile(tmp_path, "router:\n  kv_events: {tokenizer_path: tok, max_blocks: 5000, replay_timeout_s: 0.5,"
                              " max_batches_per_s: 70, max_message_bytes: 1048576}\n")
    cfg = from_profile(prof, env={})
    assert (cfg.settings.kv_events.enabled, cfg.settings.kv_events.max_blocks, cfg.settings.kv_events.replay_timeout_s, cfg.settings.kv_events.max_batches_per_s) == (True, 5000, 0.5, 70)
    assert cfg.settings.kv_events.max_message_bytes == 1 << 20
    assert cfg.tokenizer_path == str(tmp_path / "tok")
    off = from_profile(_profile(tmp_path, "router: {kv_events: {enabled: false}}\n"), env={})
    assert off.settings.kv_events.enabled is False and off.tokenizer_path == "/models/on-the-nodes"  # the default stays soft


def test_defaults_are_router_configs() -> None:
    prof = parse_profile_text(BASE)
    cfg, plain = from_profile(prof, env={}), RouterConfig()
    assert (cfg.settings.kv_events.enabled, cfg.settings.kv_events.max_blocks, cfg.settings.kv_events.replay_timeout_s, cfg.settings.kv_events.max_batches_per_s) == (
        plain.settings.kv_events.enabled, plain.settings.kv_events.max_blocks,
        plain.settings.kv_events.replay_timeout_s, plain.settings.kv_events.max_batches_per_s)
    assert cfg.settings.kv_events.max_message_bytes == plain.settings.kv_events.max_message_bytes == 8 << 20


@pytest.mark.parametrize(("router", "expected"), [
    ("router: {kv_events: {replay_timeout_s: 0}}\n", "router.kv_events.replay_timeout_s: Input should be greater than 0"),
    # NaN was "Input should be less than or equal to 300" (it fails every comparison)
    ("router: {kv_events: {replay_timeout_s: .nan}}\n", "router.kv_events.replay_timeout_s: Input should be a finite number"),
    ("router: {kv_events: {replay_timeout_s: .inf}}\n", "router.kv_events.replay_timeout_s: Input should be a finite number"),
    ("router: {kv_events: {max_blocks: 10}}\n", "router.kv_events.max_blocks: Input should be greater than or equal to 1024"),
    ("router: {kv_events: {max_batches_per_s: 0}}\n", "router.kv_events.max_batches_per_s: Input should be greater"),
    ("router: {kv_events: {tokenizer: /m}}\n", "router.kv_events.tokenizer: unknown key 'tokenizer' (did you mean 'tokenizer_path'?)"),
    ("router: {kv_events: {enabled: maybe}}\n", "router.kv_events.enabled: Input should be a valid boolean"),
])
def test_bad_keys_name_the_field(router: str, expected: str) -> None:
    with pytest.raises(ProfileError) as info:
        parse_profile_text(BASE + router, "p.yaml")
    assert any(line.startswith(expected) for line in info.value.errors), info.value.errors


def test_a_named_tokenizer_that_is_not_there_is_a_usage_error(tmp_path: Path) -> None:
    prof = _profile(tmp_path, "router: {kv_events: {tokenizer_path: missing}}\n")
    with pytest.raises(UsageError) as info:
        from_profile(prof, env={})
    assert "router.kv_events.tokenizer_path 'missing'" in info.value.message
    assert str(tmp_path / "missing" / "tokenizer.json") in info.value.message


# ---- router serve flags --------------------------------------------------------------------------
@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[RouterConfig]:
    """The config `router serve` would run (serve_forever replaced: the flags are what is tested)."""
    import infer_ctl.router.daemon.run as run

    got: list[RouterConfig] = []

    def fake(cfg: RouterConfig, log_level: str) -> int:
        got.append(cfg)
        return 0

    monkeypatch.setattr(run, "serve_forever", fake)
    return got


def test_serve_flags_set_the_kv_settings(tmp_path: Path, served: list[RouterConfig]) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    argv = ["router", "serve", "--mixed", "http://127.0.0.1:9", "--no-kv-events", "--kv-tokenizer", str(tmp_path),
            "--kv-replay-timeout", "0.25", "--kv-max-blocks", "2048", "--kv-max-batches-per-s", "9"]
    assert main(argv) == 0
    cfg = served[0]
    assert (cfg.settings.kv_events.enabled, cfg.tokenizer_path, cfg.settings.kv_events.replay_timeout_s, cfg.settings.kv_events.max_blocks, cfg.settings.kv_events.max_batches_per_s) == (
        False, str(tmp_path), 0.25, 2048, 9)
    assert main(["router", "serve", "--mixed", "http://127.0.0.1:9"]) == 0
    assert served[1].settings.kv_events.enabled is True
    assert served[1].settings.kv_events.max_blocks == RouterConfig().settings.kv_events.max_blocks


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--kv-tokenizer", "/nonexistent-model"], "--kv-tokenizer '/nonexistent-model': no /nonexistent-model/tokenizer.json"),
    # checked by the profile's model (router.kv_events.replay_timeout_s: finite, above 0, at most 300); NaN
    # once read "Input should be less than or equal to 300": it is refused as not finite, by the field's name
    *[(["--kv-replay-timeout", v], "router.kv_events.replay_timeout_s: Input should be")
      for v in ("nan", "inf", "-inf", "-1", "0", "301")],
    (["--kv-replay-timeout", "soon"], "Invalid value for '--kv-replay-timeout'"),
    (["--kv-max-blocks", "5"], "router.kv_events.max_blocks: Input should be greater than or equal to 1024"),
])
def test_bad_serve_flags_are_usage_errors(flags: list[str], fragment: str, served: list[RouterConfig],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["router", "serve", "--mixed", "http://127.0.0.1:9", *flags]) == 64
    err = capsys.readouterr().err
    assert fragment in err and flags[0] in err, err  # the bound broken, and the flag that broke it
    assert not served


# ---- decodes with a radix cache ------------------------------------------------------------------
class _StandinDecode:
    """An HTTP stand-in for an SGLang 0.5.23 decode's /health and /server_info (the simulator's decode
    has no radix cache): `radix` says whether it runs --disaggregation-decode-enable-radix-cache."""

    def __init__(self, pub: TestPublisher, radix: bool) -> None:
        info = {"disaggregation_mode": "decode", "disaggregation_decode_enable_radix_cache": radix,
                "disable_radix_cache": not radix, "page_size": 1, "startup_time": 1.0, "version": "0.5.23",
                "kv_events": {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": pub.port, "topic": "",
                              "block_size": 1, "dp_size": 1, "replay_endpoint_port_base": pub.replay_port}}
        body = json.dumps(info).encode()
        answers = {"/server_info": (200, body), "/health": (200, b"")}
        self.server = StandinServer(lambda path: answers.get(path, (404, b"")))
        self.url = self.server.url

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def decodes() -> Iterator[tuple[TestPublisher, _StandinDecode, TestPublisher, _StandinDecode]]:
    pub, plain_pub = TestPublisher(), TestPublisher()
    radix, plain = _StandinDecode(pub, True), _StandinDecode(plain_pub, False)
    yield pub, radix, plain_pub, plain
    for x in (radix, plain, pub, plain_pub):
        x.close()


def test_a_decode_with_a_radix_cache_is_subscribed_and_shown(decodes: Any, capsys: pytest.CaptureFixture[str]) -> None:
    pub, radix, _, plain = decodes
    pub.batch([CLEARED])
    pub.batch([stored([11, 12, 13], None, [5, 6, 7])])  # before the router subscribed: learned by replay
    cluster = start_cluster_in_thread([WorkerSpec("prefill", time_scale=TIME_SCALE)])
    try:
        pre = cluster.workers[0]
        cfg = router_config(prefill=[(pre.url, pre.bootstrap_port)], decode=[radix.url, plain.url], health_interval_s=0.2)
        with start_router_in_thread(cfg) as router:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                assert main(["router", "workers", "--url", router.url, "--json"]) == 0
                doc = json.loads(capsys.readouterr().out)
                rows = {w["url"]: w for w in doc["workers"]}
                if rows[radix.url].get("index") == "exact" and rows[radix.url].get("kv_blocks") == 3:
                    break
                time.sleep(0.1)
            assert rows[radix.url]["index"] == "exact" and rows[radix.url]["kv_blocks"] == 3, rows[radix.url]
            assert "index" not in rows[plain.url]  # advertises kv_events, but stores nothing: not subscribed
            assert "--disaggregation-decode-enable-radix-cache is off" in rows[plain.url]["index_reason"]
            assert plain.url not in router.router.kv.workers
            assert main(["router", "workers", "--url", router.url]) == 0
            out = capsys.readouterr().out
            assert f"{radix.url}: decode index exact (in sync), 3 blocks\n" in out
    finally:
        cluster.stop()


_FLOATS = ["prefix_ttl_s", "health_interval_s", "health_holddown_max_s", "request_timeout_s", "cache_threshold",
           "balance_rel", "rewarm_idle_s", "drain_timeout_s", "cb_open_s", "tiers.prefill_tokens_per_s", "tiers.host_gb_s",
           "tiers.storage_gb_s", "coalesce.max_wait_s", "pair_health.min_kv_speed_gb_s",
           "pair_health.max_kv_latency_ms", "pair_health.probe_after_s", "tracing.sample_ratio",
           "pricing.prefill.node_hour_usd", "pricing.decode.gpu_hour_usd"]


@pytest.mark.parametrize("value", [".nan", ".inf"])
@pytest.mark.parametrize("key", _FLOATS)
def test_every_router_float_is_finite(key: str, value: str) -> None:
    """As replay_timeout_s (2a3eeee): NaN read as a bound it does not break ("Input should be greater
    than 0"), inf passed every one-sided bound."""
    *outer, leaf = key.split(".")
    doc = f"{{{leaf}: {value}}}"
    for name in reversed(outer):
        doc = f"{{{name}: {doc}}}"
    with pytest.raises(ProfileError) as info:
        parse_profile_text(BASE + f"router: {doc}\n", "p.yaml")
    assert any(line.startswith(f"router.{key}: Input should be a finite number") for line in info.value.errors), \
        info.value.errors


def test_a_prefix_ttl_and_a_tenant_rate_are_finite() -> None:
    prefix = "router: {prefixes: [{name: sys, text: x, ttl_s: .inf}]}\n"
    tenant = "router: {tenants: [{name: a, key_env: A_KEY, requests_per_s: .nan}]}\n"
    for doc, key in ((prefix, "router.prefixes[0].ttl_s"), (tenant, "router.tenants[0].requests_per_s")):
        with pytest.raises(ProfileError) as info:
            parse_profile_text(BASE + doc, "p.yaml")
        assert any(line.startswith(f"{key}: Input should be a finite number") for line in info.value.errors), \
            info.value.errors
