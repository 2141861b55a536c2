"""`inferctl router serve|status|workers|prefixes` against a live router (real sockets)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from infer_ctl.cli.main import main
from infer_ctl.exitcodes import ExitCode
from infer_ctl.router.config import router_settings
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.ports import free_port
from tests.router.conftest import TIME_SCALE


@pytest.fixture(scope="module")
def mixed() -> Iterator[ThreadedSimCluster]:
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=TIME_SCALE) for _ in range(2)])
    yield cluster
    cluster.stop()


@pytest.fixture
def live(mixed: ThreadedSimCluster) -> Iterator[RouterHandle]:
    with start_router_in_thread(router_config(workers=mixed.urls[:1], warm_via="pair")) as handle:
        yield handle


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, (json.loads(out) if out.strip().startswith("{") else {"text": out})


def test_status_workers_and_prefixes_verbs(live: RouterHandle, mixed: ThreadedSimCluster, capsys) -> None:
    code, doc = run(capsys, "router", "status", "--url", live.url, "--json")
    assert code == 0 and doc["router"]["mode"] == "collocated" and doc["router"]["workers"]["total"] == 1
    code, doc = run(capsys, "router", "workers", "add", mixed.urls[1], "--role", "mixed", "--url", live.url, "--json")
    assert code == 0 and doc["added"]["url"] == mixed.urls[1]
    code, doc = run(capsys, "router", "workers", "--url", live.url, "--json")
    assert {w["url"] for w in doc["workers"]} == set(mixed.urls)
    code, doc = run(capsys, "router", "prefixes", "add", "faq", "--text", "Frequently asked: " * 20,
                    "--replicas", "2", "--ttl", "600", "--url", live.url, "--json")
    assert code == 0 and doc["prefix"]["version"] == 1
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        code, doc = run(capsys, "router", "prefixes", "--url", live.url, "--json")
        if sum(r["warm"] for r in doc["prefixes"][0]["replicas"]) == 2:
            break
        time.sleep(0.1)
    assert sum(r["warm"] for r in doc["prefixes"][0]["replicas"]) == 2
    assert run(capsys, "router", "prefixes", "warm", "faq", "--url", live.url, "--json")[0] == 0
    # a new version given only new text keeps K, the pin and the TTL of the one it supersedes ...
    code, doc = run(capsys, "router", "prefixes", "add", "faq", "--text", "Frequently asked v2: " * 20, "--pin",
                    "--url", live.url, "--json")
    p = doc["prefix"]
    assert code == 0 and (p["version"], p["replicas_wanted"], p["ttl_s"], p["pin"]) == (2, 2, 600, True)
    # ... options given override it, and --ttl 0 removes the TTL
    code, doc = run(capsys, "router", "prefixes", "add", "faq", "--text", "Frequently asked v3: " * 20,
                    "--replicas", "1", "--ttl", "0", "--no-pin", "--url", live.url, "--json")
    p = doc["prefix"]
    assert code == 0 and (p["version"], p["replicas_wanted"], p["ttl_s"], p["pin"]) == (3, 1, None, False)
    code, doc = run(capsys, "router", "prefixes", "expire", "faq", "--url", live.url, "--json")
    assert code == 0 and doc["prefix"]["state"] == "expired"
    code, doc = run(capsys, "router", "workers", "remove", mixed.urls[1], "--url", live.url, "--json")
    assert code == 0
    code, _ = run(capsys, "router", "prefixes", "--url", live.url)  # human table renders
    assert code == 0


def test_error_paths_have_exit_codes_and_remedies(live: RouterHandle, capsys) -> None:
    assert main(["router", "status", "--url", "http://127.0.0.1:9", "--json"]) == 3
    assert "not reachable" in capsys.readouterr().err
    assert main(["router", "workers", "add", "http://x:1", "--url", live.url]) == 64
    assert "--role" in capsys.readouterr().err
    assert main(["router", "prefixes", "expire", "nope", "--url", live.url]) == 2
    assert "404" in capsys.readouterr().err
    assert main(["router", "prefixes", "add", "p", "--url", live.url]) == 64


def test_status_reports_401_without_the_token(mixed: ThreadedSimCluster, capsys, monkeypatch) -> None:
    with start_router_in_thread(router_config(workers=mixed.urls[:1], admin_token="tok")) as handle:
        monkeypatch.delenv("INFERCTL_ROUTER_TOKEN", raising=False)
        assert main(["router", "status", "--url", handle.url]) == 2
        assert "INFERCTL_ROUTER_TOKEN" in capsys.readouterr().err
        monkeypatch.setenv("INFERCTL_ROUTER_TOKEN", "tok")
        assert main(["router", "status", "--url", handle.url, "--json"]) == 0


def test_serve_runs_until_sigterm_then_drains(mixed: ThreadedSimCluster) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-m", "infer_ctl", "router", "serve", "--listen", f"127.0.0.1:{port}",
                             "--mixed", mixed.urls[0]], stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 20
        ok = False
        while time.monotonic() < deadline and not ok:
            try:
                ok = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.1)
        assert ok
        r = httpx.post(f"http://127.0.0.1:{port}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        logs = proc.stderr.read().decode() if proc.stderr else ""
        assert '"msg": "router listening"' in logs and '"msg": "router stopped"' in logs
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "127.evil.example:0", "10.0.0.1:0"])
def test_serve_refuses_non_loopback_without_token(listen: str, monkeypatch, capsys) -> None:
    # a name that merely starts with "127." can resolve anywhere: only literal loopback counts
    monkeypatch.delenv("INFERCTL_ROUTER_TOKEN", raising=False)
    assert main(["router", "serve", "--listen", listen, "--mixed", "http://127.0.0.1:9"]) == 64
    assert "without a token" in capsys.readouterr().err


@pytest.mark.parametrize(("header", "ok"), [
    ("Bearer tok", True), ("bearer tok", True), ("BEARER  tok ", True), ("Bearer tok2", False),
    ("Basic tok", False), ("tok", False), ("", False),
])
def test_admin_token_check(header: str, ok: bool) -> None:
    from infer_ctl.router.control.admin import authorized

    assert authorized("tok", header) is ok
    assert authorized(None, header) is True


def test_lowercase_bearer_scheme_is_accepted_over_http(mixed: ThreadedSimCluster) -> None:
    with start_router_in_thread(router_config(workers=mixed.urls[:1], admin_token="tok")) as handle:
        assert httpx.get(handle.url + "/admin/status", headers={"Authorization": "bearer tok"}).status_code == 200
        r = httpx.get(handle.url + "/admin/status", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(("method", "path"), [("GET", "/admin/status"), ("POST", "/flush_cache"),
                                              ("POST", "/v1/completions"), ("GET", "/health")])
def test_two_authorization_headers_are_a_400_on_every_path(mixed: ThreadedSimCluster, method: str, path: str) -> None:
    """h1 kept the last copy: `wrong` then `tok` passed the admin check, and what the relay forwarded
    depended on which copy it read."""
    with start_router_in_thread(router_config(workers=mixed.urls[:1], admin_token="tok")) as handle:
        two = [("Authorization", "Bearer wrong"), ("Authorization", "Bearer tok")]
        r = httpx.request(method, handle.url + path, headers=two, json={"prompt": "hi", "max_tokens": 1})
        assert r.status_code == 400, r.text
        assert r.json()["error"] == {"message": "more than one Authorization header; send it once",
                                     "type": "invalid_request_error", "code": 400}
        assert httpx.get(handle.url + "/admin/status", headers={"Authorization": "Bearer tok"}).status_code == 200


@pytest.mark.parametrize(("path", "body"), [
    ("/admin/prefixes", {"name": "x", "text": "t", "replicas": True}),
    ("/admin/prefixes", {"name": "x", "text": "t", "replicas": 65}),
    ("/admin/prefixes", {"name": "x", "text": "t", "ttl_s": True}),
    ("/admin/prefixes", {"name": "x", "text": "t", "ttl_s": "5"}),
    ("/admin/prefixes", {"name": "x", "text": "t", "pin": "yes"}),
    ("/admin/prefixes", {"name": "a/b", "text": "t"}),  # names travel in URL paths
    ("/admin/prefixes", {"name": "has space", "text": "t"}),
    ("/admin/workers", {"url": "http://127.0.0.1:5", "role": "prefill", "bootstrap_port": "abc"}),
    ("/admin/workers", {"url": "http://127.0.0.1:5", "role": "prefill", "bootstrap_port": 70000}),
    ("/admin/workers", {"url": "http://127.0.0.1:5", "role": "decode", "bootstrap_port": 8998}),
])
def test_admin_rejects_malformed_fields(live: RouterHandle, path: str, body: dict) -> None:
    r = httpx.post(live.url + path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_human_tables_never_truncate_worker_urls_or_prefix_names(live: RouterHandle, mixed: ThreadedSimCluster,
                                                                 capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    name = "a-rather-long-prefix-name-v12"
    assert main(["router", "prefixes", "add", name, "--text", "Long named prompt. " * 10, "--url", live.url]) == 0
    capsys.readouterr()
    assert main(["router", "workers", "--url", live.url]) == 0
    assert mixed.urls[0] in capsys.readouterr().out
    assert main(["router", "prefixes", "--url", live.url]) == 0
    assert name in capsys.readouterr().out


def test_prefix_file_that_is_not_utf8_is_a_usage_error(tmp_path, capsys) -> None:
    bad = tmp_path / "prompt.txt"
    bad.write_bytes(b"\xff\xfe not utf-8")
    assert main(["router", "prefixes", "add", "x", "--file", str(bad), "--url", "http://127.0.0.1:9"]) == 64
    assert "not UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize("listen", ["127.0.0.1", "127.0.0.1:99999", "127.0.0.1:http"])
def test_bad_listen_address_is_a_usage_error(listen: str, capsys) -> None:
    assert main(["router", "serve", "--listen", listen, "--mixed", "http://127.0.0.1:9"]) == 64
    assert "HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize("ttl", ["nan", "inf", "-1", "soon"])
def test_prefixes_add_ttl_is_a_finite_number(ttl: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--ttl took nan and inf as floats: "internal error: ValueError: Out of range float values are not
    JSON compliant" as the request was encoded. A usage error now (the URL has nothing listening)."""
    code = main(["router", "prefixes", "add", "sys", "--text", "t", "--ttl", ttl, "--url", f"http://127.0.0.1:{free_port()}"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and "--ttl" in err and "must be a number of seconds, 0 or more" in err, err


def test_serve_flags_for_the_load_guard_and_the_board_reach_the_config(monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`--balance-abs N` sets the load guard and `--no-share-flights` turns the flight board off (what
    the benchmarks' A/B runs pass); a negative guard is a usage error naming the flag."""
    from infer_ctl.router.daemon import procs

    seen: list[object] = []
    monkeypatch.setattr(procs, "serve", lambda cfg, n, level: seen.append(cfg) or 0)
    assert main(["router", "serve", "--mixed", "http://127.0.0.1:9", "--balance-abs", "64", "--no-share-flights"]) == 0
    cfg = seen[-1]
    assert cfg.settings.balance_abs == 64 and cfg.settings.coalesce.processes is False  # type: ignore[attr-defined]
    assert main(["router", "serve", "--mixed", "http://127.0.0.1:9"]) == 0
    assert seen[-1].settings.balance_abs == 8 and seen[-1].settings.coalesce.processes is True  # type: ignore[attr-defined]
    assert main(["router", "serve", "--mixed", "http://127.0.0.1:9", "--balance-abs", "-1"]) == 64
    assert "--balance-abs" in capsys.readouterr().err


def _nested(field: str, value: object) -> dict[str, object]:
    """router_settings' keywords for a dotted field: "coalesce.max_wait_s" -> coalesce={"max_wait_s": v}."""
    group, _, key = field.rpartition(".")
    return {group: {key: value}} if group else {field: value}


@pytest.mark.parametrize(("field", "value"), [("balance_abs", -1), ("balance_abs", 2.5), ("balance_abs", float("nan")),
                                              ("balance_rel", float("nan")), ("balance_rel", 0.5)])
def test_the_load_guard_set_in_code_is_checked_as_the_profile_checks_it(field: str, value: object) -> None:
    """Settings given in code (router_config, embedding) go through the profile's model (router_settings):
    the same bounds, a usage error naming the profile key."""
    from infer_ctl.errors import UsageError

    with pytest.raises(UsageError, match=rf"router\.{field}: "):
        router_settings(**{field: value})


@pytest.mark.parametrize(("field", "value"), [
    ("health_interval_s", float("nan")), ("health_interval_s", 0.0), ("request_timeout_s", float("inf")),
    ("request_timeout_s", "600"), ("max_retries", -1), ("max_retries", 1.5), ("cache_threshold", 1.5),
    ("health_failures", 0), ("cb_open_s", None), ("max_concurrent", True), ("queue_timeout_s", -1.0),
    ("kv_events.max_blocks", 0)])
def test_every_number_set_in_code_is_bounded(field: str, value: object) -> None:
    """Beyond the load guard: every number of the settings that the request path or a timer uses. A NaN
    timeout never fires, a NaN or zero interval spins, a string fails deep in a request as a 500."""
    from infer_ctl.errors import UsageError
    from infer_ctl.router.config import RouterConfig, worker

    RouterConfig(workers=[worker("http://127.0.0.1:9", "mixed")]).validate()  # every default is inside its bounds
    with pytest.raises(UsageError, match=rf"router\.{re.escape(field)}: .*got {re.escape(repr(value))}"):
        router_settings(**_nested(field, value))


@pytest.mark.parametrize(("field", "value", "bound"), [
    ("coalesce.max_wait_s", float("inf"), "finite"), ("coalesce.max_wait_s", 61.0, "less than or equal to 60"),
    ("pair_health.min_kv_speed_gb_s", float("nan"), "finite"), ("pair_health.max_kv_latency_ms", "5", "valid number"),
    pytest.param("health_interval_s", 10 ** 400, "valid number", id="health_interval_s-10**400")])
def test_the_numbers_the_bounds_missed_are_bounded_too(field: str, value: object, bound: str) -> None:
    """Those the first bounds left out: an infinite coalescing wait (the profile caps it at 60 s), a NaN
    or string pair-health floor (None: unset, allowed); and seconds given as an int too large for a float
    are refused as out of bounds, not by OverflowError."""
    from infer_ctl.errors import UsageError
    from infer_ctl.router.config import RouterConfig, worker

    fine = RouterConfig(workers=[worker("http://127.0.0.1:9", "mixed")], port=0,
                        settings=router_settings(coalesce={"max_wait_s": 60.0},
                                                 pair_health={"min_kv_speed_gb_s": 0.5, "max_kv_latency_ms": None}))
    fine.validate()
    with pytest.raises(UsageError, match=rf"router\.{re.escape(field)}: .*{bound}.*got"):
        router_settings(**_nested(field, value))


@pytest.mark.parametrize("value", [70000, -1, "8000"])
def test_a_port_no_socket_takes_is_refused(value: object) -> None:
    """The listen port is the run-time object's (not a setting): validate() bounds it."""
    from infer_ctl.errors import UsageError
    from infer_ctl.router.config import RouterConfig, worker

    cfg = RouterConfig(workers=[worker("http://127.0.0.1:9", "mixed")], port=value)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"router\.port must be a whole number, 0 to 65535, got"):
        cfg.validate()


def test_more_prefix_replicas_than_workers_is_refused_at_add_time(live: RouterHandle, mixed: ThreadedSimCluster,
                                                                  capsys) -> None:
    """Issue 29, item 9a: --replicas 5 on one worker said OK and showed "warm 1/5" forever."""
    code = main(["router", "prefixes", "add", "sys", "--text", "Policy. " * 20, "--replicas", "5", "--url", live.url])
    err = capsys.readouterr().err
    assert code != 0
    assert "replicas 5 exceeds the 1 worker this router has" in err and "give replicas 1..1" in err
    r = httpx.post(live.url + "/admin/prefixes", json={"name": "sys", "text": "t", "replicas": 2})
    assert r.status_code == 409 and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(live.url + "/admin/prefixes").json()["prefixes"] == []  # nothing registered
    # as many as there are workers is fine, and a new version that inherits K is not re-judged
    assert main(["router", "prefixes", "add", "sys", "--text", "Policy. " * 20, "--replicas", "1",
                 "--url", live.url]) == 0
    assert main(["router", "workers", "add", mixed.urls[1], "--role", "mixed", "--url", live.url]) == 0
    assert main(["router", "prefixes", "add", "sys", "--text", "Policy v2. " * 20, "--replicas", "2",
                 "--url", live.url]) == 0
