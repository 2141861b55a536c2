"""`inferctl bench` reports speculative acceptance as SGLang's bench_serving does ("Accept length:"), plus
the accept rate and the estimated alpha, from the finishing chunk of each streamed answer (the same
decoder as the router and `check spec`); `--domain` labels the requests with SGLang's custom_labels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infer_ctl.cli.main import main
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread


def test_bench_reports_accept_length_rate_and_alpha_per_domain(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.05, spec_alpha=0.8)]) as c:
        url = c.urls[0]
        assert main(["bench", "--url", url, "--requests", "120", "-c", "12", "--max-new-tokens", "48", "--workload",
                     "random", "--domain", "creative", "--json"]) == 0
        s = json.loads(capsys.readouterr().out)["summary"]["speculative"]
        assert s["requests"] == 120 and abs(s["alpha"] - 0.42) < 0.03, s  # the simulator's creative domain
        assert 1.0 < s["accept_length"] < 2.2 and s["accept_rate"] < s["alpha"]
        assert main(["bench", "--url", url, "--requests", "40", "-c", "8", "--max-new-tokens", "32", "--out",
                     str(tmp_path / "r.json")]) == 0
        out = capsys.readouterr().out
        assert "Accept length" in out and "Accept rate" in out and "alpha" in out
        saved = json.loads((tmp_path / "r.json").read_text())
        assert all(r["spec"]["verify_ct"] > 0 for r in saved["results"])
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.05, speculative=False)]) as c:
        assert main(["bench", "--url", c.urls[0], "--requests", "10", "-c", "4", "--max-new-tokens", "8", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["summary"]["speculative"] is None
