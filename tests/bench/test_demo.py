"""`inferctl demo` end to end: the local profile's cluster, a router in front, a bench, clean shutdown."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from infer_ctl.cli.main import main


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("inferctl-")}


def test_demo_through_the_inferctl_router(capsys: pytest.CaptureFixture[str]) -> None:
    before = _threads()
    rc = main(["demo", "--requests", "40", "-c", "8", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    assert doc["router"] == "inferctl router" and doc["profile"] == "local"
    assert [w["role"] for w in doc["workers"]] == ["prefill", "prefill", "decode", "decode"]
    assert doc["summary"]["completed"] == 40 and doc["summary"]["cache_hit_rate"] > 0.3
    assert _threads() == before, "the cluster and router threads are gone"


def test_demo_without_router_uses_a_direct_worker(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["demo", "--requests", "20", "--front", "none"])
    out = capsys.readouterr().out
    assert rc == 0 and "direct" in out and "TTFT" in out


def test_demo_unknown_router_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["demo", "--front", "nginx"])
    assert rc == 64 and "unknown router" in capsys.readouterr().err


def test_demo_with_the_router_port_taken_uses_a_free_one(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # port 8000 busy: the demo said "pick another --listen" (it has none) and exited 64, a usage code
    import socket

    from infer_ctl.resources import builtin_profile_path

    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        local = builtin_profile_path("local")
        assert local is not None
        prof = tmp_path / "busy.yaml"
        prof.write_text(local.read_text().replace("listen: 127.0.0.1:8000", f"listen: 127.0.0.1:{port}"))
        rc = main(["demo", "-p", str(prof), "--requests", "8", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    assert doc["router_url"] != f"http://127.0.0.1:{port}" and doc["summary"]["completed"] == 8


@pytest.mark.parametrize("args", [["--requests", "0"], ["--concurrency", "0"], ["--time-scale", "0"],
                                  ["--time-scale", "nan"]])
def test_demo_refuses_an_empty_run_before_starting_anything(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # --requests 0 started 4 workers and the router, then ended in "internal error: ValueError", exit 2
    assert main(["demo", *args]) == 64
    out, err = capsys.readouterr()
    assert err.startswith(f"inferctl: error: {args[0]} must be") and "started" not in err and out == ""
