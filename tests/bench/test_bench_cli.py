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


def test_bench_unreachable_url_fails_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--url", "http://127.0.0.1:1", "--requests", "3", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2 and doc["summary"]["failed"] == 3
    assert any("Connect" in e for e in doc["summary"]["errors"])
