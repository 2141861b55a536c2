"""The KV tiers at their edges: hostile configuration, hostile media, a worker that cannot keep a
`keep: hbm` prefix in HBM, chains split across media, `router workers` / `router prefixes` showing
the tiers and `keep`, and `keep` in the replicas' records."""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console

from infer_ctl.cli.router_cmd import _keep_cell, _render_workers
from infer_ctl.core.routing.anchors import AnchorTable
from infer_ctl.core.routing.blocks import EventRejected, WorkerBlocks
from infer_ctl.core.routing.blocktable import BlockTable
from infer_ctl.core.routing.policy import WorkerView
from infer_ctl.core.routing.prefixes import TIER_GRACE_S
from infer_ctl.core.routing.tiers import TierWeights, weights_from
from infer_ctl.errors import UsageError
from infer_ctl.router.config import RouterConfig, router_settings
from infer_ctl.router.scaleout.follow import _record, _record_doc
from tests.router.conftest import new_prefix_registry, new_worker_blocks
from tests.router.kvindex.test_exact_index import Tok, worker_pages
from tests.router.kvindex.test_tiers import _prompt


@pytest.mark.parametrize(("field", "value"), [
    ("kv_bytes_per_token_per_rank", math.inf),  # was an OverflowError out of int()
    ("kv_bytes_per_token_per_rank", math.nan),  # was "cannot convert float NaN to integer"
    ("kv_bytes_per_token_per_rank", 0.5),  # was "must be >= 1, got 0"
    ("prefill_tokens_per_s", math.inf),  # was weights 0 silently (recompute 0)
    ("host_gb_s", math.inf),
    ("storage_gb_s", math.inf),
    ("host_gb_s", -1.0),
    ("prefill_tokens_per_s", 0.0),
])
def test_hostile_tier_numbers_are_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(UsageError) as exc:
        RouterConfig(settings=router_settings(tiers={field: value})).tier_weights()
    assert field in str(exc.value)


def test_ranks_per_node_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="ranks_per_node"):
        weights_from(kv_bytes_per_token_per_rank=1, prefill_tokens_per_s=1.0, host_gb_s=1.0, storage_gb_s=1.0,
                     ranks_per_node=0)


@pytest.mark.parametrize("kw", [
    {"kv_bytes_per_token_per_rank": 10**30},  # huge KV: loading is hopeless, the weight clamps to 0
    {"prefill_tokens_per_s": 1e-300},  # recompute all but infinite: loading always pays
    {"host_gb_s": 1e-300},  # a link that moves nothing
    {"prefill_tokens_per_s": 1e-320, "host_gb_s": 1e-320},  # inf load over inf recompute
])
def test_extreme_but_finite_numbers_clamp(kw: dict) -> None:
    w = RouterConfig(settings=router_settings(tiers={"storage_gb_s": 1e-300, **kw})).tier_weights()
    assert w is not None and 0.0 <= w.host <= 1.0 and 0.0 <= w.storage <= 1.0


def stored(hashes: list[int], parent: int | None, medium: str) -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": [0] * len(hashes), "block_size": 1, "medium": medium}


def test_an_unknown_medium_is_refused_and_removals_name_no_new_media() -> None:
    b = new_worker_blocks()
    b.apply([stored([1], None, "GPU"), stored([2], 1, "DISK"), stored([3], 2, "EXTERNAL")])
    with pytest.raises(EventRejected) as exc:  # was accepted: a set per name the publisher made up
        b.apply([stored([], None, f"X{i}") for i in range(100)])
    assert exc.value.kind == "malformed"
    b.apply([{"type": "BlockRemoved", "block_hashes": [], "medium": "CPU_PINNED"}])
    assert set(b.other) == {"DISK", "EXTERNAL"}  # was: an empty CPU_PINNED set made by a removal


def test_host_copy_and_device_copy_are_removed_each_on_its_own() -> None:
    b = new_worker_blocks()
    b.apply([stored([1, 2], None, "GPU"), stored([1, 2], None, "CPU_PINNED")])  # write-through backup
    b.apply([{"type": "BlockRemoved", "block_hashes": [2], "medium": "CPU_PINNED"}])
    assert b.holds(2) and b.snapshot() == {"GPU": 2, "CPU_PINNED": 1}
    b.apply([{"type": "BlockRemoved", "block_hashes": [1, 2]}])  # no medium: the device
    assert not b.holds(1) and b.snapshot() == {"GPU": 0, "CPU_PINNED": 1}


