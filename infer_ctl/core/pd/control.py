"""Which server moves between the prefill and decode pools, and when (docs/pd-control.md). Pure: the
observations come in (launch/pd_control.py reads them from the router), one decision goes out.

Each pool is judged by the objective it serves: the prefill pool by TTFT, the decode pool by ITL, as
pressures (the window's mean over its objective; 1.0 is the objective met exactly). A server moves from
the donor pool to the short one only when

- the short pool's pressure is at least `trigger` (it misses its objective: moving costs a drain and a
  rebuild, so a split that meets both objectives is left alone),
- it exceeds the donor's pressure *as it would be with one server less* (pressure x n/(n-1), the load
  spread over one fewer) by the factor 1 + hysteresis: the move must not just make the donor the short
  pool, which would move it back next round (the flapping a fixed threshold gives),
- the donor keeps `min_servers` available servers (never the last server of a pool),
- this has held for `sustain_s` (the minimum dwell: a burst is not a shift of the mix),
- the last switch is `cooldown_s` ago (its effect shows in the window first),
- and the router's view is fresh (every worker's load polled within `stale_s`): a switch on a stale view
  can take the wrong server or the last healthy one.

A server whose rebuild failed (SGLang: `safe_to_restore: false`, restart required) is not chosen again
(`fatal`): SGLang leaves it half torn down, and a retry cannot succeed. Only a restart mends it, so it
leaves `fatal` once a restart is seen: down at the router (unhealthy, or gone from it) after it was marked,
then healthy, undrained and in a role again. Healthy alone is no evidence: a refusal at the preflight
leaves the broken engine undrained and answering health checks.

Capacity back (issue 30 item 4): a pool with a server down (unhealthy, or drained by `audit --remediate`) may borrow
a server of the other pool at once (no dwell: the dead server's load is already on the rest) when the
other pool has headroom (its pressure with one server less stays under `trigger`), and gives it back when
the dead one is healthy again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ROLES = ("prefill", "decode")


def other(role: str) -> str:
    return "decode" if role == "prefill" else "prefill"


@dataclass(frozen=True)
class Settings:
    ttft_slo_s: float = 2.0
    itl_slo_s: float = 0.05
    trigger: float = 1.0
    hysteresis: float = 0.25
    sustain_s: float = 10.0
    cooldown_s: float = 30.0
    min_requests: int = 10
    stale_s: float = 10.0
    min_servers: int = 1
    cover_failures: bool = True
    #: requests waiting per server that count as a pressure of 1.0
    queue_target: float = 4.0


@dataclass(frozen=True)
class Server:
    url: str
    role: str
    #: healthy, its breaker closed, not draining: takes requests now
    available: bool = True
    healthy: bool = True
    draining: bool = False
    #: requests on it: the router's in flight plus what the worker reports queued
    load: int = 0
    #: requests the worker reports waiting (/v1/loads num_waiting_reqs: a decode's include those waiting for a
    #: KV slot)
    queued: int = 0


@dataclass(frozen=True)
class Counters:
    """The router's cumulative counters (GET /admin/pd): streamed requests' TTFT and ITL, prompt tokens."""

    ttft_sum: float = 0.0
    ttft_count: int = 0
    itl_sum: float = 0.0
    itl_count: int = 0
    prompt_tokens: int = 0
    requests: int = 0


@dataclass(frozen=True)
class Window:
    """What happened between two rounds."""

    streamed: int = 0
    ttft_mean: float | None = None
    itl_mean: float | None = None
    #: the request mix: prompt tokens per request, streamed chunks per streamed request (a chunk is a
    #: token unless the server batches its stream: the router counts chunks, not tokens)
    prompt_tokens: float | None = None
    output_chunks: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        r = lambda v: None if v is None else round(v, 4)  # noqa: E731
        return {"streamed": self.streamed, "ttft_mean_s": r(self.ttft_mean), "itl_mean_s": r(self.itl_mean),
                "prompt_tokens": r(self.prompt_tokens), "output_chunks": r(self.output_chunks)}


def window(prev: Counters | None, cur: Counters) -> Window:
    """The window between two readings; a counter that went back (the router restarted) starts over."""
    if prev is None or cur.ttft_count < prev.ttft_count or cur.itl_count < prev.itl_count or \
            cur.requests < prev.requests or cur.prompt_tokens < prev.prompt_tokens:
        prev = Counters()
    n = cur.ttft_count - prev.ttft_count
    gaps = cur.itl_count - prev.itl_count
    reqs = cur.requests - prev.requests
    return Window(
        streamed=n,
        ttft_mean=(cur.ttft_sum - prev.ttft_sum) / n if n > 0 else None,
        itl_mean=(cur.itl_sum - prev.itl_sum) / gaps if gaps > 0 else None,
        prompt_tokens=(cur.prompt_tokens - prev.prompt_tokens) / reqs if reqs > 0 else None,
        output_chunks=(n + gaps) / n if n > 0 else None,
    )


@dataclass(frozen=True)
class Observation:
    servers: tuple[Server, ...]
    window: Window
    #: seconds since the oldest of the servers' load polls at the router; None: unknown (never polled)
    stale_s: float | None


@dataclass
class State:
    """What the controller remembers between rounds (a state file: a restarted controller keeps it)."""

    #: the role the short pool needs ("decode": a prefill should become a decode), and since when
    want: str | None = None
    since: float | None = None
    last_switch_at: float | None = None
    #: servers whose rebuild failed: not switched again until they are restarted
    fatal: list[str] = field(default_factory=list)
    #: capacity back: a down server's URL -> the server borrowed from the other pool to cover it
    covers: dict[str, str] = field(default_factory=dict)
    #: the pools' queues per server, smoothed over rounds (one sample is one instant)
    queue_ema: dict[str, float] = field(default_factory=dict)
    #: the fatal servers seen down (unhealthy or gone from the router) since they were marked: restarting
    fatal_down: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Decision:
    #: none (nothing to do), stale, hold (shifted, dwell or cool-down not over), switch (move `server`),
    #: cover (a dead server's pool borrows `server`), restore (give a borrowed `server` back)
    action: str
    reason: str
    server: str | None = None
    from_role: str | None = None
    to_role: str | None = None
    pressures: dict[str, float | None] = field(default_factory=dict)
    #: cover / restore: the down server the move is for
    covers: str | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"decision": self.action, "reason": self.reason,
                                  "pressures": {k: None if v is None else round(v, 3) for k, v in self.pressures.items()}}
        for k in ("server", "from_role", "to_role", "covers"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out


def queues(obs: Observation) -> dict[str, float]:
    """Requests the workers report waiting, per available server of each pool."""
    out = {}
    for role in ROLES:
        pool = [x for x in obs.servers if x.role == role and x.available]
        out[role] = sum(x.queued for x in pool) / len(pool) if pool else 0.0
    return out


def pressures(w: Window, s: Settings, queue: dict[str, float] | None = None) -> dict[str, float | None]:
    """The pools' pressures, None where the window holds too few streamed requests.

    Prefill: TTFT over its objective; decode: ITL over its objective; each at least its queue per server
    over `queue_target` (`queue`: the controller's smoothed queues). A request that waits for a decode slot
    waits before its first token too (SGLang's prefill holds its KV until the decode preallocates), so TTFT
    counts against the pool with the longer queue: a long-output mix shows as TTFT with the decodes'
    queues long, not as ITL (a decode's step time barely grows with its batch while it reads weights)."""
    if w.streamed < s.min_requests:
        return {"prefill": None, "decode": None}
    q = queue or {"prefill": 0.0, "decode": 0.0}
    ttft = None if w.ttft_mean is None else w.ttft_mean / s.ttft_slo_s
    itl = None if w.itl_mean is None else w.itl_mean / s.itl_slo_s
    ttft_to = "decode" if q["decode"] > q["prefill"] else "prefill"
    out: dict[str, float | None] = {}
    for role, own in (("prefill", None), ("decode", itl)):
        parts = [v for v in (own, ttft if ttft_to == role else None, q[role] / s.queue_target) if v is not None]
        out[role] = max(parts)
    return out


def _pool(obs: Observation, role: str, st: State) -> list[Server]:
    return [x for x in obs.servers if x.role == role and x.available and x.url not in st.fatal]


def _least_loaded(servers: list[Server]) -> Server:
    return min(servers, key=lambda x: (x.load, x.url))


def projected(p: float, n: int) -> float:
    """A pool's pressure with one server less: its load over n - 1 (infinite for its last server)."""
    return p * n / (n - 1) if n > 1 else math.inf


def recovered(obs: Observation, st: State) -> list[str]:
    """The fatal servers a restart mended (module docstring), taken out of `fatal`; notes the ones seen
    down. A fatal server still drained or unhealthy stays fatal, whatever it went through."""
    by_url = {x.url: x for x in obs.servers}
    out = []
    for url in list(st.fatal):
        x = by_url.get(url)
        if x is None or not x.healthy:
            if url not in st.fatal_down:
                st.fatal_down.append(url)
        elif url in st.fatal_down and not x.draining and x.role in ROLES:
            st.fatal.remove(url)
            st.fatal_down.remove(url)
            out.append(url)
    # a server taken out of `fatal` by hand leaves no mark behind
    st.fatal_down[:] = [u for u in st.fatal_down if u in st.fatal]
    return out


def decide(obs: Observation, st: State, s: Settings, now: float) -> Decision:
    """The round's decision; updates the dwell in `st` (the caller records a switch with `switched`) and
    takes restarted servers out of `fatal` (`recovered`)."""
    recovered(obs, st)
    for role, q in queues(obs).items():
        st.queue_ema[role] = q if role not in st.queue_ema else (st.queue_ema[role] + q) / 2
    p = pressures(obs.window, s, st.queue_ema)
    if obs.stale_s is None or obs.stale_s > s.stale_s:
        st.want = st.since = None  # a stale view does not count toward the dwell either
        age = "never polled" if obs.stale_s is None else f"{obs.stale_s:.1f} s old"
        return Decision("stale", f"the router's view is stale (a worker's load {age}, limit {s.stale_s:g} s): "
                                 "nothing is switched", pressures=p)
    cover = _capacity(obs, st, s, p)
    if cover is not None:
        return cover
    moves = []
    for to in ROLES:
        donor = _pool(obs, other(to), st)
        pt, pd = p[to], p[other(to)]
        if pt is None or pd is None or len(donor) <= s.min_servers:
            continue
        after = projected(pd, len(donor))
        if pt >= s.trigger and pt >= (1 + s.hysteresis) * after:
            moves.append((pt / after if after else math.inf, to, donor, after))
    if not moves:
        if None in p.values():  # no evidence either way: the dwell neither advances nor starts over
            return Decision("none", "too few streamed requests in the window", pressures=p)
        st.want = st.since = None
        return Decision("none", "the split fits the mix (no pool misses its objective by more than the other "
                                "would without a server)", pressures=p)
    _, to, donor, after = max(moves, key=lambda m: m[0])
    if st.want != to:
        st.want, st.since = to, now
    assert st.since is not None
    mix = _mix(obs.window)
    if now - st.since < s.sustain_s:
        return Decision("hold", f"{to} pool short ({mix}) for {now - st.since:.0f} s of the {s.sustain_s:g} s dwell",
                        to_role=to, from_role=other(to), pressures=p)
    if st.last_switch_at is not None and now - st.last_switch_at < s.cooldown_s:
        left = s.cooldown_s - (now - st.last_switch_at)
        return Decision("hold", f"{to} pool short ({mix}); cooling down, {left:.0f} s left", to_role=to,
                        from_role=other(to), pressures=p)
    pick = _least_loaded(donor)
    pt = p[to]
    return Decision("switch", f"{to} pool short for {now - st.since:.0f} s ({mix}): pressure {pt:.2f} against the "
                              f"{other(to)} pool's {after:.2f} with one server less", server=pick.url,
                    from_role=other(to), to_role=to, pressures=p)


def _mix(w: Window) -> str:
    parts = []
    if w.prompt_tokens is not None:
        parts.append(f"{w.prompt_tokens:.0f} prompt tokens")
    if w.output_chunks is not None:
        parts.append(f"{w.output_chunks:.0f} output chunks")
    return " / ".join(parts) + " per request" if parts else "mix unknown"


def _capacity(obs: Observation, st: State, s: Settings, p: dict[str, float | None]) -> Decision | None:
    """Capacity back: cover a down server's pool with one of the other pool, and give it back once the
    down server is healthy again (module docstring). None: nothing to do here this round."""
    by_url = {x.url: x for x in obs.servers}
    for dead, cover in list(st.covers.items()):
        d, c = by_url.get(dead), by_url.get(cover)
        if c is None:  # the borrowed server is gone from the router: nothing to give back
            del st.covers[dead]
            continue
        # a down server removed from the router may be relaunching: the cover stays until it is back
        if d is not None and d.healthy and d.available:
            return Decision("restore", f"{dead} is back: {cover} returns to the {other(c.role)} pool", server=cover,
                            from_role=c.role, to_role=other(c.role), pressures=p, covers=dead)
    if not s.cover_failures:
        return None
    covered = set(st.covers)
    for d in obs.servers:
        # down: unhealthy, or drained by someone else (`audit --remediate`): this controller's own drains
        # end within its round, and a server it left drained after a failed rebuild is in `fatal`
        if (d.healthy and not d.draining) or d.url in covered or d.role not in ROLES or d.url in st.fatal:
            continue
        donor = _pool(obs, other(d.role), st)
        if len(donor) <= s.min_servers:
            continue
        pd = p[other(d.role)]
        # headroom: the donor pool meets its objective with one server less (unknown pressure: an idle pool)
        if pd is not None and projected(pd, len(donor)) >= s.trigger:
            continue
        pick = _least_loaded(donor)
        return Decision("cover", f"{d.url} ({d.role}) is down: {pick.url} covers the {d.role} pool until it is back",
                        server=pick.url, from_role=pick.role, to_role=d.role, pressures=p, covers=d.url)
    return None


def switched(st: State, d: Decision, now: float, *, ok: bool, fatal: bool) -> None:
    """Record a switch (or cover, restore) that was tried: the cool-down starts, done or failed (a failure
    retried every round is a storm of drains), the dwell starts over; a fatal rebuild is not retried (until a restart
    is seen: `recovered`)."""
    st.last_switch_at = now
    st.want = st.since = None
    if fatal and d.server is not None and d.server not in st.fatal:
        st.fatal.append(d.server)
        if d.server in st.fatal_down:  # a restart counts from the failure on
            st.fatal_down.remove(d.server)
    if ok and d.action == "cover" and d.covers is not None and d.server is not None:
        st.covers[d.covers] = d.server
    if d.action == "restore" and d.covers is not None and (ok or fatal):
        st.covers.pop(d.covers, None)
