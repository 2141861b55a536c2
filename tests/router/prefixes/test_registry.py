"""Named-prefix lifecycle: placement on K replicas, warm/re-warm, TTL expiry, supersede, stats (pure)."""

from __future__ import annotations

import pytest

from infer_ctl.core.routing.policy import WorkerView
from infer_ctl.core.routing.prefixes import PrefixRegistry, PrefixState
from tests.router.conftest import new_prefix_registry

W = [WorkerView(f"http://p{i}:1") for i in range(3)]


def warm_all(reg: PrefixRegistry, now: float, workers=W) -> list:
    actions = reg.plan_warmups(workers, now)
    for a in actions:
        reg.warm_done(a, True, now)
    return actions


def test_warms_on_k_distinct_replicas_and_spreads_prefixes_across_workers() -> None:
    reg = new_prefix_registry()
    reg.register("a", "AAA", now=0, replicas=2)
    reg.register("b", "BBB", now=0, replicas=2)
    actions = warm_all(reg, 0)
    by_prefix: dict[str, set[str]] = {}
    for a in actions:
        by_prefix.setdefault(a.name, set()).add(a.worker)
    assert all(len(v) == 2 for v in by_prefix.values())
    # 4 placements over 3 workers: nobody holds both prefixes twice over while another holds none
    held = [sum(w.url in v for v in by_prefix.values()) for w in W]
    assert sorted(held) == [1, 1, 2]
    assert reg.plan_warmups(W, 1) == []  # warm and recent: nothing to do
    assert set(reg.active("a").warm_replicas()) == by_prefix["a"]


def test_replicas_capped_by_available_workers_and_replaced_when_one_goes_away() -> None:
    reg = new_prefix_registry()
    reg.register("a", "AAA", now=0, replicas=5)
    assert len(warm_all(reg, 0)) == 3
    down = [W[0], WorkerView(W[1].url, available=False), W[2]]
    assert reg.plan_warmups(down, 1) == []
    assert W[1].url not in reg.active("a").placements
    extra = WorkerView("http://p9:1")
    assert [a.worker for a in reg.plan_warmups([*down, extra], 2)] == [extra.url]


def test_rewarm_after_idle_and_after_observed_eviction() -> None:
    reg = new_prefix_registry(rewarm_idle_s=100)
    rec = reg.register("a", "A" * 400, now=0, replicas=1)
    (first,) = warm_all(reg, 0)
    reg.record_response(rec, first.worker, predicted_tokens=100, prompt_tokens=120, cached_tokens=100,
                        prefix_tokens=100, now=50)
    assert reg.plan_warmups(W, 120) == []  # the hit at t=50 keeps it fresh until 150
    assert [a.worker for a in reg.plan_warmups(W, 151)] == [first.worker]
    reg.warm_done(reg.plan_warmups(W, 151)[0] if reg.plan_warmups(W, 151) else first, True, 151)
    reg.record_response(rec, first.worker, predicted_tokens=100, prompt_tokens=120, cached_tokens=3,
                        prefix_tokens=100, now=152)  # miss: evicted behind our back
    assert [a.worker for a in reg.plan_warmups(W, 153)] == [first.worker]
    assert rec.stats.requests == 2 and rec.stats.hits == 1 and rec.stats.hit_rate == 0.5
    assert rec.stats.actual_cached_tokens == 103 and rec.stats.predicted_tokens == 200


def test_failed_warmups_retry_then_move_elsewhere() -> None:
    reg = new_prefix_registry(max_warm_failures=2)
    reg.register("a", "AAA", now=0, replicas=1)
    for t in range(2):
        (a,) = reg.plan_warmups(W, t)
        reg.warm_done(a, False, t)
    (again,) = reg.plan_warmups(W, 3)
    assert again.worker != a.worker
    assert reg.active("a").stats.warm_failures == 2


