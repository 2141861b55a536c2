"""One server moved between the PD pools: SGLang 0.5.23's runtime role switch, with the router around it
(docs/pd-control.md). The steps, each one's failure leaving the fleet as it was where it can:

1. preflight: `POST /pd_role_switch` with `prepare_only` (SGLang checks the flag, its health, the role and,
   once idle, the decode CUDA graph memory, and changes nothing). Before the drain a busy server answers
   "not idle": everything before the idle rule passed, which is what the preflight is for.
2. drain through the router (`POST /admin/workers/drain`): no new requests, the in-flight ones finish.
3. the preflight again, until the server is idle (its own queues too: a prefill still waiting for a
   decode's KV slots is not idle for SGLang), up to the drain timeout.
4. the switch. A refusal that is `safe_to_restore` puts the server back (undrained, same role); a failed
   rebuild (`safe_to_restore: false`) leaves it drained: SGLang says restart required, and it must take
   no request and not be switched again until it is restarted (core/pd/control.py `fatal`).
5. the router: the server is removed and added back in its new role (a prefill with the bootstrap port
   it reports: with role switching every instance runs a bootstrap server from launch).

I/O only; what to switch and when is core/pd/control.py's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from infer_ctl.errors import InferctlError
from infer_ctl.router.control.client import AdminClient

NOT_IDLE = "instance is not idle"
#: how a request that got no answer reads (refused connection, timeout): not SGLang's words
NO_ANSWER = "no answer"


@dataclass(frozen=True)
class SwitchResult:
    ok: bool
    message: str
    #: SGLang said the instance is unhealthy after a failed rebuild (`safe_to_restore: false`)
    fatal: bool = False
    #: what the worker answered, for the finding (SGLang's own words)
    worker_message: str | None = None
    steps: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, "message": self.message, "fatal": self.fatal,
                               "steps": self.steps, "seconds": round(self.seconds, 3)}
        if self.worker_message is not None:
            out["worker_message"] = self.worker_message
        return out


class RoleSwitcher:
    def __init__(self, router: AdminClient, *, decode_cuda_graph_memory_gb: float | None = None,
                 drain_timeout_s: float = 60.0, admin_key_env: str | None = None, timeout_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.router = router
        self.graph_gb = decode_cuda_graph_memory_gb
        self.drain_timeout_s = drain_timeout_s
        key = os.environ.get(admin_key_env) if admin_key_env else None
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout_s = timeout_s
        self.sleep = sleep

    def _post_switch(self, url: str, to_role: str, prepare_only: bool) -> tuple[bool, str, bool]:
        """(success, SGLang's message, safe_to_restore)."""
        body: dict[str, Any] = {"new_role": to_role, "prepare_only": prepare_only}
        if self.graph_gb is not None:
            body["decode_cuda_graph_memory_gb"] = self.graph_gb
        try:
            r = httpx.post(url + "/pd_role_switch", json=body, headers=self.headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            return False, f"{NO_ANSWER}: {exc}", True
        try:
            doc = r.json()
        except ValueError:
            return False, f"HTTP {r.status_code}: {r.text[:200]}", True
        if not isinstance(doc, dict):
            return False, f"HTTP {r.status_code}: {str(doc)[:200]}", True
        msg = str(doc.get("message", ""))
        return bool(doc.get("success")) and r.status_code == 200, msg, doc.get("safe_to_restore") is not False

    def switch(self, url: str, from_role: str, to_role: str) -> SwitchResult:
        t0 = time.monotonic()
        steps: list[str] = []

        def done(ok: bool, message: str, *, fatal: bool = False, worker: str | None = None) -> SwitchResult:
            return SwitchResult(ok, message, fatal, worker, steps, time.monotonic() - t0)

        ok, msg, safe = self._post_switch(url, to_role, True)
        steps.append(f"preflight: {msg}")
        if not ok and not msg.startswith(NOT_IDLE):
            return done(False, f"{url} refused the switch to {to_role}: {msg}", fatal=not safe, worker=msg)
        try:
            drained = self.router.call("POST", "/admin/workers/drain",
                                       {"url": url, "timeout_s": self.drain_timeout_s})
        except InferctlError as exc:
            return done(False, f"drain of {url} through the router failed: {exc.message}")
        steps.append(f"drained: {drained.get('drained')}")
        deadline = time.monotonic() + self.drain_timeout_s
        while True:  # idle at the worker too (its PD queues), then SGLang's full preflight
            ok, msg, safe = self._post_switch(url, to_role, True)
            if ok or not msg.startswith(NOT_IDLE) or time.monotonic() >= deadline:
                break
            self.sleep(0.05)
        steps.append(f"preflight when drained: {msg}")
        if not ok:
            if safe:
                self._undrain(url, steps)
            return done(False, f"{url} refused the switch to {to_role}: {msg}", fatal=not safe, worker=msg)
        ok, msg, safe = self._post_switch(url, to_role, False)
        steps.append(f"switch: {msg}")
        if not ok and msg.startswith(NO_ANSWER):
            # the switch may have run (a decode's rebuild captures CUDA graphs: longer than the timeout):
            # put back in the router in its old role it could be serving the other pool's requests
            steps.append("left drained: the switch's outcome is unknown")
            return done(False, f"{url} gave no answer to the switch to {to_role} (its role is unknown: left "
                               f"drained; its live role is disaggregation_mode in GET {url}/model_info; undrain it in that role): "
                               f"{msg}", worker=msg)
        if not ok:
            if safe:
                self._undrain(url, steps)
            else:
                steps.append("left drained: SGLang says restart required")
            return done(False, f"{url} failed the switch to {to_role}: {msg}", fatal=not safe, worker=msg)
        try:
            self._reregister(url, to_role)
        except InferctlError as exc:
            return done(False, f"{url} switched to {to_role} but the router did not take it back: {exc.message}")
        steps.append(f"back in the router as {to_role}")
        return done(True, f"{url} moved from the {from_role} pool to the {to_role} pool")

    def _undrain(self, url: str, steps: list[str]) -> None:
        try:
            self.router.call("POST", "/admin/workers/drain", {"url": url, "drain": False})
            steps.append("put back (undrained)")
        except InferctlError as exc:
            steps.append(f"undrain failed: {exc.message}")

    def _reregister(self, url: str, role: str) -> None:
        body: dict[str, Any] = {"url": url, "role": role}
        if role == "prefill":
            port = _bootstrap_port(url, self.headers, self.timeout_s)
            if port is not None:
                body["bootstrap_port"] = port
        self.router.call("POST", "/admin/workers/remove", {"url": url})
        self.router.call("POST", "/admin/workers", body)


def _bootstrap_port(url: str, headers: dict[str, str], timeout: float) -> int | None:
    """The bootstrap port the server reports (SGLang: `disaggregation_bootstrap_port`); None: the router
    learns it at its first health check."""
    try:
        doc = httpx.get(url + "/server_info", headers=headers, timeout=timeout).json()
    except (httpx.HTTPError, ValueError):
        return None
    port = doc.get("disaggregation_bootstrap_port") if isinstance(doc, dict) else None
    return port if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535 else None
