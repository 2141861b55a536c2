"""`plan kv` defaults --mem-fraction to SGLang 0.5.23's own rule (sglang/srt/arg_groups/memory_hook.py,
handle_gpu_memory_settings) and --tp to the profile's models.target.tp, and says which defaults it used
(issue 29, item 9b: it assumed 100% of HBM for weights + KV, 185 requests where SGLang holds fewer)."""

from __future__ import annotations

import json

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.sizing.sglang_memory import sglang_mem_fraction_static

_MIB = 1 << 20


@pytest.mark.parametrize(
    ("mib", "tp", "mla", "reserved", "fraction"),
    [
        # H100 80 GB (nvidia-smi 81559 MiB), TP 1: chunk 8192 -> 512 + 8192 x 1.5 + 1/8 GiB
        # + decode graphs 256 x 2 + 58 prefill graph sizes x 8
        (81559, 1, False, 512 + 12288 + 128 + 512 + 58 * 8, 0.830),
        # TP 8: max_bs 512 and 8/8 GiB
        (81559, 8, False, 512 + 12288 + 1024 + 1024 + 58 * 8, 0.812),
        # MLA: a flat 1.5 GiB for prefill graphs instead of 8 MiB per size
        (81559, 8, True, 512 + 12288 + 1024 + 1024 + 1536, 0.799),
        # L40S 48 GB (46068 MiB): chunk 4096, max_bs 32, 50 prefill sizes up to 4096, no 10 GiB floor
        (46068, 1, False, 512 + 6144 + 128 + 64 + 50 * 8, 0.843),
        # H200 141 GB, TP 8 (143771 MiB)
        (143771, 8, False, 512 + 12288 + 1024 + 1024 + 58 * 8, 0.893),
        # a small GPU: chunk 2048, max_bs 8; 42 prefill sizes
        (16384, 1, False, 512 + 3072 + 128 + 16 + 42 * 8, 0.752),
    ],
)
def test_the_rule_matches_sglangs_arithmetic(mib: int, tp: int, mla: bool, reserved: float,
                                             fraction: float) -> None:
    r = sglang_mem_fraction_static(mib * _MIB, tp, mla=mla)
    assert r.reserved_mib == pytest.approx(reserved)
    assert r.fraction == fraction == round((mib - reserved) / mib, 3)


def test_llama2_prefill_graphs_stop_at_4096() -> None:
    plain = sglang_mem_fraction_static(81559 * _MIB, 1)
    llama2 = sglang_mem_fraction_static(81559 * _MIB, 1, model="llama-2-70b")
    assert plain.reserved_mib - llama2.reserved_mib == (58 - 50) * 8


def _kv(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(["plan", "kv", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_kv_defaults_to_sglangs_fraction_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _kv(capsys, "-m", "llama-3.1-70b", "--hbm-gb", "640", "--tp", "8")
    rule = sglang_mem_fraction_static(80e9, 8)
    assert doc["mem_fraction"] == rule.fraction < 1
    assert doc["mem_fraction_source"].startswith("SGLang 0.5.23 default for 74.5 GiB per GPU, TP 8")
    assert doc["kv_budget_bytes"] == int(640e9 * rule.fraction) - doc["weights_bytes"]
    full = _kv(capsys, "-m", "llama-3.1-70b", "--hbm-gb", "640", "--tp", "8", "--mem-fraction", "1")
    assert (full["mem_fraction"], full["mem_fraction_source"]) == (1, "--mem-fraction")
    assert doc["max_concurrent"] < full["max_concurrent"]
    main(["plan", "kv", "-m", "llama-3.1-70b", "--hbm-gb", "640", "--tp", "8"])
    out = capsys.readouterr().out
    assert "defaults used: TP 8 (--tp), MTU 4,096 (default), mem fraction 0.799 (SGLang 0.5.23 default" in out


def test_plan_kv_takes_tp_from_the_profile(capsys: pytest.CaptureFixture[str]) -> None:
    from infer_ctl.resources import builtin_profile_path

    path = builtin_profile_path("local")
    assert path is not None
    from infer_ctl.profile.load import load_profile

    tp = load_profile(path).models.target.tp  # type: ignore[union-attr]
    doc = _kv(capsys, "-m", "llama-3.1-8b", "--hbm-gb", "80", "-p", str(path))
    assert (doc["tp"], doc["tp_source"]) == (tp, "profile models.target.tp")
    assert doc["mem_fraction"] == sglang_mem_fraction_static(80e9 / tp, tp).fraction
    assert _kv(capsys, "-m", "llama-3.1-8b")["tp_source"] == "default"
