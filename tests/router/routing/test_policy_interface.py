"""The prefill policies behind one interface (core/routing/policies), the cache-aware score's units
(core/routing/units.py) and the documented tie-break among equally good holders."""

from __future__ import annotations

import random

import pytest

from infer_ctl.core.routing import units
from infer_ctl.core.routing.policies.base import PrefillPolicy, PrefillRequest
from infer_ctl.core.routing.policies.cache_aware import score
from infer_ctl.core.routing.policy import POLICIES, WorkerView, choose_prefill
from infer_ctl.router.config import policy_config, router_settings
from tests.router.conftest import new_prefix_index

A, B, C = "http://a:1", "http://b:1", "http://c:1"


def test_every_configurable_policy_has_one_module_behind_the_interface() -> None:
    assert set(POLICIES) == {"cache_aware", "round_robin", "power_of_two", "random"}
    views = [WorkerView(A), WorkerView(B, inflight=3)]
    for name, pol in POLICIES.items():
        p: PrefillPolicy = pol
        req = PrefillRequest(views, policy_config(router_settings(policy=name)), random.Random(1), seq=1, prefix_index=new_prefix_index())
        assert p.choose(req).url in (A, B)
    # the names the facade dispatches on are the policies' own reasons (round robin walks the counter)
    assert [choose_prefill(hashes=[], text_chars=0, workers=views, index=new_prefix_index(), now=0,
                           cfg=policy_config(router_settings(policy="round_robin")), rng=random.Random(0), seq=s).url
            for s in range(4)] == [A, B, A, B]


def test_the_score_is_tokens_left_to_compute_plus_the_queue_in_tokens() -> None:
    assert score(prompt_tokens=1000, cached_tokens=900, load=2, queue_cost_tokens=100) == 300
    assert score(prompt_tokens=1000, cached_tokens=600, load=0, queue_cost_tokens=100) == 400


def test_score_inputs_convert_each_reading_from_its_own_unit() -> None:
    got = units.score_inputs(
        event_tokens={A: 100, B: 10}, pending_blocks={A: 0, B: 4}, predicted_chars={C: 400},
        reported_prompt_tokens=None, text_chars=1000, block_chars=64, chars_per_token=4.0,
        queue_cost_tokens=None, footprint_chars=None)
    # B: 4 blocks of 64 characters in flight = 64 tokens, above its 10 from events; C: 400 characters = 100 tokens
    assert got.cached_tokens == {A: 100, B: 64, C: 100}
    assert got.prompt_tokens == 250  # 1000 characters at 4 per token, the workers' count unknown
    assert units.score_inputs(event_tokens={}, pending_blocks={}, predicted_chars={}, reported_prompt_tokens=321,
                              text_chars=1000, block_chars=64, chars_per_token=4.0, queue_cost_tokens=5.0,
                              footprint_chars={}).prompt_tokens == 321
    assert units.ratio(0.0) == units.ratio(None) == units.CHARS_PER_TOKEN and units.ratio(3.5) == 3.5


@pytest.mark.parametrize("exact", [False, True], ids=["predicted", "kv-events"])
def test_equally_good_holders_are_chosen_at_random_on_both_paths(exact: bool) -> None:
    """The documented tie-break: equal match, equal load -> either holder (the predicted path once sorted
    by a constant key, always taking the first candidate)."""
    ix = new_prefix_index(block_chars=64)
    text = "shared system prompt " * 40
    hs = ix.hashes(text)
    ix.insert(hs, A, now=0.0)
    ix.insert(hs, B, now=0.0)
    views = [WorkerView(A), WorkerView(B), WorkerView(C)]
    tokens = units.ScoreInputs({A: 200, B: 200, C: 0}, 210, None) if exact else None
    picks = {choose_prefill(hashes=hs, text_chars=len(text), workers=views, index=ix, now=1.0, cfg=policy_config(router_settings()),
                            rng=random.Random(s), tokens=tokens) for s in range(32)}
    assert {p.url for p in picks} == {A, B} and {p.reason for p in picks} == {"cache_hit"}
