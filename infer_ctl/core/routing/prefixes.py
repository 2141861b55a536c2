"""Named shared prefixes (system prompts) as fleet-level objects: register, warm on K replicas, spread,
re-warm, pin, expire, supersede, and per-prefix statistics. Pure: the daemon executes the returned
`WarmAction`s and reports results back; time is passed in.

Lifecycle of a prefix version: ACTIVE (warmed, traffic spread over its replicas) until its TTL lapses
(EXPIRED) or a new text is registered under the same name (SUPERSEDED). The TTL runs from registration
and is renewed only by the operator (`add` again or `warm`), never by traffic: a pin that reads renew
forever is a pin that never ends (Mooncake#3028). Non-active versions are not warmed and give no
affinity; they stay listed (with their statistics) until `forget_after_s`.

Several router replicas (router/scaleout/state_sync.py) share the operator-level state of each name — versions,
texts, settings, states and absolute times — as the document `export_name` writes and `load_name` reads;
placements, warm-up progress and statistics stay each replica's own. With `shared_placement` the K
workers of a prefix are chosen by rendezvous hash instead of load, so replicas that agree on which
workers are available place it on the same workers without talking to each other.

Re-warming: a replica is warmed again when a request matched there reported fewer cached tokens than
the prefix holds (observed eviction), or when it went `rewarm_idle_s` without traffic (an idle entry is
the first an LRU evicts).

`keep` (with HiCache tiers; where the router's exact index, fed by the worker's KV events, knows which
tier a replica holds the prefix in: `plan_warmups(tiers=...)`):
- `hbm`: stay in HBM. Warm-ups carry the pin's priority (workers running --radix-eviction-policy
  priority keep it), and a replica whose prefix left HBM (only in host memory, or gone) is warmed again,
  which loads it back.
- `host`: warm enough in host memory. The replica counts as warm while the prefix sits in HBM or in the
  host tier: no idle re-warm then, and none because it left HBM; only once it left both tiers.

Pins (`pin`, and `keep: hbm`). SGLang 0.5.23 sets a radix node's priority to the max of the priorities
of the requests that inserted it and never lowers it (`RadixCache._insert_helper`; a match touches only
`last_access_time`), and has no per-prefix eviction (`/flush_cache` drops the whole tree, only while
idle). A pin made by priority therefore outlives its TTL and its supersession: re-sending the prefix
at priority 0 changes nothing. So pins are kept by touching by default (`pin_touch_s`): a pinned
replica idle that long (no traffic, no warm-up) is warmed again, which makes it the most recently used
entry; once the pin ends the touches stop and it ages out like any other prefix. The daemon may keep
the priority pins instead (`pin_touch_s` None), which cannot be undone on the worker.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from infer_ctl.core.routing.policy import WorkerView

#: `keep` values: hbm (stay in HBM), host (warm while in host memory); None: neither (the default)
KEEP_CHOICES = ("hbm", "host")
#: seconds after a warm-up before the exact index's word on its tier counts (its KV events in flight)
TIER_GRACE_S = 5.0
#: (ttl_s, replicas, pin, fmt, keep): what a re-registration keeps unless it gives new values
Settings = tuple[float | None, int, bool, str, str | None]


class PrefixState(StrEnum):
    ACTIVE = "active"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"


@dataclass
class Placement:
    worker: str
    warmed_at: float | None = None
    last_hit: float | None = None
    warming: bool = False
    needs_rewarm: bool = True
    warm_failures: int = 0
    #: re-warms in a row because the prefix left its `keep` tier: each doubles the wait for the next
    #: (`PrefixRegistry._kept`), so a worker that cannot keep it (no priority eviction, too small) is not
    #: warmed every TIER_GRACE_S for ever
    left_streak: int = 0
    #: where the exact index last said this replica holds a `keep` prefix: hbm, host, none (None: unknown)
    tier: str | None = None


@dataclass
class PrefixStats:
    requests: int = 0
    predicted_tokens: int = 0
    actual_cached_tokens: int = 0
    prompt_tokens: int = 0
    hits: int = 0
    #: responses that reported cached_tokens (OpenAI responses carry it only when the worker runs
    #: --enable-cache-report): the hit rate's denominator, so unreported requests do not read as misses
    reported: int = 0
    warmups: int = 0
    warm_failures: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.reported if self.reported else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "requests": self.requests,
            "predicted_cached_tokens": self.predicted_tokens,
            "actual_cached_tokens": self.actual_cached_tokens,
            "prompt_tokens": self.prompt_tokens,
            "hits": self.hits,
            "reported": self.reported,
            "hit_rate": round(self.hit_rate, 4),
            "warmups": self.warmups,
            "warm_failures": self.warm_failures,
        }


@dataclass
class PrefixRecord:
    name: str
    text: str
    version: int
    registered_at: float
    ttl_s: float | None
    replicas: int
    pin: bool
    fmt: str = "text"
    keep: str | None = None
    #: the prefix's length in the worker's tokens, learned from a warm-up's prompt_tokens
    tokens: int | None = None
    state: PrefixState = PrefixState.ACTIVE
    ended_at: float | None = None
    placements: dict[str, Placement] = field(default_factory=dict)
    #: workers where warming kept failing: placed elsewhere while others are available
    avoid: set[str] = field(default_factory=set)
    stats: PrefixStats = field(default_factory=PrefixStats)
    #: operator `warm` requests so far: a replica that loads a higher count re-warms its placements
    warm_requests: int = 0

    @cached_property
    def match_key(self) -> str:
        """What a request's routing text must start with to count as this prefix's traffic: the text
        without trailing whitespace. A prompt file almost always ends with a newline that the
        application's prompt does not repeat before the user's part ("...policy.\n" vs "...policy. Q:").
        Computed once (a record's text never changes): `match` runs it for every record on every request,
        and a copy of a 10 MB text each time cost every request 3 ms."""
        return self.text.rstrip() or self.text

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:12]

    @property
    def expires_at(self) -> float | None:
        return None if self.ttl_s is None else self.registered_at + self.ttl_s

    def warm_replicas(self) -> list[str]:
        return [w for w, p in self.placements.items() if p.warmed_at is not None]

    def as_dict(self, now: float) -> dict[str, object]:
        exp = self.expires_at
        return {
            "name": self.name,
            "version": self.version,
            "digest": self.digest,
            "state": self.state.value,
            "chars": len(self.text),
            "tokens": self.tokens,
            "format": self.fmt,
            "replicas_wanted": self.replicas,
            "pin": self.pin,
            "keep": self.keep,
            "ttl_s": self.ttl_s,
            "expires_in_s": None if exp is None else round(max(0.0, exp - now), 1),
            "replicas": [
                {
                    "worker": p.worker,
                    # an ended version is warmed no more and gives no affinity: none of its replicas is warm
                    "warm": p.warmed_at is not None and self.state is PrefixState.ACTIVE,
                    "warmed_s_ago": None if p.warmed_at is None else round(now - p.warmed_at, 1),
                    "last_hit_s_ago": None if p.last_hit is None else round(now - p.last_hit, 1),
                    "warming": p.warming,
                    # with `keep`: the tier the index last saw it in, and re-warms in a row for leaving it
                    "tier": p.tier, "tier_rewarms": p.left_streak,
                }
                for p in self.placements.values()
            ],
            "stats": self.stats.as_dict(),
        }


@dataclass(frozen=True)
class WarmAction:
    name: str
    version: int
    worker: str
    text: str
    fmt: str
    pin: bool


class PrefixRegistry:
    def __init__(self, *, rewarm_idle_s: float, shared_placement: bool, pin_touch_s: float | None,
                 forget_after_s: float = 3600.0, max_warm_failures: int = 3) -> None:
        """`rewarm_idle_s`, `shared_placement` and `pin_touch_s` come from the router's settings
        (rewarm_idle_s, state_store, pin_via and pin_touch_s; router/config.py `prefix_registry`): no
        default here."""
        self.rewarm_idle_s = rewarm_idle_s
        #: pins kept by touching (module docstring, "Pins"): a pinned replica (or keep hbm) idle this
        #: long is warmed again; None: pins are kept by the warm-up's priority alone
        self.pin_touch_s = pin_touch_s
        self.shared_placement = shared_placement
        self.forget_after_s = forget_after_s
        self.max_warm_failures = max_warm_failures
        self._records: dict[str, list[PrefixRecord]] = {}
        #: the settings of names whose versions were all forgotten
        self._settings: dict[str, Settings] = {}
        #: bumped by every method here that changes what a record says (not its statistics or last hit):
        #: the leader serializes its state for the other router processes only when it moved
        #: (router/scaleout/follow.py); a field set from outside should bump it too
        self.changes = 0

    # ---- operator verbs -------------------------------------------------------------------------
    def register(self, name: str, text: str, *, now: float, ttl_s: float | None = None, replicas: int = 1,
                 pin: bool = False, fmt: str = "text", keep: str | None = None) -> PrefixRecord:
        """Add a prefix, or a new version of it. Same text again renews the TTL and settings."""
        if not text:
            raise ValueError(f"prefix {name!r} is empty")
        if keep is not None and keep not in KEEP_CHOICES:
            raise ValueError(f"keep must be hbm or host, got {keep!r}")
        if keep == "host" and pin:
            raise ValueError("pin keeps a prefix in HBM: give keep hbm (or no pin) with it, not keep host")
        self.changes += 1
        versions = self._records.setdefault(name, [])
        current = self.active(name)
        if current is not None and current.text == text:
            current.registered_at = now
            current.ttl_s, current.replicas, current.pin, current.fmt, current.keep = ttl_s, replicas, pin, fmt, keep
            return current
        if current is not None:
            current.state = PrefixState.SUPERSEDED
            current.ended_at = now
        rec = PrefixRecord(name=name, text=text, version=(versions[-1].version + 1 if versions else 1),
                           registered_at=now, ttl_s=ttl_s, replicas=replicas, pin=pin, fmt=fmt, keep=keep)
        versions.append(rec)
        return rec

    def expire(self, name: str, now: float) -> PrefixRecord:
        rec = self.active(name)
        if rec is None:
            raise KeyError(name)
        self.changes += 1
        rec.state = PrefixState.EXPIRED
        rec.ended_at = now
        return rec

    def request_warm(self, name: str, now: float) -> PrefixRecord:
        """Operator asks for a warm-up now; also renews the TTL."""
        rec = self.active(name)
        if rec is None:
            raise KeyError(name)
        self.changes += 1
        rec.registered_at = now
        rec.warm_requests += 1
        for p in rec.placements.values():
            p.needs_rewarm = True
        return rec

    def remove(self, name: str) -> list[PrefixRecord]:
        """Forget a prefix: every version, active or not (no more warm-ups, affinity or statistics).
        Raises KeyError when there is none."""
        versions = self._records.pop(name, None)
        self._settings.pop(name, None)
        if not versions:
            raise KeyError(name)
        self.changes += 1
        return versions

    def adopt(self, records: dict[str, list[PrefixRecord]]) -> None:
        """Take another registry's records as this one's (a follower router process: the leader's table)."""
        self._records = records
        self.changes += 1

    # ---- lookups --------------------------------------------------------------------------------
    def settings(self, name: str) -> Settings | None:
        """(ttl_s, replicas, pin, fmt, keep) of the newest version of a prefix in any state (an expired one,
        or one already forgotten): what a re-registration keeps unless it gives new values."""
        versions = self._records.get(name)
        if versions:
            last = versions[-1]
            return last.ttl_s, last.replicas, last.pin, last.fmt, last.keep
        return self._settings.get(name)

    def active(self, name: str) -> PrefixRecord | None:
        for rec in reversed(self._records.get(name, [])):
            if rec.state is PrefixState.ACTIVE:
                return rec
        return None

    def records(self) -> list[PrefixRecord]:
        return [r for versions in self._records.values() for r in versions]

    def match(self, text: str) -> PrefixRecord | None:
        """The longest active prefix the routing text starts with."""
        best: PrefixRecord | None = None
        for versions in self._records.values():
            for rec in versions:
                if rec.state is PrefixState.ACTIVE and text.startswith(rec.match_key) and (
                    best is None or len(rec.match_key) > len(best.match_key)
                ):
                    best = rec
        return best

    # ---- the control loop -----------------------------------------------------------------------
    def tick(self, now: float) -> list[PrefixRecord]:
        """Expire prefixes whose TTL lapsed; forget long-ended versions. Returns newly expired."""
        expired = []
        for name, versions in list(self._records.items()):
            for rec in versions:
                exp = rec.expires_at
                if rec.state is PrefixState.ACTIVE and exp is not None and now >= exp:
                    rec.state = PrefixState.EXPIRED
                    rec.ended_at = now
                    expired.append(rec)
            keep = [r for r in versions
                    if r.state is PrefixState.ACTIVE or r.ended_at is None
                    or now - r.ended_at < self.forget_after_s]
            if len(keep) != len(versions):
                self.changes += 1
            if keep:
                self._records[name] = keep
            else:  # listed no more, but a later `add NAME` still keeps its settings
                last = versions[-1]
                self._settings[name] = (last.ttl_s, last.replicas, last.pin, last.fmt, last.keep)
                del self._records[name]
        if expired:
            self.changes += 1
        return expired

    def plan_warmups(self, workers: Sequence[WorkerView], now: float,
                     tiers: Mapping[tuple[str, str], str] | None = None) -> list[WarmAction]:
        """Place every active prefix on K available workers and say which replicas to (re-)warm.
        New replicas go to the workers holding the fewest prefixes, then the least loaded. `tiers`:
        where the exact index says a replica holds its prefix, per (name, worker): hbm, host or none
        (absent: unknown); read for prefixes with `keep` only (module docstring)."""
        avail = {w.url: w for w in workers if w.available}
        held: dict[str, int] = dict.fromkeys(avail, 0)
        actives = [r for r in self.records() if r.state is PrefixState.ACTIVE]
        changed = False  # anything a record says (`changes`)
        for rec in actives:
            for url in list(rec.placements):
                p = rec.placements[url]
                if url not in avail or p.warm_failures >= self.max_warm_failures:
                    if p.warm_failures >= self.max_warm_failures:
                        rec.avoid.add(url)
                    del rec.placements[url]
                    changed = True
                else:
                    held[url] += 1
        actions: list[WarmAction] = []
        if self.shared_placement:
            # the same order and no local load on every replica: each places a prefix where the others do
            actives.sort(key=lambda r: (r.name, r.version))
        for rec in actives:
            want = min(rec.replicas, len(avail))
            if self.shared_placement:
                order = {u: (u in rec.avoid, held[u], _rendezvous(rec.name, rec.version, u)) for u in avail}
                free = sorted((u for u in avail if u not in rec.placements), key=order.__getitem__)
            else:
                free = sorted((u for u in avail if u not in rec.placements),
                              key=lambda u: (u in rec.avoid, held[u], avail[u].load, u))
            for url in free[: max(0, want - len(rec.placements))]:
                rec.placements[url] = Placement(worker=url)
                held[url] += 1
                changed = True
            for p in rec.placements.values():
                tier = p.tier
                if not rec.keep:  # re-registered without keep: no stale tier in `router prefixes`
                    p.tier = None
                elif tiers is not None:
                    p.tier = tiers.get((rec.name, p.worker))
                changed = changed or p.tier != tier
                if p.warming:
                    continue
                last = max(t for t in (p.warmed_at, p.last_hit, -1e18) if t is not None)
                idle = now - last >= self._idle_s(rec)
                if p.needs_rewarm or p.warmed_at is None or idle or (rec.keep and tiers):
                    streak = p.left_streak
                    idle, left = self._kept(rec, p, now, tiers, idle, self._left_cap_s)
                    changed = changed or p.left_streak != streak
                    if p.needs_rewarm or p.warmed_at is None or idle or left:
                        if left and not (p.needs_rewarm or p.warmed_at is None or idle):
                            p.left_streak += 1
                        p.warming = True
                        changed = True
                        actions.append(WarmAction(rec.name, rec.version, p.worker, rec.text, rec.fmt,
                                                  rec.pin or rec.keep == "hbm"))
        if changed:
            self.changes += 1
        return actions

    def _idle_s(self, rec: PrefixRecord) -> float:
        """How long a replica may go untouched before it is warmed again: a pin's touch interval is shorter."""
        if self.pin_touch_s is not None and (rec.pin or rec.keep == "hbm"):
            return min(self.pin_touch_s, self.rewarm_idle_s)
        return self.rewarm_idle_s

    @property
    def _left_cap_s(self) -> float:
        """The longest wait between two re-warms for leaving the `keep` tier: the idle re-warm's."""
        return max(TIER_GRACE_S, self.rewarm_idle_s)

    @staticmethod
    def _kept(rec: PrefixRecord, p: Placement, now: float, tiers: Mapping[tuple[str, str], str] | None,
              idle: bool, cap_s: float = float("inf")) -> tuple[bool, bool]:
        """(idle re-warm due, left its tier) of a replica under its prefix's `keep`. Right after a
        warm-up the index may not have its events yet: "left" waits TIER_GRACE_S, doubled for each
        re-warm in a row that the tier did not keep (`Placement.left_streak`, up to `cap_s`); the streak
        ends once the prefix stayed in its tier `cap_s` after a warm-up."""
        where = tiers.get((rec.name, p.worker)) if tiers and rec.keep else None
        if where is None:
            return idle, False
        since = now - p.warmed_at if p.warmed_at is not None else None
        kept = where != "none" if rec.keep == "host" else where == "hbm"
        if kept and since is not None and since >= cap_s:
            p.left_streak = 0
        wait = min(TIER_GRACE_S * 2.0 ** min(p.left_streak, 30), cap_s)
        settled = since is not None and since >= max(TIER_GRACE_S, wait)
        if rec.keep == "host":  # warm while it sits in HBM or host memory, whatever the idle time
            return idle and where == "none", settled and where == "none"
        return idle, settled and where != "hbm"  # keep hbm: back to HBM once it left it

    def warm_done(self, action: WarmAction, ok: bool, now: float, prompt_tokens: int | None = None) -> None:
        self.changes += 1
        for rec in self._records.get(action.name, []):
            if rec.version != action.version:
                continue
            rec.stats.warmups += 1
            if ok and prompt_tokens:
                rec.tokens = prompt_tokens
            p = rec.placements.get(action.worker)
            if p is None:
                return
            p.warming = False
            if ok:
                p.warmed_at = now
                p.needs_rewarm = False
                p.warm_failures = 0
            else:
                p.warm_failures += 1
                rec.stats.warm_failures += 1

    def record_response(self, rec: PrefixRecord, worker: str, *, predicted_tokens: int, prompt_tokens: int,
                        cached_tokens: int | None, prefix_tokens: int, now: float) -> None:
        """Feedback from one response routed as this prefix's traffic."""
        st = rec.stats
        st.requests += 1
        st.predicted_tokens += predicted_tokens
        st.prompt_tokens += prompt_tokens
        p = rec.placements.get(worker)
        if p is not None:
            p.last_hit = now
        if cached_tokens is None:
            return
        st.reported += 1
        st.actual_cached_tokens += cached_tokens
        # a hit: the worker had (almost) the whole shared prefix cached
        if cached_tokens >= 0.9 * (rec.tokens or prefix_tokens):
            st.hits += 1
        elif p is not None and p.warmed_at is not None and not p.needs_rewarm:
            p.needs_rewarm = True  # evicted behind our back: warm it again
            self.changes += 1

    def drop_worker(self, worker: str) -> None:
        for rec in self.records():
            if rec.placements.pop(worker, None) is not None:
                self.changes += 1

    # ---- the shared document (router/scaleout/state_sync.py) ----------------------------------------------
    def get(self, name: str, version: int) -> PrefixRecord | None:
        return next((r for r in self._records.get(name, []) if r.version == version), None)

    def export_name(self, name: str, wall_offset: float) -> dict[str, object]:
        """The operator-level state of one name, times made absolute (`now + wall_offset` is the wall
        clock): what every replica must agree on. `{"removed": true}` when the name is unknown."""
        versions = self._records.get(name)
        settings = self._settings.get(name)
        if not versions and settings is None:
            return {"name": name, "removed": True}
        return {
            "name": name,
            "settings": list(settings) if settings is not None else None,
            "versions": [
                {"version": r.version, "text": r.text, "registered_at": r.registered_at + wall_offset,
                 "ttl_s": r.ttl_s, "replicas": r.replicas, "pin": r.pin, "fmt": r.fmt, "keep": r.keep,
                 "state": r.state.value,
                 "ended_at": None if r.ended_at is None else r.ended_at + wall_offset,
                 "warm_requests": r.warm_requests}
                for r in versions or []
            ],
        }

    def load_name(self, name: str, doc: Mapping[str, object] | None, wall_offset: float) -> None:
        """Make one name what `doc` (from `export_name`, possibly another replica's) says. A version with
        the same number and text keeps this replica's placements and statistics; a higher warm-request
        count re-warms them. Raises ValueError on a malformed document (nothing is changed then)."""
        if doc is None or doc.get("removed"):
            self._records.pop(name, None)
            self._settings.pop(name, None)
            self.changes += 1
            return
        self.changes += 1
        raw_versions = doc.get("versions")
        raw_settings = doc.get("settings")
        if not isinstance(raw_versions, list):
            raise ValueError(f"prefix {name!r}: versions is not a list")
        parsed: list[tuple[int, str, int, dict[str, object]]] = []
        for v in raw_versions:
            try:
                ended = v.get("ended_at")
                fields: dict[str, object] = {
                    "registered_at": float(v["registered_at"]) - wall_offset,
                    "ttl_s": None if v.get("ttl_s") is None else float(v["ttl_s"]),
                    "replicas": int(v["replicas"]), "pin": bool(v["pin"]), "fmt": str(v["fmt"]),
                    "keep": _keep(v.get("keep")),
                    "state": PrefixState(v["state"]), "ended_at": None if ended is None else float(ended) - wall_offset}
                if fields["keep"] == "host" and fields["pin"]:  # what register refuses, from another replica
                    raise ValueError("keep host conflicts with pin")
                parsed.append((int(v["version"]), str(v["text"]), int(v.get("warm_requests", 0)), fields))
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"prefix {name!r}: malformed version: {exc!r}") from None
        old = {(r.version, r.text): r for r in self._records.get(name, [])}
        new: list[PrefixRecord] = []
        for version, text, warm_requests, fields in parsed:
            rec = old.get((version, text))
            if rec is None:
                rec = PrefixRecord(name=name, text=text, version=version, registered_at=0.0, ttl_s=None,
                                   replicas=1, pin=False)
            elif warm_requests > rec.warm_requests:
                for p in rec.placements.values():
                    p.needs_rewarm = True
            for key, value in fields.items():
                setattr(rec, key, value)
            rec.warm_requests = warm_requests
            new.append(rec)
        settings: tuple[float | None, int, bool, str, str | None] | None = None
        if isinstance(raw_settings, list) and len(raw_settings) in (4, 5):
            ttl, replicas, pin, fmt = raw_settings[:4]
            keep = raw_settings[4] if len(raw_settings) == 5 else None  # 4: written before `keep` existed
            try:
                settings = (None if ttl is None else float(ttl), int(replicas), bool(pin), str(fmt), _keep(keep))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"prefix {name!r}: malformed settings: {exc!r}") from None
        if new:
            self._records[name] = new
        else:
            self._records.pop(name, None)
        if settings is not None:
            self._settings[name] = settings
        else:
            self._settings.pop(name, None)


