"""Keeping a running `inferctl router` informed during `launch --rolling`: a decode is taken out of the
router's pool (POST /admin/workers/remove) before it restarts, and put back (POST /admin/workers) once it
is healthy, so no new request is routed to a server that is going down. Best effort: a router that is
not running, or does not know the decode, is left alone (the rolling restart itself still proceeds)."""

from __future__ import annotations

from dataclasses import dataclass, field

from infer_ctl.core.sglang import Instance
from infer_ctl.errors import InferctlError
from infer_ctl.profile import Profile
from infer_ctl.router.client import AdminClient


def router_url(profile: Profile) -> str:
    host, port = profile.router.listen.rsplit(":", 1)
    if host.strip("[]") in ("0.0.0.0", "::"):
        host = "127.0.0.1"  # a wildcard listener is reached on loopback from the controller
    return f"http://{host}:{port}"


@dataclass
class RouterNotifier:
    client: AdminClient
    #: decode URLs taken out of the pool and not yet put back
    removed: set[str] = field(default_factory=set)
    #: why the router is not being notified (None: it is)
    unavailable: str | None = None

    @classmethod
    def for_profile(cls, profile: Profile, timeout_s: float = 3.0) -> RouterNotifier:
        client = AdminClient(router_url(profile), profile.router.admin_token_env, timeout=timeout_s)
        notifier = cls(client)
        try:
            client.call("GET", "/admin/workers")
        except InferctlError as exc:
            notifier.unavailable = exc.message
        return notifier

    def _registered(self) -> set[str]:
        doc = self.client.call("GET", "/admin/workers")
        return {str(w.get("url", "")).rstrip("/") for w in doc.get("workers", []) if isinstance(w, dict)}

    def take_out(self, inst: Instance) -> str:
        """Remove the decode from the pool; returns what happened, for the launch results."""
        if self.unavailable:
            return f"router not notified: {self.unavailable}"
        try:
            if inst.url not in self._registered():
                return "not registered with the router"
            self.client.call("POST", "/admin/workers/remove", {"url": inst.url})
        except InferctlError as exc:
            return f"router not notified: {exc.message}"
        self.removed.add(inst.url)
        return "removed from the router"

    def put_back(self, inst: Instance) -> str | None:
        if inst.url not in self.removed:
            return None
        try:
            self.client.call("POST", "/admin/workers", {"url": inst.url, "role": "decode"})
        except InferctlError as exc:
            return f"could not re-add to the router: {exc.message}"
        self.removed.discard(inst.url)
        return "re-added to the router"
