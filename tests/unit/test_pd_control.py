"""The PD balance controller's decision (core/pd/control.py): dwell, hysteresis, cool-down, never the last
server of a pool, a stale view, a fatal rebuild not retried until a restart
is seen, capacity back; and the window it reads."""

from __future__ import annotations

from infer_ctl.core.pd.control import (
    Counters,
    Decision,
    Observation,
    Server,
    Settings,
    State,
    Window,
    decide,
    switched,
    window,
)

S = Settings(ttft_slo_s=1.0, itl_slo_s=0.05, hysteresis=0.25, sustain_s=10, cooldown_s=30, min_requests=5,
             stale_s=5)


def _fleet(p: int = 2, d: int = 2, **down: bool) -> tuple[Server, ...]:
    out = [Server(f"http://p{i}", "prefill", load=i) for i in range(p)]
    out += [Server(f"http://d{i}", "decode", load=i) for i in range(d)]
    return tuple(Server(s.url, s.role, available=False, healthy=False) if down.get(s.url[7:]) else s for s in out)


def _obs(ttft: float, itl: float, servers: tuple[Server, ...] | None = None, stale: float | None = 1.0,
         n: int = 20) -> Observation:
    return Observation(servers or _fleet(), Window(n, ttft, itl, 100.0, 400.0), stale)


DECODE_SHORT = (0.2, 0.10)   # TTFT 0.2 of its objective, ITL twice its objective
PREFILL_SHORT = (3.0, 0.02)


def test_a_shift_switches_only_after_the_dwell_the_least_loaded_donor() -> None:
    st = State()
    assert decide(_obs(*DECODE_SHORT), st, S, 0.0).action == "hold"
    assert decide(_obs(*DECODE_SHORT), st, S, 9.0).action == "hold"
    d = decide(_obs(*DECODE_SHORT), st, S, 10.0)
    assert (d.action, d.server, d.from_role, d.to_role) == ("switch", "http://p0", "prefill", "decode")


def test_a_burst_shorter_than_the_dwell_switches_nothing() -> None:
    st = State()
    decide(_obs(*DECODE_SHORT), st, S, 0.0)
    assert decide(_obs(0.3, 0.03), st, S, 5.0).action == "none"  # back to normal: the dwell starts over
    assert decide(_obs(*DECODE_SHORT), st, S, 12.0).action == "hold"


def test_hysteresis_a_split_that_is_about_right_is_left_alone() -> None:
    st = State()
    # decode misses its objective (1.2) but the prefill pool with one server less would be at 1.0 x 2 = 2.0
    for t in (0.0, 20.0, 40.0):
        assert decide(_obs(0.5, 0.06), st, S, t).action == "none"
    # and a pool that meets its objective is never short, however idle the other
    assert decide(_obs(0.01, 0.049), st, S, 60.0).action == "none"


def test_cool_down_after_a_switch_done_or_failed() -> None:
    st = State()
    decide(_obs(*DECODE_SHORT), st, S, 0.0)
    d = decide(_obs(*DECODE_SHORT), st, S, 10.0)
    switched(st, d, 10.0, ok=False, fatal=False)
    decide(_obs(*DECODE_SHORT), st, S, 11.0)
    held = decide(_obs(*DECODE_SHORT), st, S, 25.0)
    assert held.action == "hold" and "cooling down" in held.reason
    assert decide(_obs(*DECODE_SHORT), st, S, 41.0).action == "switch"


def test_never_the_last_server_of_a_pool() -> None:
    st = State()
    one_prefill = _fleet(p=1, d=3)
    for t in (0.0, 20.0, 60.0):
        assert decide(_obs(*DECODE_SHORT, servers=one_prefill), st, S, t).action == "none"
    # a pool of two with one down is a pool of one
    st = State(covers={"http://p1": "x"})  # (its cover is not the point: nothing to give back here)
    st.covers.clear()
    s = Settings(**{**S.__dict__, "cover_failures": False})
    for t in (0.0, 20.0):
        assert decide(_obs(*DECODE_SHORT, servers=_fleet(p1=True)), st, s, t).action == "none"


