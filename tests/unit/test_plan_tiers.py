"""`inferctl plan tiers`: tier capacities, SGLang 0.5.23's host-pool sizing, and hit-vs-recompute, against
numbers computed by hand (in the comments), through the CLI's --json document."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.sizing import tiers as tiers_mod
from infer_ctl.core.sizing.kv import KvShape
from infer_ctl.core.sizing.roofline import prefill_flops
from infer_ctl.core.sizing.tiers import Compute, TierInputs, plan_tiers

GIB = 1024**3
H100_FLOPS = 989.4e12


def _doc(argv: list[str], capsys: pytest.CaptureFixture[str], rc: int = 0) -> dict:  # type: ignore[type-arg]
    assert main(["plan", "tiers", *argv, "--json"]) == rc
    return json.loads(capsys.readouterr().out)


def _tier(doc: dict, key: str, tier: str) -> dict:  # type: ignore[type-arg]
    return next(t for t in doc[key] if t["tier"] == tier)


# ---- footprints: the sizing-table numbers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "dtype", "tp", "per_token", "per_rank"),
    [
        # Llama-3.1-70B: 2 (K, V) x 2 B x 80 layers x 8 KV heads x 128 = 327,680 B (320 KiB); TP 8: 1 head
        ("llama-3.1-70b", "bf16", 8, 327_680, 2 * 2 * 80 * 1 * 128),  # 40,960
        # Llama-3.1-8B: 2 x 2 x 32 x 8 x 128 = 131,072 B (128 KiB); TP 1 keeps all of it
        ("llama-3.1-8b", "bf16", 1, 131_072, 131_072),
        # TP 16 > 8 KV heads: each rank keeps one (replicated) head, max(1, 8 // 16) = 1
        ("llama-3.1-8b", "bf16", 16, 131_072, 2 * 2 * 32 * 1 * 128),  # 16,384
        # DeepSeek-V3 (MLA): 2 B x 61 layers x (512 latent + 64 rope) = 70,272 B (68.6 KiB), no K/V split,
        # replicated on every rank
        ("deepseek-v3", "bf16", 8, 70_272, 70_272),
        ("deepseek-v3", "fp8", 8, 1 * 61 * 576, 35_136),
    ],
)
def test_footprints(model: str, dtype: str, tp: int, per_token: int, per_rank: int,
                    capsys: pytest.CaptureFixture[str]) -> None:
    x = "h200" if model == "deepseek-v3" else "h100-sxm"
    extra = ["--weight-dtype", "fp8"] if model == "deepseek-v3" else []
    doc = _doc(["-m", model, "--dtype", dtype, "--tp", str(tp), "-x", x, *extra], capsys)
    assert doc["kv_bytes_per_token"] == per_token
    assert doc["kv_bytes_per_token_per_rank"] == per_rank


def test_plan_kv_agrees_for_mla(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "kv", "-m", "deepseek-v3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kv_bytes_per_token"] == 70_272 and doc["kv_lora_rank"] == 512 and doc["rope_dim"] == 64
    assert doc["kv_bytes"] == 70_272 * 8192  # 575,668,224 B per 8k request, vs 2.5 GiB for Llama-3.1-70B


def test_explicit_mla_shape_equals_the_preset(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(["--layers", "61", "--kv-lora-rank", "512", "--rope-dim", "64", "--params-b", "37.5"], capsys)
    assert doc["kv_bytes_per_token"] == 70_272 and doc["kv_bytes_per_token_per_rank"] == 70_272


# ---- capacity and SGLang's host-pool sizing -----------------------------------------------------------


def test_llama70b_hbm_and_sglang_auto_host_pool(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(["-m", "llama-3.1-70b", "--host-ram-gb", "2000"], capsys)
    hbm = _tier(doc, "capacities", "hbm")
    # per rank: 80e9 - 141,107,412,992 / 8 = 80,000,000,000 - 17,638,426,624 = 62,361,573,376 B
    # // 40,960 = 1,522,499 tokens, down to whole pages of 64: 23,788 x 64 = 1,522,496
    assert hbm["tokens"] == 1_522_496
    assert hbm["sessions"] == 1_522_496 // 8192 == 185  # plan kv's 185 streams of 8k
    # SGLang auto-size: (2e12 - 10 GiB) // 8 ranks = 248,657,822,720 B per rank; x 0.8 = 198,926,258,176;
    # device pool bytes (1,522,496 + 64 padding) x 40,960 = 62,364,057,600; 198.9e9 x 0.95 / 62.4e9 = 3.03
    # -> min(2.0, 3.03) = 2.0; host tokens int(1,522,496 x 2) = 3,044,992 -> (// 64 + 1) x 64 = 3,045,056
    auto = doc["host_auto"]
    assert auto["budget_per_rank"] == (2_000_000_000_000 - 10 * GIB) // 8 == 248_657_822_720
    assert auto["ratio"] == 2.0 and auto["tokens"] == 3_045_056
    assert auto["bytes_per_rank"] == 3_045_056 * 40_960 == 124_725_493_760
    assert auto["bytes_per_host"] == 8 * 124_725_493_760 and auto["fits"] is True
    assert doc["host_explicit"] is None and doc["host_chosen"] == auto
    host = _tier(doc, "capacities", "host")
    assert host["tokens"] == 3_045_056 and host["sessions"] == 3_045_056 // 8192 == 371
    assert doc["findings"] == [] and doc["exit_code"] == 0


def test_auto_sizing_lowers_the_ratio_to_fit_host_ram(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(["-m", "llama-3.1-70b", "--host-ram-gb", "512"], capsys, rc=1)
    # (512e9 - 10,737,418,240) // 8 = 62,657,822,720; int(x 0.8) = 50,126,258,176;
    # ratio = 50,126,258,176 x 0.95 / 62,364,057,600 = 0.76358; int(1,522,496 x 0.76358) = 1,162,547
    # -> (1,162,547 // 64 + 1) x 64 = 1,162,560 tokens, fewer than the device pool: SGLang warns
    auto = doc["host_auto"]
    assert auto["ratio"] == pytest.approx(50_126_258_176 * 0.95 / 62_364_057_600, rel=1e-15)
    assert auto["tokens"] == 1_162_560 and auto["smaller_than_device"] is True
    assert [f["check"] for f in doc["findings"]] == ["plan.tiers.host_small"]


def test_explicit_size_and_ratio_turn_auto_sizing_off(capsys: pytest.CaptureFixture[str]) -> None:
    # --hicache-size 100 (GB per rank): int(100e9 // 40,960) = 2,441,406 -> (38,146 + 1) x 64 = 2,441,408
    doc = _doc(["-m", "llama-3.1-70b", "--host-ram-gb", "2000", "--hicache-size", "100"], capsys)
    assert doc["host_explicit"]["source"] == "--hicache-size" and doc["host_explicit"]["tokens"] == 2_441_408
    assert doc["host_chosen"] == doc["host_explicit"], "an explicit size wins over SGLang's auto-sizing"
    assert doc["host_auto"]["tokens"] == 3_045_056, "still shown next to it"
    # --hicache-ratio 4 on a 512 GB node: 4 x 1,522,496 = 6,089,984 -> 6,090,048 tokens x 40,960 B =
    # 249,448,366,080 B per rank > the 62,657,822,720 B SGLang lets one rank take: it refuses to start
    doc = _doc(["-m", "llama-3.1-70b", "--host-ram-gb", "512", "--hicache-ratio", "4"], capsys, rc=1)
    ex = doc["host_explicit"]
    assert ex["tokens"] == 6_090_048 and ex["bytes_per_rank"] == 249_448_366_080 and ex["fits"] is False
    assert "plan.tiers.host_fit" in [f["check"] for f in doc["findings"]]


def test_deepseek_v3_capacity_is_per_rank_replicated(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(["-m", "deepseek-v3", "-x", "h200", "--weight-dtype", "fp8", "--storage-tb", "10",
                "--storage-gbs", "10"], capsys)
    # weights 671,026,419,200 B (fp8) / 8 = 83,878,302,400 per rank; 141e9 - that = 57,121,697,600 B
    # // 70,272 = 812,865 -> 812,864 (whole pages): every rank holds the whole latent of every token
    assert _tier(doc, "capacities", "hbm")["tokens"] == 812_864
    # storage keeps ONE copy of an MLA page (keys without the TP rank): 10e12 // 70,272 = 142,304,189
    # -> whole pages 142,304,128; but all 8 ranks read it into their own host pool
    assert doc["storage_bytes_per_token"] == 70_272
    assert doc["read_bytes_per_token_per_node"] == 8 * 70_272
    assert _tier(doc, "capacities", "storage")["tokens"] == 142_304_128


# ---- hit vs recompute --------------------------------------------------------------------------------


def _sglang_26305(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:  # type: ignore[type-arg]
    # sglang#26305: GQA 70B class, 8k prefix, file backend on local NVMe. Here: Llama-3.1-70B TP 8 on
    # H100, a 3 GB/s effective file-backend read, page 64, prefill at 50 % MFU.
    return _doc(["-m", "llama-3.1-70b", "--prefix", "8192", "--page-size", "64", "--storage-tb", "10",
                 "--storage-gbs", "3", "--pcie-gbs", "50", "--efficiency", "0.5", *extra], capsys)


def test_sglang_26305_storage_does_not_pay_host_does(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _sglang_26305(capsys)
    # recompute: 2 x 70,553,706,496 x 8192 + 80 x (8192 + 8192) x 8192 x 8193 = 1,243,923,594,870,784 FLOPs
    flops = 2 * 70_553_706_496 * 8192 + 80 * 16_384 * 8192 * 8193
    assert flops == 1_243_923_594_870_784
    recompute = flops / (H100_FLOPS * 8 * 0.5)  # 314.3 ms
    # host: 8192 x 40,960 B per rank over its own 50 GB/s link = 6.71 ms
    host = _tier(doc, "loads", "host")
    assert host["load_seconds"] == pytest.approx(8192 * 40_960 / 50e9, rel=1e-12)
    assert host["recompute_seconds"] == pytest.approx(recompute, rel=1e-12)
    assert host["pays"] is True and host["break_even_tokens"] == 64
    # storage: 8192 x 327,680 B (8 ranks' shards) at 3 GB/s = 894.8 ms, then the 6.71 ms host hop
    storage = _tier(doc, "loads", "storage")
    assert storage["load_seconds"] == pytest.approx(8192 * (327_680 / 3e9 + 40_960 / 50e9), rel=1e-12)
    assert storage["load_seconds"] > 2.8 * storage["recompute_seconds"]
    assert storage["pays"] is False
    # per token it loads at 110.0 us and recomputes at 35.7 us + 0.33 ns x N: they cross only near
    # N = 224k tokens, past the 131,072-token context of Llama-3.1
    assert storage["break_even_tokens"] is None
    assert storage["never"] == "loading is slower than recomputing at every prefix up to 131,072 tokens"
    assert _tier(doc, "loads", "hbm")["pays"] is True and _tier(doc, "loads", "hbm")["load_seconds"] == 0


def test_per_page_overhead_and_latency_add_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    base = _tier(_sglang_26305(capsys), "loads", "storage")["load_seconds"]
    slow = _tier(_sglang_26305(capsys, "--storage-page-overhead-us", "50", "--storage-latency-us", "200"),
                 "loads", "storage")["load_seconds"]
    # 8192 / 64 = 128 pages x 50 us = 6.4 ms, + 0.2 ms latency
    assert slow - base == pytest.approx(128 * 50e-6 + 200e-6, rel=1e-9)


def test_a_fast_remote_store_pays_above_its_break_even(capsys: pytest.CaptureFixture[str]) -> None:
    # a distributed store at 100 GB/s, reached over 2 x 400 Gb/s = 100 GB/s, 20 ms per lookup
    doc = _sglang_26305(capsys, "--storage-gbs", "100", "--fabric-gbps", "800", "--storage-latency-us", "20000")
    st = _tier(doc, "loads", "storage")
    be = st["break_even_tokens"]
    assert be is not None and be % 64 == 0 and st["pays"] is True
    compute = Compute(H100_FLOPS * 8 * 0.5, 70_553_706_496, 80, 8192, 8192)
    per_token = 327_680 / 100e9 + 40_960 / 50e9

    def load(n: int) -> float:
        return 0.02 + per_token * n

    assert load(be) < compute.seconds(be) and load(be - 64) >= compute.seconds(be - 64)
    # hand: 20 ms fixed / (35.7 - 4.1 us per token) ~ 633 tokens -> the 10th page, 640
    assert be == 640


def test_storage_load_without_its_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(["-m", "llama-3.1-70b", "--storage-gbs", "3"], capsys)
    assert [t["tier"] for t in doc["capacities"]] == ["hbm"]
    assert _tier(doc, "loads", "storage")["pays"] is False


def test_fabric_caps_the_read(capsys: pytest.CaptureFixture[str]) -> None:
    fast = _tier(_sglang_26305(capsys, "--storage-gbs", "100"), "loads", "storage")["load_seconds_per_token"]
    capped = _tier(_sglang_26305(capsys, "--storage-gbs", "100", "--fabric-gbps", "100"), "loads",
                   "storage")["load_seconds_per_token"]
    assert fast == pytest.approx(327_680 / 100e9 + 40_960 / 50e9, rel=1e-12)
    assert capped == pytest.approx(327_680 / 12.5e9 + 40_960 / 50e9, rel=1e-12)  # 100 Gb/s = 12.5 GB/s


def test_core_never_when_loading_costs_more_per_token_without_attention() -> None:
    # no attention term: recompute is linear, 2 x params / F per token; a 1 GB/s host link is slower
    shape = KvShape(layers=80, kv_heads=8, head_dim=128)
    inp = TierInputs(tp=8, hbm_bytes_per_gpu=80_000_000_000, weights_bytes=0, pcie_bytes_s=1e9,
                     compute=Compute(H100_FLOPS * 8 * 0.5, 70_553_706_496, 0, 0, 0))
    host = next(ld for ld in plan_tiers(shape, 2, inp).loads if ld.tier == "host")
    assert host.load_seconds_per_token == 40_960 / 1e9 > 2 * 70_553_706_496 / (H100_FLOPS * 4)
    assert host.break_even_tokens is None and host.pays is False


def test_a_prefix_shorter_than_a_page_is_never_a_hit(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(["-m", "llama-3.1-8b", "--tp", "1", "--prefix", "63"], capsys)
    host = _tier(doc, "loads", "host")
    assert host["prefix_tokens"] == 0 and host["pays"] is False and host["load_seconds"] == 0


def test_prefill_flops_hand_computed() -> None:
    # 2 x 8e9 x 4 + 32 layers x (4096 + 4096) x 4 x 5: causal, token i attends to i keys
    assert prefill_flops(params=8_000_000_000, tokens=4, layers=32, qk_dim=4096, v_dim=4096) == (
        64_000_000_000 + 32 * 8192 * 20
    )
    assert prefill_flops(params=10, tokens=0) == 0


def test_json_document_shape(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(["-m", "llama-3.1-8b", "--tp", "1", "--host-ram-gb", "256"], capsys)
    assert doc["command"] == "plan tiers" and doc["status"] == "ok" and doc["findings"] == []
    assert {"capacities", "loads", "host_auto", "host_explicit", "assumptions", "inputs"} <= doc.keys()
    assert doc["inputs"]["ranks_per_host"] == 1 and doc["inputs"]["page_size"] == 64


_70B = ["-m", "llama-3.1-70b"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*_70B, "--tp", "0"], "--tp must be >= 1, got 0"),
        ([*_70B, "--efficiency", "0"], "--efficiency must be in (0, 1], got 0"),
        ([*_70B, "--hicache-ratio", "2", "--hicache-size", "100"], "give --hicache-ratio or --hicache-size, not both"),
        ([*_70B, "--storage-tb", "10"], "--storage-tb needs --storage-gbs"),
        ([*_70B, "--host-ram-gb", "-1"], "--host-ram-gb must be > 0, got -1"),
        ([*_70B, "--page-size", "0"], "--page-size must be >= 1, got 0"),
        ([*_70B, "--mem-fraction", "1.5"], "--mem-fraction must be in (0, 1], got 1.5"),
        ([*_70B, "--hicache-host-memory-fraction", "0"], "--hicache-host-memory-fraction must be in (0, 1], got 0"),
        ([*_70B, "--pcie-gbs", "0"], "--pcie-gbs must be > 0, got 0"),
        (["-m", "gpt-17"], "unknown model preset 'gpt-17'"),
        (["-m", "llama-3.1-8b", "--rope-dim", "64"], "--rope-dim is for MLA models"),
        (["--layers", "80", "--kv-heads", "8", "--head-dim", "128"], "needs the parameter count"),
        (["--params-b", "70"], "missing --layers, --kv-heads, --head-dim"),
    ],
)
def test_usage_errors_exit_64_with_one_line(args: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "tiers", *args]) == 64
    captured = capsys.readouterr()
    assert captured.out == ""
    error, hint = captured.err.splitlines()
    assert error.startswith("inferctl: error: ") and message in error, error
    assert hint.startswith("  hint: ")


# ---- the SGLang constants we copy, read from the installed SGLang 0.5.23 source (not imported: it needs
# torch and transformers) ------------------------------------------------------------------------------


def _sglang_file(rel: str) -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang not installed: pip install 'inferctl[sglang]'")
    return Path(next(iter(spec.submodule_search_locations))) / rel


def _assigned(path: Path, name: str) -> object:
    for node in ast.walk(ast.parse(path.read_text())):
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            return eval(compile(ast.Expression(node.value), str(path), "eval"))  # literals only
    raise AssertionError(f"{name} not found in {path}")


@pytest.mark.sglang
def test_constants_match_sglang_source() -> None:
    base = _sglang_file("srt/mem_cache/pool_host/base.py")
    assert _assigned(base, "HICACHE_HOST_MEMORY_RESERVE_BYTES") == tiers_mod.SGLANG_HOST_RESERVE_BYTES
    auto = _sglang_file("srt/mem_cache/hicache_auto_size.py")
    assert _assigned(auto, "_ALLOCATION_SLACK_FRACTION") == tiers_mod.SGLANG_AUTO_SIZE_SLACK
    fields = _sglang_file("srt/arg_groups/fields/memory.py").read_text()
    assert "hicache_host_memory_fraction" in fields
    tail = fields.split("hicache_host_memory_fraction:", 1)[1]
    assert f"] = {tiers_mod.SGLANG_DEFAULT_HOST_FRACTION}" in tail.split("\n    hicache_", 1)[0]
    hook = _sglang_file("srt/arg_groups/hicache_hook.py").read_text()
    assert f'1.2 if cfg.hicache_host_memory_mode == "buffer_only" else {tiers_mod.SGLANG_DEFAULT_RATIO}' in hook
    # the host pool rounding and fixed-size formula we mirror in host_pool_tokens
    init = _sglang_file("srt/mem_cache/pool_host/base.py").read_text()
    assert "int(host_size * 1e9 // self.size_per_token)" in init
    assert "self.page_num = self.size // self.page_size + 1" in init


@pytest.mark.parametrize(("option", "value", "shown"), [
    ("--storage-gbs", "-1", "--storage-gbs must be > 0, got -1"),
    ("--pcie-latency-us", "-3", "--pcie-latency-us must be >= 0, got -3"),
    ("--host-ram-gb", "-2", "--host-ram-gb must be > 0, got -2"),
])
def test_a_range_error_shows_the_value_in_the_options_unit(
    option: str, value: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "tiers", "--model", "llama-3.1-70b", option, value]) == 64
    assert shown in capsys.readouterr().err


# ---- hostile input: each of these crashed (exit 2), passed silently with the preset's
# value, or planned a TP SGLang refuses to start -----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # NaN / inf crashed in int() (exit 2) or passed every range test (exit 0 with a nonsense plan)
        ([*_70B, "--hbm-gb", "nan"], "--hbm-gb must be a finite number, got nan"),
        ([*_70B, "--hbm-gb", "inf"], "--hbm-gb must be a finite number, got inf"),
        ([*_70B, "--host-ram-gb", "nan"], "--host-ram-gb must be a finite number"),
        ([*_70B, "--weights-gb", "nan"], "--weights-gb must be a finite number"),
        ([*_70B, "--params-b", "nan"], "--params-b must be a finite number"),
        ([*_70B, "--efficiency", "nan"], "--efficiency must be a finite number"),
        ([*_70B, "--tflops", "inf"], "--tflops must be a finite number"),
        ([*_70B, "--pcie-gbs", "nan"], "--pcie-gbs must be a finite number"),
        ([*_70B, "--storage-tb", "inf", "--storage-gbs", "1"], "--storage-tb must be a finite number"),
        ([*_70B, "--storage-tb", "1", "--storage-gbs", "nan"], "--storage-gbs must be a finite number"),
        ([*_70B, "--host-ram-gb", "1000", "--hicache-ratio", "nan"], "--hicache-ratio must be a finite number"),
        ([*_70B, "--host-reserve-gib", "nan"], "--host-reserve-gib must be a finite number"),
        # an explicit 0 was replaced by the preset's value (`x or preset.x`)
        ([*_70B, "--layers", "0"], "--layers must be >= 1, got 0"),
        ([*_70B, "--kv-heads", "0"], "--kv-heads must be >= 1, got 0"),
        ([*_70B, "--head-dim", "0"], "--head-dim must be >= 1, got 0"),
        ([*_70B, "--attention-heads", "0"], "--attention-heads must be >= 1, got 0"),
        ([*_70B, "--max-prefix", "0"], "--max-prefix must be >= 1, got 0"),
        (["-m", "deepseek-v3", "--kv-lora-rank", "0"], "--kv-lora-rank must be >= 1, got 0"),
        (["-m", "deepseek-v3", "--rope-dim", "-1"], "--rope-dim must be >= 0, got -1"),
        # TP that SGLang's attention layers assert on (llama.py / deepseek_v2.py): 64 heads over 3 / 6 ranks
        ([*_70B, "--tp", "3"], "--tp 3 does not divide the 64 attention heads"),
        ([*_70B, "--tp", "6"], "--tp 6 does not divide the 64 attention heads"),
        (["-m", "deepseek-v3", "-x", "h200", "--tp", "3"], "--tp 3 does not divide the 128 attention heads"),
        # 6 KV heads over 4 ranks (heads divide, KV heads do not): not max(1, 6 // 4) = 1 head per rank
        (["--layers", "32", "--kv-heads", "6", "--head-dim", "128", "--attention-heads", "48", "--params-b", "8",
          "--tp", "4", "--weights-gb", "16"], "--tp 4 does not split 6 KV heads evenly"),
        # 8 KV heads over 12 ranks: 12 % 8 != 0 (SGLang asserts tp % kv_heads == 0 when replicating)
        (["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--attention-heads", "96", "--params-b", "8",
          "--tp", "12", "--weights-gb", "16"], "--tp 12 does not split 8 KV heads evenly"),
    ],
)
def test_hostile_input_is_a_usage_error(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "tiers", *args]) == 64
    captured = capsys.readouterr()
    assert captured.out == ""
    error, hint = captured.err.splitlines()
    assert error.startswith("inferctl: error: ") and message in error, error
    assert hint.startswith("  hint: ")


def test_replicated_kv_heads_and_mla_over_many_ranks_still_plan(capsys: pytest.CaptureFixture[str]) -> None:
    # TP 16 over 8 KV heads replicates (16 % 8 == 0); DeepSeek-V3's latent over 16 ranks (128 % 16 == 0)
    assert _doc([*_70B, "--tp", "16"], capsys)["kv_bytes_per_token_per_rank"] == 2 * 2 * 80 * 1 * 128
    doc = _doc(["-m", "deepseek-v3", "-x", "h200", "--weight-dtype", "fp8", "--tp", "16"], capsys)
    assert doc["kv_bytes_per_token_per_rank"] == 70_272


def test_core_refuses_non_finite_inputs() -> None:
    shape = KvShape(80, 8, 128)
    compute = Compute(flops_per_s=float("nan"), params=70 * 10**9, layers=80, qk_dim=8192, v_dim=8192)
    with pytest.raises(ValueError, match="must be a finite number"):
        plan_tiers(shape, 2, TierInputs(tp=8, hbm_bytes_per_gpu=80 * 10**9, weights_bytes=140 * 10**9,
                                        compute=compute))


def test_a_multi_node_tp_without_ranks_per_host_warns(capsys: pytest.CaptureFixture[str]) -> None:
    # TP 16 over two 8-GPU nodes: SGLang splits each node's RAM over its 8 ranks (launch world size //
    # nodes); the default (--tp) split it 16 ways and halved the auto-sized budget without a word
    budget = (2000 * 10**9 - 10 * GIB) // 16
    doc = _doc(["-m", "llama-3.1-405b", "--tp", "16", "--host-ram-gb", "2000"], capsys, rc=1)
    assert [(f["check"], f["code"]) for f in doc["findings"]] == [("plan.tiers.ranks_per_host", "IC-PLN-003")]
    assert doc["host_auto"]["budget_per_rank"] == budget
    doc = _doc(["-m", "llama-3.1-405b", "--tp", "16", "--host-ram-gb", "2000", "--ranks-per-host", "8"], capsys)
    assert doc["findings"] == [] and doc["host_auto"]["budget_per_rank"] == budget * 2