def test_keep_hbm_on_a_worker_that_cannot_keep_it_backs_off() -> None:
    """No priority eviction (or too small): the prefix leaves HBM right after every warm-up. The
    re-warms for it double their wait, up to the idle re-warm's interval, instead of one every
    TIER_GRACE_S for ever (was 120 in 600 s)."""
    url = "http://p0:1"
    reg = new_prefix_registry({"pin_via": "priority"}, rewarm_idle_s=300)  # no touches
    reg.register("a", "A" * 400, now=0, keep="hbm")
    warms, t = 0, 0.0
    while t < 600:
        for action in reg.plan_warmups([WorkerView(url)], t, {("a", url): "host"}):
            reg.warm_done(action, True, t)
            warms += 1
        t += 1.0
    # 0, then 5, 10, 20, 40, 80, 160, 300, 300 s apart: 8 warm-ups by 600 s
    assert warms <= 9, warms


def test_keep_hbm_backoff_ends_once_the_prefix_stayed() -> None:
    url = "http://p0:1"
    reg = new_prefix_registry({"pin_via": "priority"}, rewarm_idle_s=1000)  # no touches
    reg.register("a", "A" * 400, now=0, keep="hbm")
    rec = reg.records()[0]
    t = 0.0
    while t < 60:  # warmed at 0, then left HBM each time: re-warms at 5, 15, 35 s
        for action in reg.plan_warmups([WorkerView(url)], t, {("a", url): "host"}):
            reg.warm_done(action, True, t)
        t += 1.0
    p = rec.placements[url]
    assert p.left_streak == 3 and p.warmed_at == 35.0
    # it stayed in HBM for the cap (the idle re-warm's interval) after the last warm-up: the streak ends
    (idle,) = reg.plan_warmups([WorkerView(url)], 1035.0, {("a", url): "hbm"})
    assert p.left_streak == 0
    reg.warm_done(idle, True, 1035.0)
    assert reg.plan_warmups([WorkerView(url)], 1035.0 + TIER_GRACE_S / 2, {("a", url): "host"}) == []
    (again,) = reg.plan_warmups([WorkerView(url)], 1035.0 + TIER_GRACE_S, {("a", url): "host"})
    assert again.pin  # the next leave waits only the grace again


def _table_and_pages() -> tuple[AnchorTable, list[int], list[int], int, int]:
    text, ids, hs, fk = _prompt()
    table = AnchorTable(1)
    table.build(hs, fk, text, Tok())
    return table, worker_pages(ids, 1, False), hs, fk, table.depth(hs)


def _held(device: list[int], host: list[int]) -> WorkerBlocks:
    b = new_worker_blocks()
    b.device.update(device)
    b.other["CPU_PINNED"] = BlockTable(host)
    return b


def test_a_host_chain_past_a_gap_does_not_continue_the_device_prefix() -> None:
    """SGLang loads host pages back only right after the device match: host pages past a gap (pages
    no tier holds) are no continuation. The binary search jumped the gap (246 of 401, as if whole)."""
    table, pages, hs, fk, d = _table_and_pages()
    w = TierWeights(host=0.5).of
    dev = table.cached_units(hs, fk, d, _held(pages[:100], []))
    whole = table.cached_units(hs, fk, d, _held(pages[:100], pages[100:]), w)
    assert whole > dev  # the contiguous continuation counts
    assert table.cached_units(hs, fk, d, _held(pages[:100], pages[150:]), w) == dev


def test_a_device_chain_that_starts_on_the_host_is_not_an_hbm_hit() -> None:
    """Host pages first, device pages after them (no SGLang state: it evicts device leaves first): the
    whole-prompt shortcut read the last page on the device as the whole prompt in HBM (401)."""
    table, pages, hs, fk, d = _table_and_pages()
    held = _held(pages[100:], pages[:100])
    assert table.cached_units(hs, fk, d, held) == 0
    assert table.cached_units(hs, fk, d, held, TierWeights(host=0.5).of) <= len(pages) // 2


