"""SGLang's own benchmark client, `python -m sglang.benchmark.serving` (bench_serving) of 0.5.23, run
through the router: what users run first against a new deployment.

- over real SGLang's PD pair (Mooncake TCP): every request completes through the router's bootstrap
  protocol, with the tokens asked for;
- over a simulated PD pair with speculative decoding on the decode (EAGLE cannot run on the CPU
  backend): bench_serving prints the accept length, which it reads from the router's `/server_info`
  (`decode[0].internal_states[0].avg_spec_accept_length`, the gateway's PD shape).

bench_serving imports HF `datasets` for its dataset registry, so the engine environment carries it
(scripts/install-test-deps.sh)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.engine import engine
from tests.engine.conftest import Fleet
from tests.waiting import wait_for


def _bench(py: Path, router: RouterHandle, model: str, out: Path, *extra: str) -> tuple[dict[str, Any], str]:
    """One bench_serving run of random token ids (no dataset download); its result record and stdout."""
    try:
        import_check = subprocess.run([str(py), "-c", "import datasets"], capture_output=True, timeout=120,
                                      env=engine.engine_env())
    except subprocess.TimeoutExpired:
        pytest.fail("importing `datasets` in the engine environment took over 120 s")
    if import_check.returncode != 0:
        pytest.skip(f"bench_serving needs `datasets` in {engine.VENV}: {engine.INSTALL_CMD}")
    cmd = [str(py), "-m", "sglang.benchmark.serving", "--backend", "sglang", "--base-url", router.url,
           "--dataset-name", "random-ids", "--random-range-ratio", "1", "--tokenizer", model, "--model", model,
           "--output-file", str(out), "--disable-tqdm", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=engine.engine_env())
    assert p.returncode == 0, f"bench_serving failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    record = json.loads(out.read_text().splitlines()[-1])
    return record, p.stdout


def test_bench_serving_through_the_router_over_real_sglang_pd(engine_python: Path, engine_fleet: Fleet,
                                                              tmp_path: Path) -> None:
    p, d = engine_fleet.prefill, engine_fleet.decode
    router = start_router_in_thread(router_config(prefill=[(p.url, p.bootstrap_port)], decode=[d.url],
                                                  tokenizer_path=engine_fleet.models.jinja, health_interval_s=0.5))
    try:
        assert wait_for(lambda: httpx.get(router.url + "/health", timeout=5).status_code == 200, 60), \
            "the router never saw the PD pair healthy"
        record, stdout = _bench(engine_python, router, engine_fleet.models.jinja, tmp_path / "pd.jsonl",
                                "--num-prompts", "6", "--random-input-len", "48", "--random-output-len", "8",
                                "--max-concurrency", "2")
        assert record["completed"] == 6, stdout[-2000:]
        assert record["total_output_tokens"] == 6 * 8  # the router passed max_new_tokens and every token through
        assert "Successful requests:                     6" in stdout
    finally:
        router.stop()


def test_bench_serving_reports_the_accept_length_through_the_pd_router(engine_python: Path, tmp_path: Path) -> None:
    from tests.engine import tiny_model

    model = tiny_model.write(str(tmp_path / "model"))
    specs = [WorkerSpec("prefill", time_scale=0.05), WorkerSpec("decode", spec_alpha=0.8, spec_gamma=3, seed=1,
                                                                  time_scale=0.05)]
    with start_cluster_in_thread(specs) as cluster:
        pre, dec = cluster.workers
        router = start_router_in_thread(router_config(prefill=[(pre.url, pre.bootstrap_port)], decode=[dec.url],
                                                      health_interval_s=0.3))
        try:
            assert wait_for(lambda: httpx.get(router.url + "/health", timeout=5).status_code == 200, 30), \
                "the router never saw the simulated pair healthy"
            # 16 x 64 tokens, 2 at a time: past the decode's first log interval (40 decode batches), after
            # which SGLang (and the simulator) report avg_spec_accept_length
            record, stdout = _bench(engine_python, router, model, tmp_path / "spec.jsonl",
                                    "--num-prompts", "16", "--random-input-len", "32", "--random-output-len", "64",
                                    "--max-concurrency", "2")
        finally:
            router.stop()
    assert record["completed"] == 16
    accept = record["accept_length"]
    assert isinstance(accept, float) and 1.0 < accept <= 1 + 3, record  # gamma 3: at most 1 + 3 tokens a step
    assert f"{'Accept length:':<40} {accept:<10.2f}" in stdout
