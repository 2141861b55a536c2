"""`inferctl bench` end to end against a real simulated worker over HTTP, and its error paths."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from infer_ctl.cli.main import main
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread


@pytest.fixture(scope="module")
def worker() -> Iterator[ThreadedSimCluster]:
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.05)]) as c:
        yield c


def test_bench_json_out_and_plot(worker: ThreadedSimCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["bench", "--url", worker.urls[0], "--requests", "40", "-c", "8", "--max-new-tokens", "16", "--json",
               "--out", str(out), "--plot", str(png)])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["exit_code"] == 0 and doc["command"] == "bench"
    s = doc["summary"]
    assert s["completed"] == 40 and s["failed"] == 0
    assert s["time_scale"] == 0.05, "detected from the simulator's /server_info"
    assert s["completion_tokens"] == 40 * 16
    assert s["cache_hit_rate"] > 0.5, "32 shared prefixes, Zipf: most prompt tokens are cached"
    assert s["ttft_s"]["p50"] > 0 and s["itl_s"]["p99"] >= s["itl_s"]["p50"]
    saved = json.loads(out.read_text())
    assert len(saved["results"]) == 40
    assert png.stat().st_size > 1000


@pytest.mark.parametrize("workload", ["multi-turn", "random"])
def test_bench_other_workloads_and_chat_api(worker: ThreadedSimCluster, workload: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--url", worker.urls[0], "-w", workload, "--requests", "12", "-c", "4", "--max-new-tokens", "8",
               "--api", "chat", "--json"])
    s = json.loads(capsys.readouterr().out)["summary"]
    assert rc == 0 and s["completed"] == 12
    if workload == "multi-turn":
        assert s["cache_hit_rate"] > 0.3, "later turns reuse the conversation prefix"


def test_bench_rate_mode_table(worker: ThreadedSimCluster, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--url", worker.urls[0], "--requests", "10", "--rate", "200", "--max-new-tokens", "4"])
    out = capsys.readouterr().out
    assert rc == 0 and "TTFT" in out and "goodput" in out and "cache hit rate" in out


def test_bench_unknown_workload_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--url", "http://127.0.0.1:1", "-w", "bursty"])
    assert rc == 64 and "unknown workload" in capsys.readouterr().err


def test_bench_unreachable_url_fails_with_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    # nothing listens: unreachable (3), as router status and nodes say it; it was 2, after every request
    rc = main(["bench", "--url", "http://127.0.0.1:1", "--requests", "3", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 3 and doc["summary"]["failed"] == 3
    assert any("Connect" in e for e in doc["summary"]["errors"])


def test_bench_unreachable_url_stops_at_once_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    # 400 requests one at a time to a dead address: it sent all 400, then an empty table whose error was
    # cut at 120 characters ("... [Connec")
    rc = main(["bench", "--url", "http://127.0.0.1:1", "--requests", "400", "-c", "1"])
    captured = capsys.readouterr()
    assert rc == 3
    assert "cannot connect to http://127.0.0.1:1" in captured.err and "check --url" in captured.err
    assert "Connect call failed" in captured.out  # the whole reason, not "[Connec"
    assert "399 requests not sent" in captured.out


def test_bench_sends_the_tenant_key_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from infer_ctl.bench import client

    seen: list[object] = []

    async def fake_send(session, url, req, load, t_run, headers=None):  # type: ignore[no-untyped-def]
        seen.append(headers)
        return client.RequestResult(index=req.index, tenant=req.tenant, ok=True, start=0.0, ttft=0.01, e2e=0.02)

    monkeypatch.setattr(client, "send_one", fake_send)
    monkeypatch.setenv("ACME_KEY", "sk-acme-1")
    assert main(["bench", "--url", "http://127.0.0.1:1", "--requests", "2", "--time-scale", "1",
                 "--tenant-key-env", "ACME_KEY", "--json"]) == 0
    assert seen == [{"Authorization": "Bearer sk-acme-1"}] * 2


def test_bench_tenant_key_variable_unset_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    assert main(["bench", "--url", "http://127.0.0.1:1", "--tenant-key-env", "NO_SUCH_KEY"]) == 64
    assert "NO_SUCH_KEY" in capsys.readouterr().err