def test_router_workers_line_names_the_tiers() -> None:
    """`router workers` said "N blocks": a worker whose pages sit in host memory looked as warm as one
    holding them in HBM."""
    out = io.StringIO()
    w = {"url": "http://p0:1", "role": "prefill", "index": "exact", "index_reason": "in sync", "healthy": True, "circuit_breaker": "closed",
         "inflight": 0, "requests": 0, "errors": 0, "restarts": 0,
         "kv_blocks": 500, "kv_media": {"GPU": 200, "CPU_PINNED": 300}}
    _render_workers(Console(file=out, width=200), {"workers": [w], "speculative": {}, "pairs": []})
    assert "http://p0:1: index exact (in sync), 500 blocks (200 HBM, 300 host)" in out.getvalue()
    out = io.StringIO()
    w |= {"kv_blocks": 3, "kv_media": {"GPU": 3}}  # HBM only: the line as before
    _render_workers(Console(file=out, width=200), {"workers": [w], "speculative": {}, "pairs": []})
    assert "index exact (in sync), 3 blocks\n" in out.getvalue()


def test_router_prefixes_shows_where_keep_replicas_sit_and_the_snapshot_carries_it() -> None:
    url, other = "http://p0:1", "http://p1:1"
    reg = new_prefix_registry(rewarm_idle_s=300)
    reg.register("a", "A" * 400, now=0, keep="hbm", replicas=2)
    for action in reg.plan_warmups([WorkerView(url), WorkerView(other)], 0):
        reg.warm_done(action, True, 0)
    reg.plan_warmups([WorkerView(url), WorkerView(other)], 1, {("a", url): "hbm", ("a", other): "host"})
    doc = reg.records()[0].as_dict(1)
    assert {r["worker"]: r["tier"] for r in doc["replicas"]} == {url: "hbm", other: "host"}
    assert _keep_cell(doc) == "hbm 1/2"
    # the processes' leader snapshot carries the tier and the backoff to a follower
    back = _record(json.loads(json.dumps(_record_doc(reg.records()[0]))))
    assert back.keep == "hbm" and back.placements[other].tier == "host"


def test_keep_through_an_older_replica_record_and_a_changed_registration() -> None:
    reg = new_prefix_registry()
    reg.register("a", "A" * 400, now=0, keep="hbm")
    doc = reg.export_name("a", 0.0)
    doc["settings"] = doc["settings"][:4] if doc["settings"] else [None, 1, False, "text"]  # before `keep`
    for v in doc["versions"]:
        del v["keep"]
    other = new_prefix_registry()
    other.load_name("a", doc, 0.0)
    assert other.records()[0].keep is None
    reg.register("a", "A" * 400, now=1, keep="host")  # same text: the setting changes in place
    assert reg.records()[0].keep == "host" and reg.records()[0].version == 1
    with pytest.raises(ValueError, match="keep"):
        other.load_name("a", {"name": "a", "settings": None, "versions": [
            {**reg.export_name("a", 0.0)["versions"][0], "keep": "ssd"}]}, 0.0)


def test_a_replica_record_with_keep_host_and_pin_is_refused_and_dropping_keep_clears_the_tier() -> None:
    reg = new_prefix_registry()
    reg.register("a", "A" * 400, now=0, keep="hbm")
    bad = reg.export_name("a", 0.0)
    bad["versions"][0] |= {"keep": "host", "pin": True}  # register and the admin API refuse this pair
    with pytest.raises(ValueError, match="keep host conflicts with pin"):
        new_prefix_registry().load_name("a", bad, 0.0)
    url = "http://p0:1"
    for action in reg.plan_warmups([WorkerView(url)], 0, {("a", url): "host"}):
        reg.warm_done(action, True, 0)
    assert reg.records()[0].placements[url].tier == "host"
    reg.register("a", "A" * 400, now=1)  # same text, no keep any more
    reg.plan_warmups([WorkerView(url)], 2, {})
    assert reg.records()[0].as_dict(2)["replicas"][0]["tier"] is None