def test_nothing_is_switched_on_a_stale_view() -> None:
    st = State()
    decide(_obs(*DECODE_SHORT), st, S, 0.0)
    for stale in (None, 6.0):
        d = decide(_obs(*DECODE_SHORT, stale=stale), st, S, 20.0)
        assert d.action == "stale" and d.server is None
    # and a stale view does not count toward the dwell
    assert decide(_obs(*DECODE_SHORT), st, S, 21.0).action == "hold"


def test_too_few_requests_decide_nothing() -> None:
    assert decide(_obs(*DECODE_SHORT, n=2), State(), S, 0.0).reason.startswith("too few")


def test_a_fatal_rebuild_is_never_retried() -> None:
    st = State()
    decide(_obs(*DECODE_SHORT), st, S, 0.0)
    d = decide(_obs(*DECODE_SHORT), st, S, 10.0)
    assert d.server == "http://p0"
    switched(st, d, 10.0, ok=False, fatal=True)
    assert st.fatal == ["http://p0"]
    # later rounds: p0 is out of every choice, so the prefill pool has one server left and keeps it
    for t in (50.0, 70.0, 100.0):
        got = decide(_obs(*DECODE_SHORT, servers=_fleet(p=2, d=2)), st, S, t)
        assert got.server != "http://p0" and got.action == "none"


def test_prefill_short_moves_a_decode() -> None:
    st = State()
    decide(_obs(*PREFILL_SHORT), st, S, 0.0)
    d = decide(_obs(*PREFILL_SHORT), st, S, 10.0)
    assert (d.action, d.from_role, d.to_role, d.server) == ("switch", "decode", "prefill", "http://d0")


def test_capacity_back_a_dead_decode_is_covered_at_once_and_given_back() -> None:
    st = State()
    dead = _fleet(p=2, d=2, d1=True)
    d = decide(_obs(0.2, 0.04, servers=dead), st, S, 0.0)  # no dwell: the dead one's load is on the rest
    assert (d.action, d.server, d.to_role, d.covers) == ("cover", "http://p0", "decode", "http://d1")
    switched(st, d, 0.0, ok=True, fatal=False)
    assert st.covers == {"http://d1": "http://p0"}
    moved = tuple(Server(s.url, "decode") if s.url == "http://p0" else s for s in dead)
    assert decide(_obs(0.2, 0.04, servers=moved), st, S, 1.0).action != "cover"  # covered once
    back = tuple(Server(s.url, s.role) for s in moved)
    r = decide(_obs(0.2, 0.04, servers=back), st, S, 5.0)
    assert (r.action, r.server, r.to_role) == ("restore", "http://p0", "prefill")
    switched(st, r, 5.0, ok=True, fatal=False)
    assert st.covers == {}


def test_no_cover_without_headroom() -> None:
    # the prefill pool with one server less would miss its objective: it keeps its servers
    d = decide(_obs(0.6, 0.04, servers=_fleet(p=2, d=2, d1=True)), State(), S, 0.0)
    assert d.action != "cover"


def test_window_is_the_difference_and_starts_over_after_a_router_restart() -> None:
    a = Counters(ttft_sum=10.0, ttft_count=10, itl_sum=1.0, itl_count=100, prompt_tokens=5000, requests=10)
    b = Counters(ttft_sum=16.0, ttft_count=20, itl_sum=3.0, itl_count=300, prompt_tokens=6000, requests=20)
    w = window(a, b)
    assert (w.streamed, w.ttft_mean, w.itl_mean, w.prompt_tokens, w.output_chunks) == (10, 0.6, 0.01, 100.0, 21.0)
    assert window(b, a).streamed == 10  # went back: a fresh router, its counters from zero
    assert window(None, a).ttft_mean == 1.0


def test_decision_as_dict_names_the_move() -> None:
    d = Decision("switch", "why", "http://p0", "prefill", "decode", {"prefill": 0.2, "decode": 2.0})
    assert d.as_dict() == {"decision": "switch", "reason": "why", "pressures": {"prefill": 0.2, "decode": 2.0},
                           "server": "http://p0", "from_role": "prefill", "to_role": "decode"}


