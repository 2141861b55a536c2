"""KV page alignment (core/sizing/alignment.py) and its rows in `inferctl plan kv`: bytes per page per layer
per rank against the RDMA MTU and the 64-byte cache line, with the page sizes that would fill both."""

from __future__ import annotations

import json

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.sizing.alignment import kv_page_alignment, page_alignment
from infer_ctl.core.sizing.kv import KvShape

LLAMA_70B = KvShape(layers=80, kv_heads=8, head_dim=128)
LLAMA_8B = KvShape(layers=32, kv_heads=8, head_dim=128)
DEEPSEEK_V3 = KvShape(layers=61, kv_heads=128, head_dim=128, kv_lora_rank=512, rope_dim=64)


@pytest.mark.parametrize(
    ("shape", "dtype", "tp", "page", "row", "fills_mtu", "min_mtu", "packets", "last"),
    [
        # Llama-3.1-70B TP 8: one KV head per rank, K row = 1 x 128 x 2 B = 256 B; page 1 = 256 B: one
        # partial packet. 4096 / gcd(256, 4096) = 16 tokens fill one 4,096-byte packet exactly
        (LLAMA_70B, 2, 8, 1, 256, False, 16, 1, 256),
        (LLAMA_70B, 2, 8, 16, 256, True, 16, 1, 4096),
        (LLAMA_70B, 2, 8, 64, 256, True, 16, 4, 4096),  # 16,384 B = 4 packets
        # fp8 halves the row: 128 B; page 16 = 2,048 B, half a packet; needs 32
        (LLAMA_70B, 1, 8, 16, 128, False, 32, 1, 2048),
        # Llama-3.1-8B TP 1: 8 heads x 128 x 2 = 2,048 B per token row; page 1 half a packet, 2 fills it
        (LLAMA_8B, 2, 1, 1, 2048, False, 2, 1, 2048),
        # DeepSeek-V3 MLA: one latent row (512 + 64) x 2 B = 1,152 B = 2^7 x 9, on every rank;
        # 4096 / gcd(1152, 4096) = 4096 / 128 = 32; page 64 = 73,728 B = 18 packets exactly
        (DEEPSEEK_V3, 2, 8, 64, 1152, True, 32, 18, 4096),
        # page 16 = 18,432 B = 4.5 packets: the fifth carries 2,048 B
        (DEEPSEEK_V3, 2, 8, 16, 1152, False, 32, 5, 2048),
        # fp8 latent: 576 B = 2^6 x 9 -> 4096 / 64 = 64 tokens
        (DEEPSEEK_V3, 1, 8, 32, 576, False, 64, 5, 2048),
    ],
)
def test_kv_page_alignment(shape: KvShape, dtype: int, tp: int, page: int, row: int, fills_mtu: bool,
                           min_mtu: int, packets: int, last: int) -> None:
    a = kv_page_alignment(shape, dtype, tp=tp, page_size=page)
    assert a.row_bytes == row and a.page_bytes == page * row
    assert a.fills_mtu is fills_mtu and a.min_page_for_mtu == min_mtu
    assert a.packets == packets and a.last_packet_bytes == last
    assert a.fills_cache_lines, "every row here is a multiple of 64 B"
    assert a.aligned_page_sizes == tuple(p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256) if p % min_mtu == 0)


def test_a_row_that_misses_the_cache_line() -> None:
    # head_dim 40 (e.g. a small model), bf16, one head per rank: 80 B per row
    a = page_alignment(80, 1)
    assert not a.fills_cache_lines and a.min_page_for_cache_line == 64 // 16 == 4
    assert a.min_page_for_mtu == 4096 // 16 == 256 and a.min_aligned_page == 256
    assert a.aligned_page_sizes == (256,)
    assert page_alignment(80, 4).fills_cache_lines and not page_alignment(80, 4).fills_mtu


def test_a_smaller_mtu_needs_smaller_pages() -> None:
    assert kv_page_alignment(LLAMA_70B, 2, tp=8, page_size=4, mtu=1024).fills_mtu  # 4 x 256 = 1,024
    assert kv_page_alignment(LLAMA_70B, 2, tp=8, page_size=4).fills_mtu is False


def test_mha_row_is_k_only_and_tp_beyond_kv_heads_keeps_one_head() -> None:
    # SGLang keeps K and V in separate per-layer buffers: the page item is K (or V) alone
    assert LLAMA_70B.row_bytes(2, 1) == 8 * 128 * 2 == 2048
    assert LLAMA_70B.row_bytes(2, 16) == 1 * 128 * 2, "max(1, 8 // 16) = 1 head (replicated)"
    assert DEEPSEEK_V3.row_bytes(2, 8) == DEEPSEEK_V3.row_bytes(2, 1) == 1152


