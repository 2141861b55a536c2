"""`inferctl demo` end to end: the local profile's cluster, a router in front, a bench, clean shutdown."""

from __future__ import annotations

import json
import threading

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
