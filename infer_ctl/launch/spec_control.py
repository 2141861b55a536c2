"""The speculative controller loop: observe the pools' acceptance at the router, decide with
core/spec/controller.py, then advise (print the profile change and the command) or act (a rolling
relaunch of that pool, through an `Actuator`), and record every action.

It runs as its own process (`inferctl spec control`, docs/speculative.md says why not inside the router):
the router is where the acceptance is measured and where a decode is drained, both reached over its
admin API; the relaunch needs SSH, which the router's data plane never holds. The same loop drives the
`spec-drift` demo with an actuator that restarts simulated workers instead.

Every action is recorded three times: the router logs it and counts it
(`POST /admin/spec/actions` -> `inferctl_router_spec_actions_total{pool,action}`), a line of kind
`spec_action` is appended to the audit history (`--history`; the audit's own diff skips that kind),
and the loop returns it (the CLI prints it). The controller's timers and its last change are kept in a
state file, so a restarted controller still honours the cool-down; one round at a time per state file
(launch/control_loop.py `LockedRounds`: a skipped round names the controller that holds the lock).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from infer_ctl.core.sglang import instances
from infer_ctl.core.spec.controller import Controller, ControlSettings, PoolChange, PoolObservation, PoolState
from infer_ctl.core.spec.pools import Pool, apply_command, pool_change_yaml, pools
from infer_ctl.errors import InferctlError
from infer_ctl.launch import control_loop
from infer_ctl.launch.control_loop import LockedRounds, post_action, run_rounds, unreadable, write_state
from infer_ctl.profile import Profile
from infer_ctl.router.control.client import AdminClient


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    message: str
    details: dict[str, Any] = field(default_factory=dict)


class Actuator(Protocol):
    """Applies one pool change: a rolling relaunch of the pool's servers, one at a time, each drained
    from the router first."""

    def apply(self, pool: Pool, change: PoolChange) -> ActionResult: ...


def settings_of(profile: Profile) -> ControlSettings:
    spec = profile.speculative
    draft = profile.models.draft if profile.models else None
    return ControlSettings(hysteresis=spec.hysteresis, sustain_s=spec.sustain_s, cooldown_s=spec.cooldown_s,
                           min_requests=spec.min_requests, min_gain=spec.min_gain, adaptive=spec.adaptive,
                           algorithm=draft.algorithm.value if draft else None,
                           eagle_topk=draft.eagle_topk if draft else None)


def pool_by_url(profile: Profile) -> dict[str, str]:
    """Decode (or collocated) server URL -> its pool's name."""
    role = "collocated" if profile.collocated else "decode"
    names = {n: p.name for p in pools(profile) for n in p.nodes}
    return {i.url: names[i.node] for i in instances(profile) if i.role == role and i.is_leader and i.node in names}


def observations(doc: dict[str, Any], url_to_pool: dict[str, str]) -> list[PoolObservation]:
    """The router's /admin/spec per pool: alpha weighted by verify steps over the pool's decodes."""
    acc: dict[str, dict[str, Any]] = {}
    for d in doc.get("decodes") or []:
        pool = url_to_pool.get(str(d.get("url")))
        win = d.get("window") or {}
        if pool is None or win.get("alpha") is None:
            continue
        a = acc.setdefault(pool, {"w": 0.0, "sum": 0.0, "requests": 0, "steps": set(), "adaptive": False})
        weight = float(win.get("verify_ct") or win.get("requests") or 0)
        a["w"] += weight
        a["sum"] += weight * float(win["alpha"])
        a["requests"] += int(win.get("requests") or 0)
        a["steps"].add(d.get("num_steps"))
        a["adaptive"] = a["adaptive"] or bool(d.get("adaptive"))
    out = []
    for pool, a in acc.items():
        steps = [s for s in a["steps"] if isinstance(s, int)]
        out.append(PoolObservation(pool, a["sum"] / a["w"] if a["w"] else None, a["requests"],
                                   min(steps) if steps else None, a["adaptive"]))
    return out