@pytest.mark.parametrize(("bad", "message"), [({"page_size": 0}, "--page-size must be > 0"),
                                              ({"mtu": 0}, "--mtu must be > 0")])
def test_rejects_impossible_inputs(bad: dict, message: str) -> None:  # type: ignore[type-arg]
    args = {"page_size": 1, "mtu": 4096} | bad
    with pytest.raises(ValueError, match=message):
        page_alignment(256, args["page_size"], mtu=args["mtu"])


def _kv(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    assert main(["plan", "kv", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_kv_shows_alignment(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _kv(["-m", "llama-3.1-70b", "--tp", "8"], capsys)
    a = doc["alignment"]
    # SGLang's default --page-size is 1: 256 B per page per layer per rank, not a whole packet
    assert a["page_size"] == 1 and a["page_bytes"] == 256 and a["aligned"] is False
    assert a["min_page_for_mtu"] == 16 and a["aligned_page_sizes"] == [16, 32, 64, 128, 256]
    assert doc["mtu_source"] == "default" and a["mtu"] == 4096
    assert doc["kv_bytes_per_token"] == 327_680, "the footprint is unchanged"


def test_plan_kv_takes_mtu_and_tp_from_the_profile(capsys: pytest.CaptureFixture[str]) -> None:
    # the reference profile: fabric.mtu 4096, models.target.tp 8
    doc = _kv(["-m", "llama-3.1-70b", "-p", "builtin:reference-h100-h200", "--page-size", "64"], capsys)
    assert doc["profile"] == "prod-a" and doc["tp"] == 8 and doc["mtu_source"] == "profile fabric.mtu"
    assert doc["alignment"]["page_bytes"] == 64 * 256 and doc["alignment"]["aligned"] is True
    doc = _kv(["-m", "llama-3.1-70b", "-p", "builtin:reference-h100-h200", "--mtu", "1024", "--tp", "1"], capsys)
    assert doc["mtu_source"] == "--mtu" and doc["alignment"]["mtu"] == 1024 and doc["tp"] == 1


def test_plan_kv_table_names_the_page_sizes(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line
    assert main(["plan", "kv", "-m", "deepseek-v3", "--tp", "8", "--page-size", "16"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "needs page size a multiple of 32" in out and "32, 64, 128, 256" in out


def test_plan_kv_bad_page_size_is_exit_64(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "kv", "-m", "llama-3.1-8b", "--page-size", "0"]) == 64
    error, hint = capsys.readouterr().err.splitlines()
    assert "--page-size must be > 0, got 0" in error and hint.startswith("  hint: ")


@pytest.mark.parametrize(("args", "message"), [
    # NaN / inf crashed in int() (exit 2, "internal error")
    (["--hbm-gb", "nan"], "--hbm-gb must be a finite number, got nan"),
    (["--hbm-gb", "80", "--weights-gb", "inf"], "--weights-gb must be a finite number, got inf"),
    # 64 attention heads over 3 ranks: SGLang asserts; plan kv showed a page of 8 // 3 = 2 KV heads
    (["--tp", "3"], "--tp 3 does not divide the 64 attention heads"),
    # an explicit 0 was the preset's value
    (["--kv-heads", "0"], "--kv-heads must be >= 1, got 0"),
])  # fmt: skip
def test_plan_kv_hostile_input_is_a_usage_error(args: list[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "kv", "-m", "llama-3.1-70b", *args]) == 64
    assert message in capsys.readouterr().err


def test_an_ethernet_mtu_is_refused_as_the_rdma_path_mtu(capsys: pytest.CaptureFixture[str]) -> None:
    # `plan kv --mtu 1500` computed packets for a path MTU no HCA runs (the profile refuses fabric.mtu 1500)
    assert main(["plan", "kv", "-m", "llama-3.1-8b", "--mtu", "1500"]) == 64
    err = capsys.readouterr().err
    assert "--mtu 1500 is not an RDMA path MTU (one of 256, 512, 1024, 2048, 4096)" in err and "netdev" in err


def test_plan_spec_gamma_zero_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    # it printed "break-even alpha 0.000000" for a configuration that drafts nothing
    assert main(["plan", "spec", "--gamma", "0"]) == 64
    assert "--gamma must be >= 1, got 0" in capsys.readouterr().err
