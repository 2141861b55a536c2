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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infer_ctl.core.sglang import Instance
from infer_ctl.errors import InferctlError
from infer_ctl.profile import Profile
from infer_ctl.router.client import AdminClient

#: how long a server's in-flight requests may take to finish before it is taken out anyway
DRAIN_TIMEOUT_S = 60.0


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

    @classmethod
    def for_profile(cls, profile: Profile, timeout_s: float = 3.0) -> RouterNotifier:
        client = AdminClient(router_url(profile), profile.router.admin_token_env, timeout=timeout_s)
        notifier = cls(client)
        try:
            client.call("GET", "/admin/workers")
        except InferctlError as exc:
            notifier.unavailable = exc.message
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
                return "not registered with the router"
            self.drained[inst.url] = self._drain(inst)
            self.client.call("POST", "/admin/workers/remove", {"url": inst.url})
        except InferctlError as exc:
            return f"router not notified: {exc.message}"
        spec = {"url": inst.url, "role": known.get("role") or _router_role(inst)}
        if known.get("bootstrap_port") is not None:
            spec["bootstrap_port"] = known["bootstrap_port"]
        self.removed[inst.url] = spec
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
            return f"could not re-add to the router: {exc.message}"
        del self.removed[inst.url]
        added = doc.get("added")
        if isinstance(added, dict) and added.get("healthy") is False:
            return "re-added to the router, which does not see it healthy yet"
        return "re-added to the router"

    def healthy_in_pool(self, inst: Instance) -> bool | None:
        """Whether the router now routes to it (None: the router cannot be asked)."""
        try:
            w = self._registered().get(inst.url)
        except InferctlError:
            return None
        return bool(w and w.get("healthy") and w.get("available", True))


def _router_role(inst: Instance) -> str:
    return "mixed" if inst.role == "collocated" else inst.role
