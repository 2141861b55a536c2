"""`launch.kv_page`: `profile validate` and `launch --dry-run` warn when a KV page does not fill whole
MTU-size packets (PD servers) or cache lines, naming the page sizes that would, from the model preset or
the model's config.json; they say when they cannot judge; a prefill/decode page-size mismatch makes the
profile invalid (exit 64)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.sglang.kv_page import kv_page_findings, shape_from_config
from infer_ctl.profile import load_profile
from infer_ctl.profile.load import validate_profile_data

LLAMA_70B_CONFIG = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                    "hidden_size": 8192, "torch_dtype": "bfloat16"}  # fmt: skip


def _data(model: dict[str, Any], page: str | None = "64", **extra: Any) -> dict[str, Any]:
    pages = ["--page-size", page] if page else []
    return {
        "name": "pages",
        "nodes": [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
                  {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]}],
        "models": {"target": model},
        "sglang": {"extra_args": {"prefill": [*pages, *extra.get("prefill", [])],
                                  "decode": [*pages, *extra.get("decode", [])]}},
    }  # fmt: skip


def _found(data: dict[str, Any], config: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    return [(f.status.value, f.subject, f.message) for f in kv_page_findings(validate_profile_data(data), config=config)]


def test_the_shipped_profiles_pages_are_aligned() -> None:
    for name in ("local", "reference-h100-h200", "single-node-collocated"):
        assert kv_page_findings(load_profile(f"builtin:{name}")) == [], name


def test_an_unset_page_is_sglangs_1_and_the_aligned_sizes_are_named() -> None:
    (f,) = _found(_data({"path": "/m", "preset": "llama-3.1-70b", "tp": 8}, page=None))
    assert f[0:2] == ("warn", "prefill+decode")
    assert f[2].startswith("KV page 1 x 256 B = 256 B (one layer's K or V row on one of TP 8 ranks, preset "
                           "llama-3.1-70b, KV dtype auto (taken as bf16, the usual checkpoint dtype)) ends 256 B "
                           "into its last 4,096-byte MTU packet")
    assert f[2].endswith("(--page-size unset: SGLang 0.5.23 uses 1 on CUDA); page sizes that fill whole packets "
                         "and cache lines: 16, 32, 64, 128, 256")


@pytest.mark.parametrize(("model", "page", "kv", "needed"), [
    ({"preset": "llama-3.1-70b", "tp": 8}, "16", "fp8_e4m3", "32, 64, 128, 256"),  # 128 B rows
    ({"preset": "deepseek-v3", "tp": 8}, "16", None, "32, 64, 128, 256"),  # MLA latent 1,152 B, any TP
    ({"preset": "deepseek-v3", "tp": 8}, "32", "fp8_e4m3", "64, 128, 256"),  # 576 B
])  # fmt: skip
def test_misaligned_pages_warn_with_the_sizes_that_fit(model: dict[str, Any], page: str, kv: str | None,
                                                        needed: str) -> None:
    dtype = ["--kv-cache-dtype", kv] if kv else []
    (f,) = _found(_data({"path": "/m", **model}, page=page, prefill=dtype, decode=dtype))
    assert f[0] == "warn" and f[2].endswith(f"page sizes that fill whole packets and cache lines: {needed}"), f
    assert _found(_data({"path": "/m", **model}, page=needed.split(",")[0], prefill=dtype, decode=dtype)) == []


def test_the_mtu_is_each_nodes_and_a_collocated_server_is_judged_on_cache_lines_only() -> None:
    data = _data({"path": "/m", "preset": "llama-3.1-70b", "tp": 8}, page="4")
    data["nodes"][1]["overrides"] = {"fabric": {"mtu": 1024}}  # 4 x 256 B = 1,024 B: fills its packets
    found = _found(data)
    assert [(s, sub) for s, sub, _ in found] == [("warn", "prefill")]
    assert "ends 1,024 B into its last 4,096-byte MTU packet" in found[0][2]
    plain = {"name": "one", "collocated": True, "nodes": [{"name": "box", "host": "10.0.0.5", "roles": ["prefill"]}],
             "models": {"target": {"path": "/m"}}}  # fmt: skip
    odd = {"num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 6, "head_dim": 8,
           "torch_dtype": "float16"}  # 6 x 8 x 2 B = 96 B: no MTU check without a PD transfer  # fmt: skip
    (f,) = _found(plain, config=odd)
    assert f[:2] == ("warn", "collocated") and "ends mid 64-byte cache line (whole lines from page size 2 on)" in f[2]
    assert "MTU" not in f[2] and f[2].endswith("page sizes that fill cache lines: 2, 4, 8, 16, 32, 64, 128, 256")


def test_it_says_when_it_cannot_judge() -> None:
    (f,) = _found(_data({"path": "/models/x"}))
    assert f == ("skip", "kv page", "KV page alignment not judged: models.target.preset is not set and "
                 "/models/x/config.json is not readable here")
    (f,) = _found(_data({"path": "/m", "preset": "llama-9"}))
    assert f[0] == "skip" and "unknown model preset 'llama-9'" in f[2]
    nvfp4 = ["--kv-cache-dtype", "nvfp4"]
    found = _found(_data({"path": "/m", "preset": "llama-3.1-70b"}, prefill=nvfp4, decode=nvfp4))
    assert [s for s, _, _ in found] == ["skip", "skip"] and "sub-byte" in found[0][2]


def test_shape_from_a_config_json() -> None:
    shape = shape_from_config(LLAMA_70B_CONFIG)
    assert shape is not None and (shape.layers, shape.kv_heads, shape.head_dim) == (80, 8, 128)
    mla = shape_from_config({"num_hidden_layers": 61, "num_attention_heads": 128, "kv_lora_rank": 512,
                             "qk_rope_head_dim": 64, "v_head_dim": 128})  # fmt: skip
    assert mla is not None and mla.is_mla and mla.row_bytes(2, 8) == 1152
    assert shape_from_config({"model_type": "x"}) is None


def test_profile_validate_and_dry_run_read_a_local_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "Llama-3.1-70B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_70B_CONFIG))
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps(_data({"path": str(model), "tp": 8}, page="8")))
    assert main(["profile", "validate", "-p", str(path), "--json"]) == 1  # a warning
    doc = json.loads(capsys.readouterr().out)
    (f,) = [f for f in doc["findings"] if f["check"] == "launch.kv_page"]
    assert f["status"] == "warn" and f"{model}/config.json, KV dtype auto (the model's dtype)" in f["message"]
    assert f["details"]["aligned_page_sizes"] == [16, 32, 64, 128, 256] and f["code"] == "IC-LCH-020"
    assert main(["launch", "-p", str(path), "--dry-run", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [g["check"] for g in doc["findings"]] == ["launch.kv_page"]
    path.write_text(json.dumps(_data({"path": str(model), "tp": 8}, page="16")))
    assert main(["profile", "validate", "-p", str(path)]) == 0


def test_a_page_size_mismatch_is_an_invalid_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _data({"path": "/m", "preset": "llama-3.1-70b", "tp": 8}, page=None,
                 prefill=["--page-size", "16"], decode=["--page-size", "64"])
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps(data))
    assert main(["profile", "validate", "-p", str(path), "--json"]) == 64
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 64 and [(f["check"], f["status"]) for f in doc["findings"]][:2] == [
        ("profile.schema", "ok"), ("launch.pd_agreement", "fail")]
    assert "--page-size is 64 here but 16 on pf-01-prefill" in doc["findings"][1]["message"]


@pytest.mark.parametrize("page", ["-8", "0", "abc"])
def test_a_page_size_that_is_not_a_positive_integer_is_a_fail_not_a_crash(
        page: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # -8 crashed profile validate and launch --dry-run (page_alignment's ValueError, exit 2 "internal
    # error"); 0 and "abc" were judged as SGLang's default page 1 and only warned about
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps(_data({"path": "/m", "preset": "llama-3.1-70b", "tp": 8}, page=page)))
    assert main(["profile", "validate", "-p", str(path), "--json"]) == 64
    doc = json.loads(capsys.readouterr().out)
    fails = [f for f in doc["findings"] if f["status"] == "fail"]
    assert {f["subject"] for f in fails} == {"pf-01-prefill", "dc-01-decode"}
    assert all(f["check"] == "launch.kv_page" and f["code"] == "IC-LCH-020" for f in fails)
    assert f"--page-size {page} is not a positive integer" in fails[0]["message"]
    assert not [f for f in doc["findings"] if f["check"] == "launch.kv_page" and f["status"] == "warn"]
    assert main(["launch", "-p", str(path), "--dry-run", "--json"]) == 2  # a FAIL: launch refuses it too
    assert main(["launch", "-p", str(path), "--json"]) == 2
