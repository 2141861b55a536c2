"""Keeping a running `inferctl router` informed during `launch --rolling`: a server (prefill, decode or
collocated) is taken out of the router's pool (POST /admin/workers/remove) before it restarts, and put
back (POST /admin/workers, with the url, role and bootstrap port it was registered with) once it is
healthy, so no new request is routed to a server that is going down. Best effort: a router that is not
running, or does not know the server, is left alone (the rolling restart itself still proceeds).

Before the remove, the router drains the server (`POST /admin/workers/drain`: no new requests, the
in-flight ones finish, up to `DRAIN_TIMEOUT_S`), so a restart neither fails a request in flight nor
breaks a stream. A router without that endpoint (an older one) is simply asked to remove it: its
remove closes its connections to that worker at once, and requests in flight there fail and are retried
on another pair (before their first byte reaches the client).

What is out of the pool is also written to a state file on the controller (`OUT_FILE` in inferctl's
state directory, per router url) BEFORE the remove: a launch killed between the remove and the re-add
(kill -9, a lost controller) would otherwise leave the server out of the pool for good, and the next
`launch --rolling` would find it "not registered" and never add it back. The next rolling launch picks
those registrations up: a server it restarts is re-added once healthy, any other is re-added at its end
(`restore_left_over`; the router health-checks it before routing to it).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infer_ctl.core.sglang import Instance
from infer_ctl.errors import InferctlError
from infer_ctl.paths import state_dir
from infer_ctl.profile import Profile
from infer_ctl.router.control.client import AdminClient

#: how long a server's in-flight requests may take to finish before it is taken out anyway
DRAIN_TIMEOUT_S = 60.0
#: {router url: {worker url: registration}} of servers taken out and not yet put back, in state_dir()
OUT_FILE = "router-out.json"


class OutOfPool:
    """The persistent record of registrations taken out of one router's pool (see the module doc)."""

    def __init__(self, router: str, path: Path | None = None) -> None:
        self.router = router
        self.path = path or state_dir() / OUT_FILE

    def load(self) -> dict[str, dict[str, Any]]:
        return dict(self._update(None))

    def add(self, spec: dict[str, Any]) -> None:
        self._update(lambda out: out.__setitem__(spec["url"], spec))

    def discard(self, url: str) -> None:
        self._update(lambda out: out.pop(url, None))

    def _update(self, change: Callable[[dict[str, Any]], Any] | None) -> dict[str, Any]:
        """This router's entries, changed by `change` under an exclusive lock (other launches of this
        controller may be rolling other nodes behind the same router)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        with os.fdopen(fd, "r+", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                doc = json.loads(fh.read() or "{}")
            except ValueError:
                doc = {}  # a torn or hand-broken file: start over rather than fail every launch
            if not isinstance(doc, dict):
                doc = {}
            mine = doc.get(self.router)
            mine = dict(mine) if isinstance(mine, dict) else {}
            if change is not None:
                change(mine)
                if mine:
                    doc[self.router] = mine
                else:
                    doc.pop(self.router, None)
                fh.seek(0)
                fh.truncate()
                fh.write(json.dumps(doc, indent=1, sort_keys=True))
                fh.flush()
                os.fsync(fh.fileno())
            return mine


def router_url(profile: Profile) -> str:
    host, port = profile.router.listen.rsplit(":", 1)
    if host.strip("[]") in ("0.0.0.0", "::"):
        host = "127.0.0.1"  # a wildcard listener is reached on loopback from the controller
    return f"http://{host}:{port}"


@dataclass
class RouterNotifier:
    client: AdminClient
    #: worker url -> the registration (url, role, bootstrap_port) taken out and not yet put back
    removed: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: why the router is not being notified (None: it is)
    unavailable: str | None = None
    #: worker url -> how its drain before the remove went (drained | timed out ... | unsupported)
    drained: dict[str, str] = field(default_factory=dict)
    #: where `removed` is kept across runs (None: in memory only)
    record: OutOfPool | None = None
    #: urls an earlier, interrupted launch took out and never put back
    left_over: set[str] = field(default_factory=set)

    @classmethod
    def for_profile(cls, profile: Profile, timeout_s: float = 3.0, record: OutOfPool | None = None) -> RouterNotifier:
        url = router_url(profile)
        client = AdminClient(url, profile.router.admin_token_env, timeout=timeout_s)
        notifier = cls(client, record=record or OutOfPool(url))
        try:
            client.call("GET", "/admin/workers")
        except InferctlError as exc:
            notifier.unavailable = exc.message
            return notifier
        notifier.removed = notifier.record.load() if notifier.record else {}
        notifier.left_over = set(notifier.removed)
        return notifier

    def _registered(self) -> dict[str, dict[str, Any]]:
        doc = self.client.call("GET", "/admin/workers")
        return {
            str(w.get("url", "")).rstrip("/"): w for w in doc.get("workers", []) if isinstance(w, dict)
        }

    def take_out(self, inst: Instance) -> str:
        """Remove the server from the pool; returns what happened, for the launch results."""
        if self.unavailable:
            return f"router not notified: {self.unavailable}"
        try:
            known = self._registered().get(inst.url)
            if known is None:
                if inst.url in self.left_over:  # put back once healthy, as if this run had taken it out
                    self.left_over.discard(inst.url)
                    return "out of the router's pool since an interrupted launch"
                return "not registered with the router"
            spec = {"url": inst.url, "role": known.get("role") or _router_role(inst)}
            if known.get("bootstrap_port") is not None:
                spec["bootstrap_port"] = known["bootstrap_port"]
            if self.record:  # before the remove: a run killed after it must not lose the server
                self.record.add(spec)
            self.removed[inst.url] = spec
            self.drained[inst.url] = self._drain(inst)
            self.client.call("POST", "/admin/workers/remove", {"url": inst.url})
        except InferctlError as exc:
            return f"router not notified: {exc.message}"
        return "removed from the router"

    def _drain(self, inst: Instance) -> str:
        """What the drain did: drained, timed out (with requests in flight), or unsupported."""
        try:
            doc = self.client.call("POST", "/admin/workers/drain", {"url": inst.url, "timeout_s": DRAIN_TIMEOUT_S})
        except InferctlError:
            return "unsupported"
        return "drained" if doc.get("drained") else f"timed out with {doc.get('inflight')} in flight"

    def put_back(self, inst: Instance) -> str | None:
        spec = self.removed.get(inst.url)
        if spec is None:
            return None
        try:
            doc = self.client.call("POST", "/admin/workers", spec)
        except InferctlError as exc:
            try:  # a remove that failed half-way (or a hand-made add) left it registered: it is back
                back = inst.url in self._registered()
            except InferctlError:
                back = False
            if not back:
                return f"could not re-add to the router: {exc.message}"
            doc = {}
        self._forget(inst.url)
        added = doc.get("added")
        if isinstance(added, dict) and added.get("healthy") is False:
            return "re-added to the router, which does not see it healthy yet"
        return "re-added to the router"

    def restore_left_over(self) -> dict[str, str]:
        """Put back what an earlier, interrupted launch left out and this run did not restart (the
        router health-checks a worker before routing to it); url -> what happened."""
        notes = {}
        for url in sorted(self.left_over & set(self.removed)):
            spec = self.removed[url]
            try:
                if url not in self._registered():
                    self.client.call("POST", "/admin/workers", spec)
            except InferctlError as exc:
                notes[url] = f"could not re-add to the router: {exc.message}"
                continue
            self._forget(url)
            notes[url] = "re-added to the router (left out by an interrupted launch)"
        return notes

    def _forget(self, url: str) -> None:
        self.removed.pop(url, None)
        self.left_over.discard(url)
        if self.record:
            self.record.discard(url)

    def healthy_in_pool(self, inst: Instance) -> bool | None:
        """Whether the router now routes to it (None: the router cannot be asked)."""
        try:
            w = self._registered().get(inst.url)
        except InferctlError:
            return None
        return bool(w and w.get("healthy") and w.get("available", True))


def _router_role(inst: Instance) -> str:
    return "mixed" if inst.role == "collocated" else inst.role
