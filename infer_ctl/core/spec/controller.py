"""The speculative controller's decisions, pure: from pool observations over time, which pool to change
(num_steps, or SGLang's adaptive mode with the formula's candidates) and when to restore it.

Rules (docs/speculative.md, "The controller"):
- a pool is judged only with at least `min_requests` requests in its window (a pool that just restarted
  has none: its old numbers belonged to the old settings);
- hysteresis in alpha and in time: a change needs alpha below the pool's alert threshold for `sustain_s`
  in a row; a changed pool is restored to the profile's setting only after alpha stays at or above
  threshold + `hysteresis` for `sustain_s`; between the two nothing moves;
- a change must be worth a relaunch: the expected throughput ratio (recommended over running S) at
  least `min_gain`; a pool already at its recommendation is left alone (no relaunch to the same place);
- at most one pool change per `cooldown_s`, across all pools (the worst pool first);
- where SGLang's adaptive mode applies (EAGLE/EAGLE3, topk 1) and `adaptive` is set, the change is
  `--speculative-adaptive` with the formula's candidates up to the recommended step count (and 0),
  launched at the recommendation: the engine then follows the drift itself between those settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infer_ctl.core.sizing.spec import speedup
from infer_ctl.core.spec.adaptive import adaptive_applies, formula_candidates
from infer_ctl.core.spec.judge import assess
from infer_ctl.core.spec.pools import Pool


@dataclass(frozen=True)
class ControlSettings:
    hysteresis: float = 0.05
    sustain_s: float = 120.0
    cooldown_s: float = 900.0
    min_requests: int = 50
    min_gain: float = 1.02
    adaptive: bool = False
    #: the draft, for whether SGLang's adaptive mode applies
    algorithm: str | None = None
    eagle_topk: int | None = None


@dataclass(frozen=True)
class PoolObservation:
    pool: str
    alpha: float | None
    #: requests in the pool's windows (summed over its decodes)
    requests: int
    #: the step count its decodes run now (None: unknown)
    num_steps: int | None
    adaptive: bool = False


@dataclass(frozen=True)
class PoolChange:
    pool: str
    #: relaunch: a lower (or adaptive) lookahead for a drop; restore: back to the profile's setting
    action: str
    num_steps: int
    adaptive_steps: tuple[int, ...] | None
    from_steps: int | None
    alpha: float
    speedup_before: float
    speedup_after: float
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {"pool": self.pool, "action": self.action, "num_steps": self.num_steps,
                "adaptive_steps": list(self.adaptive_steps) if self.adaptive_steps else None,
                "from_steps": self.from_steps, "alpha": round(self.alpha, 4),
                "speedup_before": round(self.speedup_before, 4), "speedup_after": round(self.speedup_after, 4),
                "message": self.reason}


@dataclass
class PoolState:
    below_since: float | None = None
    above_since: float | None = None
    #: the setting a controller change put in place (None: the profile's)
    changed: tuple[int, tuple[int, ...] | None] | None = None


@dataclass
class Controller:
    pools: list[Pool]
    settings: ControlSettings
    states: dict[str, PoolState] = field(default_factory=dict)
    last_change_at: float | None = None

    def _state(self, name: str) -> PoolState:
        return self.states.setdefault(name, PoolState())

    def _pool(self, name: str) -> Pool | None:
        return next((p for p in self.pools if p.name == name), None)

    def cooling(self, now: float) -> bool:
        return self.last_change_at is not None and now - self.last_change_at < self.settings.cooldown_s

    def step(self, observations: list[PoolObservation], now: float) -> list[PoolChange]:
        """Update the timers with this round's observations; returns the change to make now (at most
        one), empty when none is due."""
        s = self.settings
        due: list[tuple[float, PoolChange]] = []
        for obs in observations:
            pool = self._pool(obs.pool)
            if pool is None or obs.alpha is None or not obs.num_steps or obs.requests < s.min_requests:
                continue
            st = self._state(obs.pool)
            if st.changed is None and not obs.adaptive and pool.num_steps and obs.num_steps != pool.num_steps:
                st.changed = (obs.num_steps, None)  # changed before this controller started (or by hand)
            threshold = pool.limits.alert_threshold
            if obs.alpha < threshold:
                st.above_since = None
                st.below_since = now if st.below_since is None else st.below_since
                if now - st.below_since >= s.sustain_s:
                    change = self._lower(pool, obs)
                    if change is not None:
                        due.append((change.speedup_before / max(change.speedup_after, 1e-9), change))
            elif obs.alpha >= threshold + s.hysteresis:
                st.below_since = None
                st.above_since = now if st.above_since is None else st.above_since
                if st.changed is not None and now - st.above_since >= s.sustain_s:
                    due.append((2.0, self._restore(pool, obs)))
            else:  # inside the hysteresis band: neither timer runs
                st.below_since = st.above_since = None
        if not due or self.cooling(now):
            return []
        due.sort(key=lambda x: x[0])
        return [due[0][1]]

    def _lower(self, pool: Pool, obs: PoolObservation) -> PoolChange | None:
        s = self.settings
        assert obs.alpha is not None and obs.num_steps
        a = assess(obs.alpha, obs.num_steps, pool.limits)
        c = pool.limits.cost_ratio
        rec = a.recommended_steps
        adaptive = None
        if s.adaptive and adaptive_applies(s.algorithm, s.eagle_topk):
            cands = formula_candidates(c, pool.limits.min_steps, pool.limits.max_steps)
            adaptive = tuple(x for x in cands if x <= rec)
            if rec not in adaptive:
                adaptive = (*adaptive, rec)
            if obs.adaptive and obs.num_steps == rec and self._state(pool.name).changed == (rec, adaptive):
                return None
        elif rec == obs.num_steps and not obs.adaptive:
            return None  # already the best allowed lookahead: nothing a relaunch can improve
        if adaptive is None and a.gain < s.min_gain:
            return None
        why = (f"alpha {obs.alpha:.2f} below the alert threshold {pool.limits.alert_threshold:g} for "
               f"{s.sustain_s:g}s over {obs.requests} requests: {obs.num_steps} steps give "
               f"{a.speedup:.2f}x, {rec} give {a.recommended_speedup:.2f}x (c {c:g})")
        if adaptive is not None:
            why += f"; adaptive among {list(adaptive)}"
        return PoolChange(pool.name, "relaunch", rec, adaptive, obs.num_steps, obs.alpha, a.speedup,
                          a.recommended_speedup, why)

    def _restore(self, pool: Pool, obs: PoolObservation) -> PoolChange:
        assert obs.alpha is not None and obs.num_steps
        steps = pool.num_steps or obs.num_steps
        c = pool.limits.cost_ratio
        why = (f"alpha {obs.alpha:.2f} back above {pool.limits.alert_threshold + self.settings.hysteresis:.2f} "
               f"for {self.settings.sustain_s:g}s: back to the profile's {steps} steps")
        return PoolChange(pool.name, "restore", steps, pool.adaptive_steps, obs.num_steps, obs.alpha,
                          speedup(obs.alpha, obs.num_steps, c), speedup(obs.alpha, steps, c), why)

    def applied(self, change: PoolChange, now: float) -> None:
        """A change was made (or attempted: a failed relaunch also waits for the cool-down)."""
        self.last_change_at = now
        st = self._state(change.pool)
        st.below_since = st.above_since = None
        st.changed = None if change.action == "restore" else (change.num_steps, change.adaptive_steps)