def replicas_beyond_workers(replicas: int, roles: Sequence[str]) -> str | None:
    """Why `replicas` copies of a prefix cannot all be warm with these prefill-like workers registered
    (`roles`: prefill in PD mode, mixed when collocated), or None. Each worker holds a prefix once, so
    the replicas beyond the workers would stay cold ("warm 1/5" for good). With no worker registered yet
    there is nothing to compare against: the prefix waits for its workers."""
    if not roles or replicas <= len(roles):
        return None
    kind = "prefill worker" if "prefill" in roles else "worker"
    n = len(roles)
    return (f"replicas {replicas} exceeds the {n} {kind}{'s' if n > 1 else ''} this router has: a prefix is "
            f"warmed once per {kind}, so {replicas - n} replica{'s' if replicas - n > 1 else ''} would never be "
            f"warm; give replicas 1..{n}, or add {kind}s first (router workers add)")


def _rendezvous(name: str, version: int, worker: str) -> str:
    """Highest-random-weight order of the workers for one prefix version: the same on every replica,
    and removing a worker moves only the prefixes placed on it."""
    return hashlib.sha256(f"{name}\0{version}\0{worker}".encode()).hexdigest()


def _keep(value: object) -> str | None:
    """A shared record's `keep` (another replica's, so checked): hbm, host or None."""
    if value is None or value in KEEP_CHOICES:
        return value
    raise ValueError(f"keep must be hbm, host or null, got {str(value)[:20]!r}")