def default_state_path(profile: Profile, router_url: str) -> Path:
    """The state file when --state is not given: one per profile name and router (control_loop)."""
    return control_loop.default_state_path("spec-control", profile.name, router_url)


def legacy_state_path(profile: Profile) -> Path:
    return control_loop.legacy_state_path("spec-control", profile.name)


class SpecControlLoop(LockedRounds):
    def __init__(self, profile: Profile, *, router_url: str, mode: str, actuator: Actuator | None = None,
                 history: str | os.PathLike[str] | None = None, profile_ref: str = "PROFILE",
                 state_path: str | os.PathLike[str] | None = None,
                 legacy_state: str | os.PathLike[str] | None = None, url_to_pool: dict[str, str] | None = None,
                 clock: Callable[[], float] = time.time, say: Callable[[str], None] = lambda _m: None) -> None:
        if mode not in ("advise", "act"):
            raise ValueError(f"mode must be advise or act, got {mode!r}")
        if mode == "act" and actuator is None:
            raise ValueError("act needs an actuator")
        self.profile = profile
        self.mode = mode
        self.actuator = actuator
        self.history = history
        self.profile_ref = profile_ref
        self.clock = clock
        LockedRounds.__init__(self, state_path, say, legacy_state)
        self.client = AdminClient(router_url, profile.router.admin_token_env, timeout=10.0)
        self.url_to_pool = url_to_pool if url_to_pool is not None else pool_by_url(profile)
        self.pools = {p.name: p for p in pools(profile)}
        self.controller = Controller(list(self.pools.values()), settings_of(profile))
        #: pools below their threshold at the last round (an alert is recorded on the way down only)
        self.alerting: set[str] = set()
        #: pool -> the setting last advised (advice is given once per setting)
        self.advised: dict[str, tuple[int, tuple[int, ...] | None]] = {}
        #: pool -> what the last round saw and decided (see _tick)
        self.last_round: dict[str, dict[str, Any]] = {}
        self._load_state()

    # ---- state that outlives the process ---------------------------------------------------------
    def _load_state(self) -> None:
        if self.state_path is None:
            return
        doc = self.state_doc()  # one that does not read is an error, not a cool-down forgotten
        if doc is None:
            return
        try:
            last = doc.get("last_change_at")
            if last is not None and not isinstance(last, int | float):
                raise TypeError(f"last_change_at: {last!r} is not a time")
            states = {}
            for name, st in (doc.get("pools") or {}).items():
                if name in self.pools and isinstance(st, dict):
                    changed = st.get("changed")
                    states[name] = PoolState(
                        st.get("below_since"), st.get("above_since"),
                        (int(changed[0]), tuple(int(n) for n in changed[1]) if changed[1] else None) if changed
                        else None)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise unreadable(self.state_path, f"not a spec control state ({type(exc).__name__}: {exc})") from None
        self.controller.last_change_at = last
        self.controller.states.update(states)

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        doc = {"last_change_at": self.controller.last_change_at,
               "pools": {k: asdict(v) for k, v in self.controller.states.items()}}
        write_state(self.state_path, doc)

    # ---- one round ---------------------------------------------------------------------------------
    def observe(self) -> list[PoolObservation]:
        return observations(self.client.call("GET", "/admin/spec"), self.url_to_pool)

    def tick(self) -> list[dict[str, Any]]:
        """Observe, decide, advise or act; returns the actions recorded this round. A round skipped because
        another controller of this state file is in its round returns none and is counted and described in
        `last_skip` (LockedRounds)."""
        with self._round() as mine:
            if not mine:
                return []
            self._load_state()  # what another process recorded since this one started (its cool-down)
            return self._tick()

    def _tick(self) -> list[dict[str, Any]]:
        now = self.clock()
        obs = self.observe()
        records = self._alerts(obs)
        # every pool's decision this round, also "no change": `spec control --once --advise` printed
        # nothing when there was no new action (a repeated advice is recorded once), so a cron run could
        # not tell "all well" from "not looked"
        self.last_round = {o.pool: {"pool": o.pool, "alpha": None if o.alpha is None else round(o.alpha, 4),
                                    "requests": o.requests, "num_steps": o.num_steps, "decision": "no change"}
                           for o in obs}
        for change in self.controller.step(obs, now):
            pool = self.pools[change.pool]
            decided = self.last_round.setdefault(change.pool, {"pool": change.pool})
            verb = "advise" if self.mode == "advise" else change.action
            decided["decision"] = f"{verb}: num_steps {change.num_steps} ({change.reason})"
            if self.mode == "advise":
                if self.advised.get(change.pool) != (change.num_steps, change.adaptive_steps):
                    self.advised[change.pool] = (change.num_steps, change.adaptive_steps)
                    records.append(self._record("advise", change, pool))
                else:
                    decided["decision"] += "; advised before, unchanged"
                continue
            assert self.actuator is not None
            self.say(f"{change.action} pool {change.pool}: {change.reason}")
            try:
                result = self.actuator.apply(pool, change)
            except InferctlError as exc:
                result = ActionResult(False, exc.message)
            self.controller.applied(change, now)  # also after a failure: no retry storm within the cool-down
            records.append(self._record(change.action if result.ok else "failed", change, pool, result))
        self._save_state()
        return records

    def _alerts(self, obs: list[PoolObservation]) -> list[dict[str, Any]]:
        out = []
        for o in obs:
            pool = self.pools.get(o.pool)
            if pool is None or o.alpha is None or o.requests < self.controller.settings.min_requests:
                continue
            below = o.alpha < pool.limits.alert_threshold
            if below and o.pool not in self.alerting:
                out.append(self._post({"pool": o.pool, "action": "alert", "alpha": round(o.alpha, 4),
                                       "num_steps": o.num_steps, "requests": o.requests,
                                       "message": f"alpha {o.alpha:.2f} fell below the alert threshold "
                                                  f"{pool.limits.alert_threshold:g} over {o.requests} requests"}))
            if below:
                self.alerting.add(o.pool)
            elif o.alpha >= pool.limits.alert_threshold + self.controller.settings.hysteresis:
                self.alerting.discard(o.pool)
        return out

    def _record(self, action: str, change: PoolChange, pool: Pool, result: ActionResult | None = None
                ) -> dict[str, Any]:
        rec: dict[str, Any] = {**change.as_dict(), "action": action, "nodes": list(pool.nodes)}
        if action == "advise" or (result is not None and change.action == "relaunch"):
            rec["profile_change"] = pool_change_yaml(pool, change.num_steps, change.adaptive_steps)
            rec["command"] = apply_command(self.profile_ref, pool)
        if result is not None:
            rec["result"] = {"ok": result.ok, "message": result.message, **result.details}
            if result.ok and change.action == "relaunch":
                rec["message"] += ("; the profile still says the old setting: persist the change above, or the "
                                   "next `inferctl launch` puts it back")
        return self._post(rec)

    def _post(self, rec: dict[str, Any]) -> dict[str, Any]:
        return post_action(self.client, "/admin/spec/actions", self.history, "spec_action", self.profile.name, rec,
                           timespec="seconds")

    def run(self, interval_s: float, *, rounds: int | None = None, stop: Callable[[], bool] = lambda: False,
            on_records: Callable[[list[dict[str, Any]]], None] = lambda _r: None, outlive: bool = False) -> None:
        """The rounds; `outlive`: a round that cannot reach the router does not end them (LockedRounds.outliving)."""
        tick = self.outliving(self.tick, interval_s) if outlive else self.tick
        run_rounds(tick, interval_s, rounds=rounds, stop=stop, on_records=on_records)
