"""`inferctl plan roofline`: the KV read per step comes from plan kv's formula (core/sizing/kv.py) in
the --kv-dtype asked for, and every usage error is exit 64 with one line naming what to fix (+ a hint)."""

from __future__ import annotations

import json

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.sizing import presets


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_kv_read_per_step_is_plan_kvs_bytes_per_token(capsys: pytest.CaptureFixture[str]) -> None:
    per_token = _json(["plan", "kv", "-m", "llama-3.1-70b", "--dtype", "bf16"], capsys)["kv_bytes_per_token"]
    # two H200s: the 141 GB of bf16 weights alone exceed one (a memory-fit WARN, not exit 0)
    doc = _json(["plan", "roofline", "-m", "llama-3.1-70b", "-x", "h200", "--gpus", "2", "--context", "8192",
                 "--batch", "4"],
                capsys)
    assert doc["kv_bytes_per_step"] == 4 * 8192 * per_token
    assert doc["kv_dtype"] == "bf16"
    # bf16 by default, as before: 2 (K and V) x 2 bytes x layers x kv_heads x head_dim
    m = presets.MODELS["llama-3.1-70b"]
    assert per_token == 2 * 2 * m.layers * m.kv_heads * m.head_dim


@pytest.mark.parametrize(("kv_dtype", "ratio"), [("fp8", 0.5), ("fp32", 2.0), ("fp16", 1.0)])
def test_kv_dtype_is_honoured(kv_dtype: str, ratio: float, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "roofline", "-m", "llama-3.1-8b", "--context", "4096"]
    bf16 = _json(base, capsys)
    other = _json([*base, "--kv-dtype", kv_dtype], capsys)
    assert other["kv_bytes_per_step"] == bf16["kv_bytes_per_step"] * ratio
    assert other["kv_dtype"] == kv_dtype
    assert other["bytes_per_step"] == other["weights_bytes"] + other["kv_bytes_per_step"]


def test_a_custom_model_shape_gives_the_kv_read(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(["plan", "roofline", "--params-b", "70", "--gpus", "2", "--context", "100",
                 "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--kv-dtype", "fp8"], capsys)
    assert doc["kv_bytes_per_step"] == 100 * 2 * 1 * 80 * 8 * 128


def test_without_context_no_kv_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(["plan", "roofline", "--params-b", "70", "--gpus", "2"], capsys)
    assert doc["kv_bytes_per_step"] == 0 and doc["kv_dtype"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --model PRESET or --params-b N"),
        (["--params-b", "0"], "--params-b must be > 0, got 0"),
        (["-m", "gpt-17"], "unknown model preset 'gpt-17'"),
        (["-m", "llama-3.1-8b", "-x", "tpu-v9"], "unknown accelerator preset 'tpu-v9'"),
        (["-m", "llama-3.1-8b", "-x", ""], "give --accelerator or both --tflops and --tb-s"),
        (["-m", "llama-3.1-8b", "--gpus", "0"], "--gpus must be >= 1, got 0"),
        (["-m", "llama-3.1-8b", "--batch", "0"], "--batch must be >= 1, got 0"),
        (["-m", "llama-3.1-8b", "--context", "-1"], "--context must be >= 0, got -1"),
        (["-m", "llama-3.1-8b", "--tflops", "0"], "--tflops must be > 0, got 0"),
        (["-m", "llama-3.1-8b", "--tb-s", "-3"], "--tb-s must be > 0, got -3"),
        (["-m", "llama-3.1-8b", "--weight-dtype", "int3"], "unknown dtype 'int3'"),
        (["-m", "llama-3.1-8b", "--context", "8", "--kv-dtype", "fp4"], "unknown dtype 'fp4'"),
        (
            ["--params-b", "70", "--context", "100"],
            "--context (KV read per step) needs the model shape: missing --layers, --kv-heads, --head-dim",
        ),
        (
            ["--params-b", "70", "--context", "100", "--layers", "80"],
            "--context (KV read per step) needs the model shape: missing --kv-heads, --head-dim",
        ),
    ],
)
def test_usage_errors_are_one_line_and_exit_64(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "roofline", *args]) == 64
    captured = capsys.readouterr()
    assert captured.out == ""
    error, hint = captured.err.splitlines()  # exactly one error line and its hint, no traceback
    assert error.startswith("inferctl: error: ") and message in error, error
    assert hint.startswith("  hint: ") and len(hint) > len("  hint: ")


def test_a_malformed_option_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "roofline", "-m", "llama-3.1-8b", "--batch", "x"]) == 64
    err = capsys.readouterr().err
    assert "Invalid value for '--batch'" in err and "Traceback" not in err


def test_weights_that_do_not_fit_are_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 29, item 9f: 405B in bf16 on one H100 printed tokens/s and nothing else."""
    assert main(["plan", "roofline", "-m", "llama-3.1-405b", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (f,) = doc["findings"]
    assert (f["check"], f["status"]) == ("plan.roofline.memory_fit", "warn")
    assert "811.7 GB" in f["message"] and "1 x h100-sxm (80.0 GB)" in f["message"]
    assert "at least 11 GPUs" in f["remedy"]
    assert main(["plan", "roofline", "-m", "llama-3.1-405b"]) == 1
    assert "WARN: weights (811.7 GB) do not fit" in capsys.readouterr().out
    # the KV the batch reads counts too: 8B fits one H100 alone, not with 64 x 128k tokens of KV
    assert main(["plan", "roofline", "-m", "llama-3.1-8b", "--json"]) == 0
    capsys.readouterr()
    assert main(["plan", "roofline", "-m", "llama-3.1-8b", "--batch", "64", "--context", "131072", "--json"]) == 1
    assert "weights + KV of the batch" in json.loads(capsys.readouterr().out)["findings"][0]["message"]
    # no accelerator memory known (--tflops/--tb-s alone): nothing to judge
    assert main(["plan", "roofline", "-m", "llama-3.1-405b", "-x", "", "--tflops", "1000", "--tb-s", "3"]) == 0


def test_plan_kv_warns_when_the_weights_leave_no_kv_pool(capsys: pytest.CaptureFixture[str]) -> None:
    # DeepSeek-V3 in bf16 (1.34 TB) on 8 x 141 GB: the table said "KV budget 0 B" and exit 0
    args = ["plan", "kv", "-m", "deepseek-v3", "--hbm-gb", "1128", "--tp", "8"]
    assert main([*args, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (f,) = doc["findings"]
    assert (f["check"], f["code"], f["status"]) == ("plan.kv.memory_fit", "IC-PLN-006", "warn")
    assert "no KV pool is left" in f["message"] and "--mem-fraction" in f["remedy"]
    assert main(args) == 1
    assert "WARN: the weights (1,342.1 GB) fill all SGLang may use" in capsys.readouterr().out


def test_plan_kv_warns_when_one_full_context_request_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "kv", "-m", "llama-3.1-8b", "--context", "131072", "--hbm-gb", "24", "--json"]) == 1
    (f,) = json.loads(capsys.readouterr().out)["findings"]
    assert "fewer than one request of 131,072 tokens" in f["message"]
    # a plan that fits stays OK
    assert main(["plan", "kv", "-m", "llama-3.1-70b", "--hbm-gb", "640", "--tp", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []
