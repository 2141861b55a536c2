"""The PD balance controller loop (`inferctl pd control`, docs/pd-control.md): read the pools at the router
(`GET /admin/pd`), decide with core/pd/control.py, then advise (say which server would move and why) or
act (launch/pd_switch.py: drain, switch, put back in the other pool), and record every decision.

Mirrors `spec control` (launch/spec_control.py): one round at a time per state file (flock, released by
the kernel when the holder dies), the timers, fatal servers and borrowed servers in a state file so a
restarted controller keeps its cool-down and does not retry a failed rebuild, every decision appended to
a history file as one JSON line (one O_APPEND write: a line is whole or absent; `read_history` skips a
torn last line), and reported to the router (`POST /admin/pd/actions`: the Prometheus counter
`inferctl_router_pd_actions_total{action,to_role}` and a span when the router traces).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from infer_ctl.core.pd.control import Counters, Observation, Server, Settings, State, decide, switched, window
from infer_ctl.errors import InferctlError
from infer_ctl.launch import control_loop
from infer_ctl.launch.control_loop import LockedRounds, post_action, run_rounds, unreadable, write_state
from infer_ctl.launch.pd_switch import SwitchResult
from infer_ctl.profile import Profile
from infer_ctl.router.control.client import AdminClient


class Switcher(Protocol):
    def switch(self, url: str, from_role: str, to_role: str) -> SwitchResult: ...


def settings_of(profile: Profile) -> Settings:
    p = profile.pd
    return Settings(ttft_slo_s=p.ttft_slo_s, itl_slo_s=p.itl_slo_s, trigger=p.trigger, hysteresis=p.hysteresis,
                    sustain_s=p.sustain_s, cooldown_s=p.cooldown_s, min_requests=p.min_requests, stale_s=p.stale_s,
                    min_servers=p.min_servers, cover_failures=p.cover_failures, queue_target=p.queue_target)


def default_state_path(profile: Profile, router_url: str) -> Path:
    """The state file when --state is not given: one per profile name and router (control_loop)."""
    return control_loop.default_state_path("pd-control", profile.name, router_url)


def legacy_state_path(profile: Profile) -> Path:
    return control_loop.legacy_state_path("pd-control", profile.name)


def parse(doc: dict[str, Any]) -> tuple[list[Server], Counters, float | None]:
    """GET /admin/pd -> the servers, the counters, the oldest load poll's age (None: one never polled)."""
    servers, ages = [], []
    for w in doc.get("workers") or []:
        if not isinstance(w, dict) or w.get("role") not in ("prefill", "decode"):
            continue
        servers.append(Server(str(w["url"]), str(w["role"]), bool(w.get("available")), bool(w.get("healthy", True)),
                              bool(w.get("draining")), int(w.get("inflight") or 0) + int(w.get("queued") or 0),
                              int(w.get("queued") or 0)))
        # a down server is polled by probes that fail: its age says nothing about the view of the others
        if w.get("healthy", True) and not w.get("draining"):
            ages.append(w.get("load_age_s"))
    c = doc.get("counters") or {}
    counters = Counters(float(c.get("ttft_sum") or 0), int(c.get("ttft_count") or 0), float(c.get("itl_sum") or 0),
                        int(c.get("itl_count") or 0), int(c.get("prompt_tokens") or 0), int(c.get("requests") or 0))
    known = [float(a) for a in ages if isinstance(a, int | float)]
    stale = None if not ages or len(known) < len(ages) else max(known)
    return servers, counters, stale


