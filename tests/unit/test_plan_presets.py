"""Preset listing and the presets' numbers (issue 29, items 9e and 9g): an MLA model is listed with the
latent its KV math uses, and the L40S preset carries its datasheet numbers."""

from __future__ import annotations

import json

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.sizing import presets


def test_the_listing_shows_mla_dims_not_128_kv_heads(capsys: pytest.CaptureFixture[str]) -> None:
    main(["plan", "kv", "--list-presets"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("deepseek-v3"))
    assert "MLA: 1 latent of 512 + 64 rope = 576 values" in row
    assert "128" not in row


def test_the_deepseek_preset_math_is_mla(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "kv", "-m", "deepseek-v3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # one latent of kv_lora_rank + qk_rope_head_dim per token per layer, bf16, no K/V pair, no heads
    assert doc["kv_bytes_per_token"] == 2 * 61 * (512 + 64)
    assert (doc["kv_lora_rank"], doc["rope_dim"]) == (512, 64)


def test_l40s_preset_is_the_datasheet() -> None:
    a = presets.accelerator_preset("L40S")
    assert (a.fp16_tflops, a.hbm_tb_s, a.hbm_gb) == (362.05, 0.864, 48)


def test_roofline_takes_the_l40s(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "roofline", "-m", "llama-3.1-8b", "-x", "l40s", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["accelerator"] == "l40s"
    assert doc["bandwidth_bytes_s"] == pytest.approx(0.864e12)


def test_a_short_accelerator_name_suggests_the_preset_it_begins() -> None:
    # "h100" is closer by edit distance to "h200", but it is the start of "h100-sxm"
    with pytest.raises(ValueError, match=r"did you mean 'h100-sxm'\?"):
        presets.accelerator_preset("h100")
    with pytest.raises(ValueError, match=r"did you mean 'h200'\?"):
        presets.accelerator_preset("h20")
