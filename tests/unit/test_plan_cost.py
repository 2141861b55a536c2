"""`inferctl plan cost`: $ per million tokens from lease cost, throughput and utilisation, with exact values
for given inputs (computed by hand in the comments), a real `bench` result as the throughput source,
the architecture tables' three-scenario structure, and exit 64 with one line for bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from infer_ctl.cli.main import main
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread


def _doc(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    assert main(["plan", "cost", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _one(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    doc = _doc(argv, capsys)
    assert len(doc["scenarios"]) == 1
    return doc["scenarios"][0]


_EIGHT_GPUS = ["--scenario", "custom", "--pool", "collocated:nodes=1,gpus=8,gpu_hour=2.5"]


def test_collocated_given_throughput_hand_computed(capsys: pytest.CaptureFixture[str]) -> None:
    s = _one([*_EIGHT_GPUS, "--output-tps", "2000", "--input-tps", "8000", "--utilisation", "1",
              "--prefill-share", "0.25", "--cache-hit-rate", "0.5", "--cached-price-ratio", "0.1"], capsys)
    c = s["cost"]
    # 8 GPUs x $2.50 = $20.00 per hour; 2,000 output tok/s x 3,600 s = 7,200,000 output tokens per hour
    assert c["hourly_usd"] == 20.0 and c["output_tokens_per_hour"] == 7_200_000
    # all-in: $20 / 7.2 M = $2.7778 per million output tokens
    assert c["usd_per_m_output_all_in"] == pytest.approx(20 / 7.2, rel=1e-12)
    # prefill gets 25 % of the bill = $5/h; input 8,000 x 3,600 = 28.8 M/h, half of it cached and billed
    # at 0.1: 14.4 M + 1.44 M = 15.84 M billable -> $5 / 15.84 = $0.31566 per M uncached, $0.031566 cached
    assert c["input_tokens_per_hour"] == 28_800_000 and c["cached_tokens_per_hour"] == 14_400_000
    assert c["usd_per_m_input"] == pytest.approx(5 / 15.84, rel=1e-12)
    assert c["usd_per_m_cached_input"] == pytest.approx(0.5 / 15.84, rel=1e-12)
    # decode gets $15/h over 7.2 M output tokens: $2.0833
    assert c["usd_per_m_output"] == pytest.approx(15 / 7.2, rel=1e-12)
    # everything over input + output: $20 / 36 M = $0.5556
    assert c["usd_per_m_tokens_all_in"] == pytest.approx(20 / 36, rel=1e-12)
    assert s["throughput"]["source"] == "given"


def test_utilisation_divides_the_tokens_not_the_bill(capsys: pytest.CaptureFixture[str]) -> None:
    full = _one([*_EIGHT_GPUS, "--output-tps", "2000", "--utilisation", "1"], capsys)["cost"]
    half = _one([*_EIGHT_GPUS, "--output-tps", "2000", "--utilisation", "0.5"], capsys)["cost"]
    assert half["hourly_usd"] == full["hourly_usd"] == 20.0
    assert half["usd_per_m_output_all_in"] == pytest.approx(2 * full["usd_per_m_output_all_in"], rel=1e-12)
    # no model and no --prefill-share: the collocated bill cannot be split into input and output
    assert full["usd_per_m_input"] is None and full["usd_per_m_output"] is None


def test_node_hour_price(capsys: pytest.CaptureFixture[str]) -> None:
    c = _one(["--scenario", "custom", "--pool", "collocated:nodes=2,gpus=8,node_hour=30",
              "--output-tps", "1000", "--utilisation", "1"], capsys)["cost"]
    # 2 nodes x $30 = $60/h over 3.6 M tokens: $16.667 per M
    assert c["hourly_usd"] == 60 and c["usd_per_m_output_all_in"] == pytest.approx(60 / 3.6, rel=1e-12)


def test_disaggregated_bills_each_pool_to_its_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    s = _one(["--scenario", "disaggregated", "--input-tps", "40000", "--output-tps", "10000", "--utilisation", "1"], capsys)
    c = s["cost"]
    # 2 H100 nodes x 8 x $2.50 = $40 prefill + 6 H200 nodes x 8 x $3.50 = $168 decode = $208/h
    assert (c["hourly_usd"], c["prefill_hourly_usd"], c["decode_hourly_usd"]) == (208.0, 40.0, 168.0)
    # $40 / (40,000 x 3,600 = 144 M) = $0.27778 per M input; $168 / 36 M = $4.6667 per M output
    assert c["usd_per_m_input"] == pytest.approx(40 / 144, rel=1e-12)
    assert c["usd_per_m_output"] == pytest.approx(168 / 36, rel=1e-12)
    assert c["usd_per_m_output_all_in"] == pytest.approx(208 / 36, rel=1e-12)
    pools = {p["role"]: p for p in s["inputs"]["pools"]}
    assert pools["decode"]["gpus"] == 48 and pools["decode"]["hourly_usd"] == 168.0


def test_pool_overrides_change_only_what_they_name(capsys: pytest.CaptureFixture[str]) -> None:
    s = _one(["--scenario", "disaggregated", "--pool", "decode:nodes=3,gpu_hour=4", "--output-tps", "1000",
              "--utilisation", "1"], capsys)
    pools = {p["role"]: p for p in s["inputs"]["pools"]}
    assert pools["decode"]["nodes"] == 3 and pools["decode"]["node_hour_usd"] == 32.0  # 8 GPUs x $4
    assert pools["decode"]["accelerator"] == "h200" and pools["prefill"]["nodes"] == 2
    assert s["cost"]["hourly_usd"] == 40 + 3 * 32


def test_pools_from_a_profile_prices_from_flags(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(["-p", "builtin:reference-h100-h200", "--pool", "prefill:gpu_hour=2.5",
                "--pool", "decode:gpu_hour=3.5", "--output-tps", "10000", "--input-tps", "40000", "--utilisation", "1"], capsys)
    assert doc["profile"] == "prod-a" and len(doc["scenarios"]) == 1
    s = doc["scenarios"][0]
    pools = {p["role"]: p for p in s["inputs"]["pools"]}
    # the profile: pf-01..02 (8 GPUs, gpu: h100-sxm), dc-01..06 (8 GPUs, gpu: h200), Llama-3.1-70B at tp 8
    assert (pools["prefill"]["nodes"], pools["prefill"]["accelerator"], pools["prefill"]["tp"]) == (2, "h100-sxm", 8)
    assert (pools["decode"]["nodes"], pools["decode"]["accelerator"]) == (6, "h200")
    assert s["inputs"]["model"] == "llama-3.1-70b"
    assert s["cost"]["hourly_usd"] == 208.0 and s["cost"]["usd_per_m_output"] == pytest.approx(168 / 36, rel=1e-12)
    # a collocated profile is one collocated pool: box-01, 8 GPUs, Llama-3.1-8B at tp 1 (8 replicas)
    s = _one(["-p", "builtin:single-node-collocated", "--pool", "collocated:gpu_hour=2.5"], capsys)
    (pool,) = s["inputs"]["pools"]
    assert (pool["role"], pool["nodes"], pool["gpus"], pool["tp"], pool["replicas"]) == ("collocated", 1, 8, 1, 8)
    assert s["cost"]["hourly_usd"] == 20.0 and s["inputs"]["model"] == "llama-3.1-8b"


# ---- measured throughput: a real `bench` run against a simulated worker --------------------------------


@pytest.fixture(scope="module")
def bench_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, ThreadedSimCluster]]:
    out_dir = tmp_path_factory.mktemp("bench")
    stdout_doc, out_file = out_dir / "stdout.json", out_dir / "out.json"
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.05)]) as c:
        yield stdout_doc, out_file, c


def _run_bench(cluster: ThreadedSimCluster, stdout_doc: Path, out_file: Path,
               capsys: pytest.CaptureFixture[str]) -> None:
    if stdout_doc.exists():
        return
    assert main(["bench", "--url", cluster.urls[0], "--requests", "16", "-c", "4", "--max-new-tokens", "8", "--json",
                 "--out", str(out_file)]) == 0
    stdout_doc.write_text(capsys.readouterr().out)


BenchFiles = tuple[Path, Path, ThreadedSimCluster]


def test_bench_result_is_a_throughput_source(bench_files: BenchFiles, capsys: pytest.CaptureFixture[str]) -> None:
    stdout_doc, out_file, cluster = bench_files
    _run_bench(cluster, stdout_doc, out_file, capsys)
    summary = json.loads(stdout_doc.read_text())["summary"]
    i, o, h = summary["input_token_throughput"], summary["output_token_throughput"], summary["cache_hit_rate"]
    assert o > 0 and h > 0, "the shared-prefix workload hits the simulated radix cache"
    for path in (stdout_doc, out_file):  # the `bench --json` document and the `bench --out` file
        s = _one(["--scenario", "disaggregated", "--bench", str(path), "--utilisation", "1"], capsys)
        tp, c = s["throughput"], s["cost"]
        assert tp["source"] == f"bench {path}"
        assert (tp["input_tokens_s"], tp["output_tokens_s"], tp["cache_hit_rate"]) == (i, o, h)
        billable = i * 3600 * (1 - h) + 0.1 * i * 3600 * h
        assert c["usd_per_m_input"] == pytest.approx(40 / billable * 1e6, rel=1e-12)
        assert c["usd_per_m_output_all_in"] == pytest.approx(208 / (o * 3600) * 1e6, rel=1e-12)


def test_collocated_bench_is_split_by_the_roofline(bench_files: BenchFiles,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    stdout_doc, out_file, cluster = bench_files
    _run_bench(cluster, stdout_doc, out_file, capsys)
    s = _one(["--scenario", "collocated", "--bench", str(stdout_doc), "--utilisation", "1"], capsys)
    share = s["throughput"]["prefill_share"]
    assert 0 < share < 1
    assert s["cost"]["prefill_hourly_usd"] == pytest.approx(20 * share, rel=1e-12)


# ---- the architecture tables' structure from the roofline estimate ------------------------------------


def test_three_scenarios_every_input_printed(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc([], capsys)
    names = [s["name"] for s in doc["scenarios"]]
    assert names == ["collocated", "disaggregated", "disagg-spec-radix"]
    all_in = [s["cost"]["usd_per_m_output_all_in"] for s in doc["scenarios"]]
    # the tables' ordering: collocated > disaggregated > disaggregated + speculative + radix cache
    assert all_in[0] > all_in[1] > all_in[2] > 0
    for s in doc["scenarios"]:
        inputs = s["inputs"]
        assert {"pools", "workload", "spec", "utilisation", "cached_price_ratio", "prefill_mfu",
                "decode_bw_efficiency", "model", "layout"} <= inputs.keys()
        tp = s["throughput"]
        assert tp["source"] == "roofline"
        w = inputs["workload"]
        assert tp["input_tokens_s"] == pytest.approx(tp["output_tokens_s"] * w["prompt_tokens"] / w["output_tokens"])
    spec = doc["scenarios"][2]
    assert spec["inputs"]["spec"] == {"alpha": 0.7, "gamma": 3, "cost_ratio": 0.05}
    assert spec["throughput"]["cache_hit_rate"] == 0.5


def test_overrides_reach_every_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    base = _doc([], capsys)["scenarios"]
    lower = _doc(["--utilisation", "0.35"], capsys)["scenarios"]  # half the default 0.7
    for a, b in zip(base, lower, strict=True):
        assert b["inputs"]["utilisation"] == 0.35
        assert b["cost"]["usd_per_m_output_all_in"] == pytest.approx(2 * a["cost"]["usd_per_m_output_all_in"])
    no_spec = _one(["--scenario", "disagg-spec-radix", "--no-spec"], capsys)
    assert no_spec["inputs"]["spec"] is None


def test_speculation_and_cache_lower_the_cost(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _one(["--scenario", "disaggregated"], capsys)["cost"]["usd_per_m_output_all_in"]
    cached = _one(["--scenario", "disaggregated", "--cache-hit-rate", "0.5"], capsys)["cost"]
    spec = _one(["--scenario", "disaggregated", "--spec-alpha", "0.8"], capsys)["cost"]
    assert cached["usd_per_m_output_all_in"] < plain and spec["usd_per_m_output_all_in"] <= plain


def test_table_output(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "220")
    assert main(["plan", "cost"]) == 0
    out = capsys.readouterr().out
    for row in ("pools", "utilisation", "cached price ratio", "$/M input (uncached)", "$/M cached input",
                "$/M output, all-in", "disagg-spec-radix"):
        assert row in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pool", "collocated:node_hour=-3"], "--pool collocated:node_hour (cost per node-hour) must be >= 0, got -3"),
        (["--pool", "decode:gpu_hour=-1"], "--pool decode:gpu_hour (cost per GPU-hour) must be >= 0, got -1"),
        (["--utilisation", "0"], "--utilisation must be in (0, 1], got 0"),
        (["--utilisation", "1.2"], "--utilisation must be in (0, 1], got 1.2"),
        (["--cached-price-ratio", "2"], "--cached-price-ratio must be in [0, 1], got 2"),
        (["--scenario", "custom", "--pool", "collocated:gpu_hour=2"],
         "no throughput source: give --bench FILE, --output-tps N, or --model PRESET"),
        (["--scenario", "custom"], "no pools"),
        (["--scenario", "custom", "--pool", "collocated:gpus=8"], "a new pool needs its price"),
        (["--output-tps", "100"], "a measured or given throughput belongs to one deployment: give --scenario"),
        (["--scenario", "collocated", "--output-tps", "0"], "--output-tps must be > 0, got 0"),
        (["--scenario", "collocated", "--bench", "/nonexistent/bench.json"], "--bench /nonexistent/bench.json: cannot read it"),
        (["--scenario", "cheap"], "unknown --scenario 'cheap'"),
        (["--pool", "gpu:nodes=1"], "role must be one of collocated, prefill, decode"),
        (["--pool", "decode:colour=red"], "unknown key 'colour'"),
        (["--pool", "decode:nodes=x"], "nodes must be a number"),
        (["--pool", "decode:nodes=0"], "--pool decode:nodes must be >= 1, got 0"),
        (["--scenario", "disaggregated", "--pool", "collocated:gpu_hour=1"],
         "a collocated pool cannot be mixed with prefill/decode pools"),
        (["--model", "gpt-17"], "unknown model preset 'gpt-17'"),
        (["--spec-alpha", "1.5"], "--spec-alpha must be in [0, 1], got 1.5"),
        (["--spec-gamma", "-1"], "--spec-gamma must be >= 0, got -1"),
        (["--batch", "0"], "--batch must be >= 1, got 0"),
        (["-p", "builtin:reference-h100-h200", "--pool", "decode:gpu_hour=3"],
         "profile prod-a has no prices: give --pool ROLE:node_hour=USD (or gpu_hour=USD) for prefill"),
        (["-p", "builtin:reference-h100-h200", "--scenario", "collocated"], "--profile builds its own scenario"),
    ],
)
def test_bad_input_exits_64_with_one_line(args: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "cost", *args]) == 64
    captured = capsys.readouterr()
    assert captured.out == ""
    error, hint = captured.err.splitlines()
    assert error.startswith("inferctl: error: ") and message in error, error
    assert hint.startswith("  hint: ")


def test_bench_file_without_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"command": "check gpu", "findings": []}))
    assert main(["plan", "cost", "--scenario", "collocated", "--bench", str(bad)]) == 64
    assert "no summary.input_token_throughput" in capsys.readouterr().err
    bad.write_text("{not json")
    assert main(["plan", "cost", "--scenario", "collocated", "--bench", str(bad), "--json"]) == 64
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 64 and "not JSON" in doc["error"]["message"]
