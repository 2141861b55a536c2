"""The router knows KV tiers: tier weights from the load-time model, the weighted score
of a prompt's cached chain (HBM, then host), and the policy's preference HBM hit > host hit > cold."""

from __future__ import annotations

import random

import pytest

from infer_ctl.core.kvevents.sim_tokenizer import BuiltinTokenizer
from infer_ctl.core.routing.anchors import AnchorTable, full_key
from infer_ctl.core.routing.blocks import WorkerBlocks
from infer_ctl.core.routing.blocktable import BlockTable
from infer_ctl.core.routing.index import block_hashes as text_chain
from infer_ctl.core.routing.policy import WorkerView, choose_prefill
from infer_ctl.core.routing.tiers import BLIND, TierWeights, weights_from
from infer_ctl.core.routing.units import ScoreInputs
from infer_ctl.core.sizing.tiers import hit_weight
from infer_ctl.errors import UsageError
from infer_ctl.router.config import RouterConfig, policy_config, router_settings
from tests.router.conftest import new_prefix_index, new_worker_blocks
from tests.router.kvindex.test_exact_index import Tok, worker_pages

TOK = BuiltinTokenizer()


# ---- weights ---------------------------------------------------------------------------------------
def test_hit_weight_is_the_saved_share_of_the_recompute_clamped() -> None:
    assert hit_weight(0.25e-6, 1e-6) == pytest.approx(0.75)
    assert hit_weight(0.0, 1e-6) == 1.0
    assert hit_weight(3e-6, 1e-6) == 0.0  # slower than recomputing: worth nothing, never negative
    assert hit_weight(1e-6, 0.0) == 0.0


def test_weights_from_the_load_time_model_exact_values() -> None:
    # 40,960 B/token/rank over 50 GB/s = 0.8192 us; 1 / 28,000 tokens/s = 35.714 us
    w = weights_from(kv_bytes_per_token_per_rank=40_960, prefill_tokens_per_s=28_000, host_gb_s=50)
    assert w.host == pytest.approx(1 - 40_960 / 50e9 * 28_000, rel=1e-12)  # 0.9770624
    assert w.storage == 0.0  # no storage bandwidth known
    # a slow host link: 40,960 / 2e9 = 20.48 us of 35.714 -> 0.42656
    w = weights_from(kv_bytes_per_token_per_rank=40_960, prefill_tokens_per_s=28_000, host_gb_s=2)
    assert w.host == pytest.approx(1 - 40_960 / 2e9 * 28_000, rel=1e-12)
    # storage: the node reads 8 ranks' copies at 100 GB/s, then the host hop at 50 GB/s
    w = weights_from(kv_bytes_per_token_per_rank=40_960, prefill_tokens_per_s=28_000, host_gb_s=50,
                     storage_gb_s=100, ranks_per_node=8)
    assert w.storage == pytest.approx(1 - (8 * 40_960 / 100e9 + 40_960 / 50e9) * 28_000, rel=1e-12)
    assert w.of("GPU") == 1.0 and w.of("CPU_PINNED") == w.host and w.of("DISK") == w.storage
    # a host link slower than recomputing: 0
    assert weights_from(kv_bytes_per_token_per_rank=40_960, prefill_tokens_per_s=28_000, host_gb_s=0.5).host == 0.0


def test_router_config_weights_and_errors_name_the_field() -> None:
    assert RouterConfig().tier_weights() == weights_from(kv_bytes_per_token_per_rank=40_960,
                                                         prefill_tokens_per_s=28_000, host_gb_s=50)
    assert RouterConfig(settings=router_settings(tiers={"mode": "blind"})).tier_weights() is BLIND and BLIND.blind
    assert RouterConfig(settings=router_settings(tiers={"mode": "device"})).tier_weights() is None
    with pytest.raises(UsageError, match=r"router\.tiers\.mode: 'tiered' is not one of aware, blind, device"):
        RouterConfig(settings=router_settings(tiers={"mode": "tiered"})).validate()
    with pytest.raises(UsageError, match=r"router\.tiers\.prefill_tokens_per_s: .*greater than 0 \(got -1\)"):
        RouterConfig(settings=router_settings(tiers={"prefill_tokens_per_s": -1})).validate()
    with pytest.raises(UsageError, match=r"router\.tiers\.host_gb_s: .*greater than 0 \(got 0\)"):
        RouterConfig(settings=router_settings(tiers={"host_gb_s": 0})).tier_weights()
    with pytest.raises(ValueError, match="host"):
        TierWeights(host=1.5)


def test_profile_tiers_reach_the_router_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from infer_ctl.profile.router import RouterSettings

    rs = RouterSettings.model_validate({"tiers": {"mode": "blind", "host_gb_s": 25}})
    assert (rs.tiers.mode, rs.tiers.host_gb_s) == ("blind", 25)
    with pytest.raises(ValueError, match="host_gb_s"):
        RouterSettings.model_validate({"tiers": {"host_gb_s": 0}})
    with pytest.raises(ValueError, match="mode"):
        RouterSettings.model_validate({"tiers": {"mode": "tiered"}})