def test_ttl_expiry_stops_warming_and_affinity() -> None:
    reg = new_prefix_registry(forget_after_s=50)
    reg.register("a", "AAA", now=0, ttl_s=10, replicas=1)
    warm_all(reg, 0)
    assert reg.match("AAA and more") is not None
    assert [r.name for r in reg.tick(10)] == ["a"]
    assert reg.match("AAA and more") is None and reg.active("a") is None
    assert reg.plan_warmups(W, 11) == []
    assert reg.records()[0].state is PrefixState.EXPIRED
    reg.tick(61)
    assert reg.records() == []  # forgotten after forget_after_s


def test_new_text_supersedes_and_same_text_renews() -> None:
    reg = new_prefix_registry()
    v1 = reg.register("policy", "rules v1", now=0, ttl_s=10)
    assert reg.register("policy", "rules v1", now=5, ttl_s=10) is v1 and v1.expires_at == 15
    v2 = reg.register("policy", "rules v2", now=6)
    assert v1.state is PrefixState.SUPERSEDED and v2.version == 2 and reg.active("policy") is v2
    assert reg.match("rules v1 ...") is None and reg.match("rules v2 ...") is v2
    assert {a.version for a in reg.plan_warmups(W, 7)} == {2}


def test_longest_active_prefix_matches_and_operator_verbs() -> None:
    reg = new_prefix_registry()
    reg.register("short", "You are", now=0)
    reg.register("long", "You are a support bot", now=0)
    assert reg.match("You are a support bot. Hi").name == "long"
    with pytest.raises(KeyError):
        reg.expire("missing", 1)
    with pytest.raises(ValueError):
        reg.register("empty", "", now=0)
    warm_all(reg, 0)
    reg.request_warm("long", 1)
    assert {a.name for a in reg.plan_warmups(W, 1)} == {"long"}


@pytest.mark.parametrize(("registered", "prompt", "matches"), [
    ("Policy text.\n", "Policy text. User: hi", True),  # a prompt file's final newline is not required
    ("Policy text.\n\n  ", "Policy text.\nUser: hi", True),
    ("Policy text.\n", "Policy text.\nUser: hi", True),
    ("Policy text.", "Policy tex", False),
    ("   ", "   x", True),  # an all-whitespace prefix keeps its text as the key
])
def test_trailing_whitespace_of_a_prefix_is_not_required(registered: str, prompt: str, matches: bool) -> None:
    reg = new_prefix_registry()
    reg.register("p", registered, now=0)
    assert (reg.match(prompt) is not None) is matches


def test_hit_rate_counts_only_responses_that_report_cached_tokens() -> None:
    """OpenAI responses carry cached_tokens only with --enable-cache-report: unreported is not a miss."""
    reg = new_prefix_registry()
    rec = reg.register("p", "x" * 400, now=0, replicas=1)
    a = warm_all(reg, 0)[0]
    reg.warm_done(a, True, 0, prompt_tokens=100)
    for cached in (None, None, 100, 10):
        reg.record_response(rec, a.worker, predicted_tokens=100, prompt_tokens=120, cached_tokens=cached,
                            prefix_tokens=100, now=1)
    st = rec.stats.as_dict()
    assert (st["requests"], st["reported"], st["hits"], st["hit_rate"]) == (4, 2, 1, 0.5)


def test_replicas_beyond_workers_names_the_count_and_the_kind() -> None:
    from infer_ctl.core.routing.prefixes import replicas_beyond_workers

    assert replicas_beyond_workers(2, ["prefill", "prefill"]) is None
    assert replicas_beyond_workers(5, []) is None  # no worker yet: the prefix waits for them
    why = replicas_beyond_workers(5, ["prefill"])
    assert why is not None and why.startswith("replicas 5 exceeds the 1 prefill worker this router has")
    assert "4 replicas would never be warm" in why and "add prefill workers first" in why
    assert "the 2 workers" in (replicas_beyond_workers(3, ["mixed", "mixed"]) or "")
