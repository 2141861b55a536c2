"""`inferctl pd control` and `inferctl spec control` as loops (a systemd unit) while their router is
stopped and started again: the loop goes on, says the rounds that could not reach the router and says when
it answers again, keeps its state (a fatal server stays fatal), and exits 3 when stopped (some rounds'
facts were not gathered, nothing failed). Both exited 3 at the first round that found the router down, and
the controller stayed down after the router came back. A refused token stops the loop at once (exit 2):
retrying it helps nobody. The real commands in real processes against the real router, stopped and
started on the same port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.errors import InferctlError
from infer_ctl.launch.control_loop import LockedRounds, run_rounds
from infer_ctl.router.control.client import AdminClient, RouterRefused, RouterUnreachable
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from tests.launch.test_pd_control_cli import PROFILE as PD
from tests.launch.test_spec_control_lock import PROFILE as SPEC
from tests.ports import free_port
from tests.waiting import wait_for

_MAIN = "import sys; from infer_ctl.cli.main import main; sys.exit(main(sys.argv[1:]))"


class _Router:
    """The real router on one port, stopped and started again there (a restarted router)."""

    def __init__(self, **overrides: Any) -> None:
        self.port = free_port()
        self.overrides = overrides
        self.handle: RouterHandle | None = None

    def start(self) -> None:
        self.handle = start_router_in_thread(router_config(listen=f"127.0.0.1:{self.port}", **self.overrides))

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop(drain=False)
            self.handle = None


@pytest.fixture
def router() -> Iterator[_Router]:
    r = _Router()
    r.start()
    try:
        yield r
    finally:
        r.stop()


def _controller(tmp_path: Path, command: str, profile: dict[str, Any], port: int, *extra: str,
                env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], Path, Path]:
    path, state, err = tmp_path / "p.yaml", tmp_path / "s.json", tmp_path / "stderr"
    path.write_text(yaml.safe_dump({**profile, "router": {"listen": f"127.0.0.1:{port}"}}))
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
    proc = subprocess.Popen([sys.executable, "-c", _MAIN, command, "control", "-p", str(path), "--state", str(state),
                             "--interval", "0.2", *extra],
                            env=full_env, stdout=subprocess.PIPE, stderr=err.open("w"), text=True)
    return proc, state, err


def _wait_said(proc: subprocess.Popen[str], err: Path, text: str) -> None:
    def said() -> bool:
        assert proc.poll() is None, f"the controller ended (exit {proc.returncode}): {err.read_text()}"
        return text in err.read_text()
    wait_for(said, 60)


@pytest.mark.parametrize("command", ["pd", "spec"])
def test_the_loop_outlives_a_restarted_router(command: str, router: _Router, tmp_path: Path) -> None:
    profile = PD if command == "pd" else {**SPEC, "speculative": {**SPEC["speculative"], "control": "advise"}}
    state = tmp_path / "s.json"
    if command == "pd":  # a server whose rebuild failed: still not to be switched after the outage
        state.write_text(json.dumps({"state": {"fatal": ["http://10.0.0.21:30000"]}, "counters": None}))
    proc, state, err = _controller(tmp_path, command, profile, router.port)
    try:
        wait_for(lambda: state.exists() or proc.poll() is not None, 60)
        time.sleep(0.5)  # a few rounds that reach it
        router.stop()
        _wait_said(proc, err, "this round could not reach the router")
        time.sleep(1.0)  # several rounds at 0.2 s: one line, not one a round
        router.start()
        _wait_said(proc, err, "the router answers again")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    said = err.read_text()
    assert proc.returncode == 3, said  # rounds whose facts were not gathered, nothing failed
    assert said.count("this round could not reach the router") == 1 and "[Errno 111] Connection refused" in said
    assert "still unreachable" not in said  # no reminder before REMIND_S
    assert "rounds could not reach the router" in out and "back at" in out
    if command == "pd":
        assert json.loads(state.read_text())["state"]["fatal"] == ["http://10.0.0.21:30000"]


def test_the_json_document_says_the_rounds_that_could_not_reach_the_router(router: _Router, tmp_path: Path) -> None:
    proc, state, err = _controller(tmp_path, "pd", PD, router.port, "--json")
    try:
        wait_for(lambda: state.exists() or proc.poll() is not None, 60)
        router.stop()
        time.sleep(1.5)
        assert proc.poll() is None, err.read_text()
        router.start()
        time.sleep(1.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, err.read_text()
    doc = json.loads(out)
    assert doc["exit_code"] == 3 and doc["status"] == "unknown"
    assert doc["unreachable_rounds"] >= 2 and len(doc["unreachable"]) == 1
    spell = doc["unreachable"][0]
    assert spell["rounds"] == doc["unreachable_rounds"] and "not reachable" in spell["error"]
    assert spell["since"] <= spell["last"] <= spell["back"]
    # the router has no worker: its view is "stale", recorded once; the loop's memory of it outlived the
    # outage (a restarted process would have recorded it again)
    assert [r["action"] for r in doc["actions"]] == ["stale"]


def test_a_once_round_on_a_stopped_router_still_exits_3(router: _Router, tmp_path: Path) -> None:
    router.stop()
    proc, _, err = _controller(tmp_path, "pd", PD, router.port, "--once")
    proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert "not reachable" in err.read_text() and "could not reach the router" not in err.read_text()


@pytest.mark.parametrize("command", ["pd", "spec"])
def test_a_refused_token_stops_the_loop_at_once(command: str, tmp_path: Path) -> None:
    r = _Router(admin_token="the-right-one")
    r.start()
    try:
        profile = PD if command == "pd" else {**SPEC, "speculative": {**SPEC["speculative"], "control": "advise"}}
        proc, _, err = _controller(tmp_path, command, profile, r.port,
                                   env={"INFERCTL_ROUTER_TOKEN": "a-wrong-one"})
        try:
            proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    finally:
        r.stop()
    assert proc.returncode == 2
    assert "401 unauthorized" in err.read_text()


def _rounds(errors: list[Exception | None], remind_s: float = 60.0) -> tuple[LockedRounds, list[str]]:
    """`outliving` over rounds that raise `errors[i]` (None: the round reached the router)."""
    said: list[str] = []
    rounds = LockedRounds(None, said.append)
    rounds.REMIND_S = remind_s
    it = iter(errors)

    def tick() -> list[dict[str, Any]]:
        with rounds._round():
            err = next(it)
            if err is not None:
                raise err
            return []
    run_rounds(rounds.outliving(tick, 0.001), 0.001, rounds=len(errors))
    return rounds, said


def _down(why: str = "Connection refused") -> RouterUnreachable:
    return RouterUnreachable(f"router at http://r:1 is not reachable: {why}")


def test_an_outage_is_one_line_then_one_when_the_router_is_back() -> None:
    rounds, said = _rounds([None, _down(), _down(), _down(), None, None, _down(), None])
    assert rounds.rounds_run == 8 and rounds.rounds_unreachable == 4 and rounds.outages_seen == 2
    assert [o["rounds"] for o in rounds.outages] == [3, 1] and all(o["back"] for o in rounds.outages)
    assert len(said) == 4
    assert said[0] == ("this round could not reach the router: router at http://r:1 is not reachable: Connection "
                       "refused; the loop goes on (next round in 0.001 s), its state kept")
    assert said[1] == f"the router answers again (3 rounds could not reach it, since {rounds.outages[0]['since']})"
    assert said[2].startswith("this round could not reach the router")
    assert said[3] == f"the router answers again (1 round could not reach it, since {rounds.outages[1]['since']})"


def test_a_long_outage_is_reminded_not_said_every_round() -> None:
    rounds, said = _rounds([_down()] * 5, remind_s=0.0)
    assert len(said) == 5 and said[1].startswith("the router is still unreachable (2 rounds since ")
    assert rounds.outages[-1]["back"] is None
    _, said = _rounds([_down(), _down(), _down("timed out"), _down("timed out")])
    assert len(said) == 2 and "timed out" in said[1]  # a new error is said at once


def test_a_proxy_saying_the_router_is_away_is_an_outage_a_refusal_is_not() -> None:
    rounds, _ = _rounds([RouterRefused("router answered 503: upstream down", status=503), None])
    assert rounds.rounds_unreachable == 1
    for status in (401, 403, 404, 500):
        with pytest.raises(RouterRefused):
            _rounds([RouterRefused(f"router answered {status}", status=status)])
    with pytest.raises(InferctlError, match="cannot read"):
        _rounds([InferctlError("the controller state file s.json cannot read")])


@pytest.mark.parametrize("body", ['"Service Unavailable"', '["upstream down"]', "null", "3"])
def test_a_proxy_s_503_whose_json_is_not_an_object_is_an_outage(body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # it was an internal error (AttributeError on the body) that ended the loop, exit 2
    monkeypatch.setattr(httpx, "request", lambda *_a, **_k: httpx.Response(503, text=body))
    with pytest.raises(RouterRefused) as caught:
        AdminClient("http://r:1").call("GET", "/admin/workers")
    assert caught.value.status == 503 and caught.value.message == f"router answered 503: {body}"
    rounds, said = _rounds([caught.value, None])
    assert rounds.rounds_unreachable == 1 and len(said) == 2


def test_the_outages_kept_are_the_last_ones() -> None:
    rounds, _ = _rounds([_down(), None] * 4)
    rounds.OUTAGES_KEPT = 2
    rounds._unreachable("again", 1.0)
    assert rounds.outages_seen == 5 and len(rounds.outages) == 2 and rounds.outages[-1]["error"] == "again"


def test_a_router_back_with_another_token_stops_the_loop_exit_2(tmp_path: Path) -> None:
    # the outage is outlived; the 401 after it is not: retrying a refused token helps nobody
    r = _Router(admin_token="before")
    r.start()
    proc, state, err = _controller(tmp_path, "pd", PD, r.port, "--json", env={"INFERCTL_ROUTER_TOKEN": "before"})
    try:
        wait_for(lambda: state.exists() or proc.poll() is not None, 60)
        r.stop()
        time.sleep(1.5)  # rounds that could not reach it (--json says nothing on stderr while it runs)
        assert proc.poll() is None, err.read_text()
        r.overrides = {"admin_token": "after"}
        r.start()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        r.stop()
    assert proc.returncode == 2, err.read_text()
    assert "401 unauthorized" in err.read_text()
    assert json.loads(out)["exit_code"] == 2  # stdout is the one JSON document, nothing else


@pytest.mark.parametrize("body, ctype", [('"ok"', "application/json"), ("[]", "application/json"),
                                         ("null", "application/json"), ("3", "application/json"),
                                         ("<html>maintenance</html>", "text/html")])
def test_a_200_that_is_not_the_admin_api_s_json_is_not_the_router(body: str, ctype: str) -> None:
    # `[]` read as an empty fleet (a round "ok" with nothing observed); a string or a number was an internal
    # error: what answers 200 with another body is not the router's admin API (a proxy's page, another service)
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RouterUnreachable) as caught:
            AdminClient(f"http://127.0.0.1:{srv.server_port}").call("GET", "/admin/workers")
    finally:
        srv.shutdown()
        srv.server_close()
    assert "answered 200" in caught.value.message and "not the router's JSON" in caught.value.message
    assert "--url" in (caught.value.remedy or "")
    rounds, said = _rounds([caught.value, None])
    assert rounds.rounds_unreachable == 1 and len(said) == 2  # a loop outlives it, as an outage