# ---- the weighted score ----------------------------------------------------------------------------
def _prompt() -> tuple[str, list[int], list[int], int]:
    rng = random.Random(5)
    text = "System: " + " ".join(rng.choice(["alpha", "beta", "gamma", "cache", "tier"]) for _ in range(400))
    ids = TOK.encode(text)
    hs = text_chain(text, 64)
    return text, ids, hs, full_key(hs, text, 64)


def _holders(pages: list[int]) -> dict[str, WorkerBlocks]:
    """hbm: the whole prompt in HBM (and on host, write-through); split: the first half in HBM, the rest
    only on host (evicted from HBM); host: all of it only on host; cold: nothing."""
    half = len(pages) // 2
    hbm, split, host, cold = new_worker_blocks(), new_worker_blocks(), new_worker_blocks(), new_worker_blocks()
    hbm.device.update(pages)
    hbm.other["CPU_PINNED"] = BlockTable(pages)
    split.device.update(pages[:half])
    split.other["CPU_PINNED"] = BlockTable(pages)
    host.other["CPU_PINNED"] = BlockTable(pages)
    return {"hbm": hbm, "split": split, "host": host, "cold": cold}


def test_score_is_device_plus_weighted_host_continuation() -> None:
    text, ids, hs, fk = _prompt()
    table = AnchorTable(1)
    table.build(hs, fk, text, Tok())
    pages = worker_pages(ids, 1, False)
    held = _holders(pages)
    d = table.depth(hs)
    w = TierWeights(host=0.5)
    full = table.cached_units(hs, fk, d, held["hbm"])
    assert full == len(ids) - 1  # an identical prompt: SGLang matches n - 1 tokens
    dev_half = table.cached_units(hs, fk, d, held["split"])  # without weights: HBM only (as before)
    assert 0 < dev_half <= len(pages) // 2
    assert table.cached_units(hs, fk, d, held["host"]) == 0
    assert table.cached_units(hs, fk, d, held["hbm"], w.of) == full  # HBM counts 1 whatever the host holds
    assert table.cached_units(hs, fk, d, held["split"], w.of) == int(dev_half + 0.5 * (full - dev_half))
    assert table.cached_units(hs, fk, d, held["host"], w.of) == int(0.5 * full)
    assert table.cached_units(hs, fk, d, held["cold"], w.of) == 0
    # tier-blind: every tier as HBM
    assert {k: table.cached_units(hs, fk, d, b, BLIND.of) for k, b in held.items()} == {
        "hbm": full, "split": full, "host": full, "cold": 0}
    # a lower medium weighted lower than the host continues the chain after it
    three = new_worker_blocks()
    three.device.update(pages[:100])
    three.other["CPU_PINNED"] = BlockTable(pages[:300])
    three.other["DISK"] = BlockTable(pages)
    tw = TierWeights(host=0.5, storage=0.25)
    dev = table.cached_units(hs, fk, d, three)
    mid = table.cached_units(hs, fk, d, three, TierWeights(host=1.0, storage=0.0).of)
    assert table.cached_units(hs, fk, d, three, tw.of) == int(dev + 0.5 * (mid - dev) + 0.25 * (full - mid))


def test_policy_prefers_hbm_hit_then_host_hit_then_least_loaded() -> None:
    text, ids, hs, fk = _prompt()
    table = AnchorTable(1)
    table.build(hs, fk, text, Tok())
    held = _holders(worker_pages(ids, 1, False))
    d = table.depth(hs)
    w = weights_from(kv_bytes_per_token_per_rank=40_960, prefill_tokens_per_s=28_000, host_gb_s=2)  # 0.43

    def pick(names: list[str], weight: TierWeights | None, loads: dict[str, int] | None = None) -> tuple[str, str]:
        cached = {n: table.cached_units(hs, fk, d, held[n], weight.of if weight else None) for n in names}
        views = [WorkerView(n, inflight=(loads or {}).get(n, 0)) for n in names]
        c = choose_prefill(hashes=hs, text_chars=len(text), workers=views, index=new_prefix_index(), now=0,
                           cfg=policy_config(router_settings()), rng=random.Random(1), tokens=ScoreInputs(cached, len(ids), 200), footprint=dict.fromkeys(names, 0))
        return c.url, c.reason

    for seed_order in (["hbm", "host", "cold"], ["cold", "host", "hbm"]):
        assert pick(seed_order, w) == ("hbm", "cache_hit")
    assert pick(["host", "cold"], w) == ("host", "cache_hit")
    assert pick(["cold", "split", "host"], w) == ("split", "cache_hit")
    # HBM-only scoring (the router before tier weights) cannot tell the host holder from a cold worker
    assert pick(["host", "cold"], None)[1] == "fallback"
    # the HBM holder is worth a queue the host holder is not: 1 request x 200 units < (1 - w) x prompt
    assert len(ids) * (1 - w.host) > 200
    assert pick(["hbm", "host"], w, {"hbm": 1})[0] == "hbm"
    # tier-blind: the host holder ties with the HBM holder and wins on load
    assert pick(["hbm", "host"], BLIND, {"hbm": 1}) == ("host", "cache_hit")
    # nobody holds it: the least loaded
    assert pick(["cold"], w)[1] == "fallback"