def read_history(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The history's records; a line that does not parse (torn by a crash mid-write on a filesystem
    without atomic appends, or cut by a full disk) is skipped, not fatal."""
    out = []
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


# the state file's fields, checked: a wrong type loaded as is broke later (`list("http://a")` is its letters)
def _is(v: Any, kind: type) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float) if kind is float else kind)


def _opt(st: dict[str, Any], key: str, kind: type) -> Any:
    v = st.get(key)
    if v is not None and not _is(v, kind):
        raise TypeError(f"{key}: {v!r} is not a {kind.__name__}")
    return v


def _urls(st: dict[str, Any], key: str) -> list[str]:
    v = st.get(key) or []
    if not isinstance(v, list) or not all(_is(u, str) for u in v):
        raise TypeError(f"{key}: {v!r} is not a list of URLs")
    return list(v)


def _mapping(st: dict[str, Any], key: str, kind: type) -> dict[str, Any]:
    v = st.get(key) or {}
    if not isinstance(v, dict) or not all(_is(x, kind) for x in v.values()):
        raise TypeError(f"{key}: {v!r} is not a mapping to {kind.__name__}")
    return dict(v)


class PdControlLoop(LockedRounds):
    def __init__(self, profile: Profile, *, router_url: str, mode: str, switcher: Switcher | None = None,
                 history: str | os.PathLike[str] | None = None, state_path: str | os.PathLike[str] | None = None,
                 legacy_state: str | os.PathLike[str] | None = None,
                 clock: Callable[[], float] = time.time, say: Callable[[str], None] = lambda _m: None,
                 client: AdminClient | None = None) -> None:
        if mode not in ("advise", "act"):
            raise ValueError(f"mode must be advise or act, got {mode!r}")
        if mode == "act" and switcher is None:
            raise ValueError("act needs a switcher")
        self.profile = profile
        self.mode = mode
        self.switcher = switcher
        self.history = history
        self.clock = clock
        LockedRounds.__init__(self, state_path, say, legacy_state)
        self.client = client or AdminClient(router_url, profile.router.admin_token_env, timeout=10.0)
        self.settings = settings_of(profile)
        self.state = State()
        self.prev: Counters | None = None
        #: the last decision recorded that was not an action: repeated ones are not recorded again
        self.last_noted: tuple[str, str | None] | None = None

    # ---- state that outlives the process ---------------------------------------------------------
    def _load_state(self) -> None:
        """The state file's, when there is one; one that does not read is an error (`read_state`), left as
        it is, not replaced by an empty state that forgets the fatal servers."""
        if self.state_path is None:
            return
        doc = self.state_doc()
        if doc is None:
            return
        try:
            st = doc["state"]
            state = State(_opt(st, "want", str), _opt(st, "since", float), _opt(st, "last_switch_at", float),
                          _urls(st, "fatal"), _mapping(st, "covers", str), _mapping(st, "queue_ema", float),
                          _urls(st, "fatal_down"))
        except (KeyError, TypeError, ValueError) as exc:
            raise unreadable(self.state_path, f"not a pd control state ({type(exc).__name__}: {exc})") from None
        c = doc.get("counters")
        try:
            prev = Counters(**c) if isinstance(c, dict) else self.prev
        except TypeError:  # another version's counters: only the window's start, which starts over
            prev = self.prev
        self.state, self.prev = state, prev

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        doc = {"state": asdict(self.state), "counters": asdict(self.prev) if self.prev else None}
        write_state(self.state_path, doc)

    # ---- one round ---------------------------------------------------------------------------------
    def observe(self) -> Observation:
        servers, counters, stale = parse(self.client.call("GET", "/admin/pd"))
        win = window(self.prev, counters)
        if win.streamed >= self.settings.min_requests or self.prev is None:
            # a window too thin to judge grows into the next round's instead of being thrown away
            self.prev = counters
        return Observation(tuple(servers), win, stale)

    def tick(self) -> list[dict[str, Any]]:
        """Observe, decide, advise or act; returns the round's records. A round skipped because another
        controller holds the lock returns none and is counted and described in `last_skip`."""
        with self._round() as mine:
            if not mine:
                return []
            self._load_state()
            try:
                return self._tick()
            finally:
                self._save_state()

    def clear_fatal(self, urls: list[str] | None, *, wait_s: float = 30.0,
                    sleep: Callable[[float], None] = time.sleep) -> tuple[list[str], list[str]] | None:
        """The operator's word that fatal servers were restarted (`inferctl pd clear-fatal`): `urls` (None:
        every one) leave `fatal`. Waits up to `wait_s` for a running controller's round to end (a switch
        holds the lock through its drain). Returns (cleared, not fatal), or None: the lock stayed held."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._exclusive() as mine:
                if mine:
                    self._load_state()
                    want = list(self.state.fatal) if urls is None else urls
                    cleared = [u for u in want if u in self.state.fatal]
                    self.state.fatal = [u for u in self.state.fatal if u not in cleared]
                    self.state.fatal_down = [u for u in self.state.fatal_down if u not in cleared]
                    self._save_state()
                    return cleared, [u for u in want if u not in cleared]
            if time.monotonic() >= deadline:
                self._locked_out()
                return None
            sleep(0.2)

    def _tick(self) -> list[dict[str, Any]]:
        now = self.clock()
        obs = self.observe()
        fatal = list(self.state.fatal)
        d = decide(obs, self.state, self.settings, now)
        for url in fatal:
            if url not in self.state.fatal:
                self.say(f"{url} was restarted (down, then healthy and undrained): it may be switched again")
        base = {**d.as_dict(), "window": obs.window.as_dict()}
        if d.action in ("none", "stale", "hold"):
            key = (d.action, d.to_role)
            if key == self.last_noted or d.action == "none":
                self.last_noted = key if d.action != "none" else None
                return []
            self.last_noted = key
            return [self._post({**base, "action": d.action})]
        self.last_noted = None
        assert d.server is not None and d.from_role is not None and d.to_role is not None
        if self.mode == "advise":
            self.state.want = self.state.since = None  # advice is given once per shift, not every round
            self.state.last_switch_at = now
            return [self._post({**base, "action": "advise", "command": "inferctl pd control (act)"})]
        assert self.switcher is not None
        self.say(f"{d.action} {d.server}: {d.from_role} -> {d.to_role}: {d.reason}")
        try:
            result = self.switcher.switch(d.server, d.from_role, d.to_role)
        except InferctlError as exc:
            result = SwitchResult(False, exc.message)
        switched(self.state, d, self.clock(), ok=result.ok, fatal=result.fatal)
        rec = {**base, "action": d.action if result.ok else ("failed" if result.fatal else "refused"),
               "result": result.as_dict()}
        if not result.ok:
            # the finding: the worker, and SGLang's own words
            rec["finding"] = {"worker": d.server, "message": result.worker_message or result.message,
                              "restart_required": result.fatal}
        return [self._post(rec)]

    def _post(self, rec: dict[str, Any]) -> dict[str, Any]:
        return post_action(self.client, "/admin/pd/actions", self.history, "pd_action", self.profile.name, rec,
                           timespec="milliseconds")

    def run(self, interval_s: float, *, rounds: int | None = None, stop: Callable[[], bool] = lambda: False,
            on_records: Callable[[list[dict[str, Any]]], None] = lambda _r: None, outlive: bool = False) -> None:
        """The rounds; `outlive`: a round that cannot reach the router does not end them (LockedRounds.outliving)."""
        tick = self.outliving(self.tick, interval_s) if outlive else self.tick
        run_rounds(tick, interval_s, rounds=rounds, stop=stop, on_records=on_records)