def test_capacity_back_for_a_server_drained_by_remediation_and_kept_while_it_is_gone() -> None:
    st = State()
    drained = tuple(Server(s.url, s.role, available=False, draining=True) if s.url == "http://p1" else s
                    for s in _fleet())
    d = decide(_obs(0.2, 0.01, servers=drained), st, S, 0.0)
    assert (d.action, d.to_role, d.covers, d.server) == ("cover", "prefill", "http://p1", "http://d0")
    switched(st, d, 0.0, ok=True, fatal=False)
    gone = tuple(s for s in drained if s.url != "http://p1")  # removed while it relaunches
    assert decide(_obs(0.2, 0.01, servers=gone), st, S, 1.0).action != "restore"
    assert st.covers == {"http://p1": "http://d0"}


def test_ttft_counts_against_the_pool_with_the_longer_queue() -> None:
    # long outputs: the decodes' queues are long, TTFT is high (requests wait for a decode slot), ITL fine
    queued = tuple(Server(s.url, s.role, queued=8 if s.role == "decode" else 0) for s in _fleet())
    st = State()
    d = decide(_obs(2.5, 0.02, servers=queued), st, S, 0.0)
    assert (d.action, d.to_role) == ("hold", "decode") and d.pressures["decode"] == 2.5
    assert decide(_obs(2.5, 0.02, servers=queued), st, S, 10.0).action == "switch"
    # the same TTFT with the prefills' queues long is the prefill pool's
    queued = tuple(Server(s.url, s.role, queued=8 if s.role == "prefill" else 0) for s in _fleet())
    d = decide(_obs(2.5, 0.02, servers=queued), State(), S, 0.0)
    assert d.to_role == "prefill" and d.pressures["prefill"] == 2.5


def _fatal_p0() -> State:
    st = State()
    decide(_obs(*DECODE_SHORT), st, S, 0.0)
    d = decide(_obs(*DECODE_SHORT), st, S, 10.0)
    switched(st, d, 10.0, ok=False, fatal=True)
    assert st.fatal == ["http://p0"]
    return st


def _with(url: str, **kw: object) -> tuple[Server, ...]:
    return tuple(Server(s.url, s.role, **kw) if s.url == url else s for s in _fleet())  # type: ignore[arg-type]


def test_a_fatal_server_relaunched_and_healthy_again_is_chosen_again() -> None:
    st = _fatal_p0()
    # the relaunch: down at the router (or gone from it), then healthy, undrained, in a role
    decide(_obs(*DECODE_SHORT, servers=_with("http://p0", available=False, healthy=False)), st, S, 50.0)
    assert st.fatal == ["http://p0"]
    decide(_obs(*DECODE_SHORT, servers=_with("http://p0", available=False, healthy=True, draining=True)), st, S, 60.0)
    assert st.fatal == ["http://p0"]  # back but still drained: not in service yet
    decide(_obs(*DECODE_SHORT), st, S, 70.0)
    assert st.fatal == [] and st.fatal_down == []
    decide(_obs(*DECODE_SHORT), st, S, 80.0)
    assert decide(_obs(*DECODE_SHORT), st, S, 100.0).server == "http://p0"


def test_a_fatal_server_gone_from_the_router_and_back_is_cleared() -> None:
    st = _fatal_p0()
    gone = tuple(s for s in _fleet() if s.url != "http://p0")
    decide(_obs(*DECODE_SHORT, servers=gone), st, S, 50.0)
    decide(_obs(*DECODE_SHORT), st, S, 60.0)
    assert st.fatal == []


def test_a_fatal_server_never_seen_down_stays_fatal() -> None:
    # a preflight refusal with safe_to_restore false leaves the server undrained and healthy: without a
    # restart seen in between it is the same broken engine, and it is not retried
    st = _fatal_p0()
    for t in (50.0, 70.0, 100.0):
        decide(_obs(*DECODE_SHORT), st, S, t)
        decide(_obs(*DECODE_SHORT, servers=_with("http://p0", available=False, healthy=True, draining=True)), st, S, t)
    assert st.fatal == ["http://p0"]
    assert decide(_obs(*DECODE_SHORT), st, S, 200.0).server != "http://p0"
