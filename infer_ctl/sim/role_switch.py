"""SGLang 0.5.23's runtime prefill <-> decode role switch, the decision part (no aiohttp, no engine).

Read from the 0.5.23 wheel: `srt/disaggregation/role_switch.py` (`handle_pd_role_switch`, `_reject_reason`:
the scheduler's checks, in this order), `srt/managers/tokenizer_control_mixin.py` (`pd_role_switch`: the
flag check before the scheduler, and the answer it builds from the scheduler's: "ok" for any success,
"ready" for `prepare_only`, the failing message otherwise), `srt/managers/io_struct.py`
(`PdRoleSwitchReqInput` / `PdRoleSwitchReqOutput`) and `srt/entrypoints/http_server.py` (200 on success,
400 otherwise). `role_switch_api.py` carries the answer over HTTP and makes the switch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RoleSwitchState:
    """The scheduler's switch flags (`_pd_role_switch_unhealthy`, `_pd_role_switch_in_progress`), whether
    decode CUDA graphs exist (captured at a decode launch, or by an earlier switch to decode), and a
    simulator-only fault: the message the next rebuild fails with."""
    unhealthy: bool = False
    in_progress: bool = False
    decode_graphs: bool = False
    rebuild_fault: str | None = None
    switches: int = 0


@dataclass(frozen=True)
class SwitchRequest:
    new_role: str = ""
    decode_cuda_graph_memory_gb: float | None = None
    prepare_only: bool = False


@dataclass(frozen=True)
class Outcome:
    success: bool
    message: str
    old_role: str
    new_role: str
    safe_to_restore: bool = False
    switch: bool = False  # the caller must now tear down and rebuild (the rebuild may still fail)

    def body(self) -> dict[str, Any]:
        """`msgspec_to_builtins(PdRoleSwitchReqOutput)`: BaseReq's rid and http_worker_ipc come first."""
        return {"rid": None, "http_worker_ipc": None, "success": self.success, "message": self.message,
                "old_role": self.old_role, "new_role": self.new_role, "safe_to_restore": self.safe_to_restore}

    @property
    def status(self) -> int:
        return 200 if self.success else 400


def parse_request(body: Any) -> SwitchRequest | list[dict[str, Any]]:
    """The body as PdRoleSwitchReqInput takes it, or pydantic's errors (SGLang renders them as a 400)."""
    if not isinstance(body, dict):
        return [{"type": "model_attributes_type", "loc": ("body",),
                 "msg": "Input should be a valid dictionary or object to extract fields from", "input": body}]
    errors: list[dict[str, Any]] = []
    role = body.get("new_role", "")
    if role not in ("prefill", "decode", ""):  # Literal["prefill", "decode", ""]
        errors.append({"type": "literal_error", "loc": ("body", "new_role"),
                       "msg": "Input should be 'prefill', 'decode' or ''", "input": role})
    gb = body.get("decode_cuda_graph_memory_gb")
    if gb is not None and (isinstance(gb, bool) or not isinstance(gb, int | float)):
        errors.append({"type": "float_type", "loc": ("body", "decode_cuda_graph_memory_gb"),
                       "msg": "Input should be a valid number", "input": gb})
    prep = body.get("prepare_only", False)
    if not isinstance(prep, bool):
        errors.append({"type": "bool_type", "loc": ("body", "prepare_only"),
                       "msg": "Input should be a valid boolean", "input": prep})
    if errors:
        return errors
    return SwitchRequest(role, None if gb is None else float(gb), prep)


def decide(*, enabled: bool, mode: str, idle: bool, state: RoleSwitchState, req: SwitchRequest,
           graph_headroom_gb: float) -> Outcome:
    """What the tokenizer manager answers, before any teardown; `switch` says a rebuild must follow.

    `mode` is the live disaggregation mode ("prefill", "decode" or "null")."""
    new_role = req.new_role
    if not enabled:  # the tokenizer's own check: "server", where the scheduler's says "instance"
        return Outcome(False, "--enable-pd-role-switch is not set on this server", mode, new_role, True)
    rejection = _reject_reason(state, mode, new_role.lower())
    if rejection is not None:
        return Outcome(False, rejection[0], mode, new_role, rejection[1])
    if new_role == mode:  # the scheduler says "already in target role"; the tokenizer answers "ok"
        return Outcome(True, "ok", mode, new_role)
    if not idle:
        return Outcome(False, "instance is not idle; drain all requests before switching", mode, new_role, True)
    # a decode launch captured its graphs; a prefill has none until its first switch to decode
    if new_role == "decode" and not state.decode_graphs:
        gb = req.decode_cuda_graph_memory_gb
        if gb is None:
            return Outcome(False, "decode_cuda_graph_memory_gb is required before capturing decode graphs", mode,
                           new_role, True)
        if gb < 0:
            return Outcome(False, "decode_cuda_graph_memory_gb must be non-negative", mode, new_role, True)
        if graph_headroom_gb < gb:
            return Outcome(False, f"insufficient decode CUDA graph headroom: required={gb:.3f} GB, "
                                  f"available={graph_headroom_gb:.3f} GB", mode, new_role, True)
    if req.prepare_only:
        return Outcome(True, "ready", mode, new_role, True)
    return Outcome(True, "ok", mode, new_role, switch=True)


def rebuild_failed(outcome: Outcome, error: str) -> Outcome:
    """A teardown or rebuild that raised: no rollback, the instance must be restarted."""
    return Outcome(False, f"role switch failed; instance unhealthy, restart required: {error}",
                   outcome.old_role, outcome.new_role, False)


def _reject_reason(state: RoleSwitchState, mode: str, new_role: str) -> tuple[str, bool] | None:
    """`_reject_reason`'s table, first failing check wins: (message, safe to restore routing). The
    transfer backend (mooncake: supports it) and the staging buffer (off) checks always pass here."""
    checks = (
        (state.unhealthy, False, "instance is unhealthy after a failed role switch; restart required"),
        (state.in_progress, False, "another role switch is already in progress"),
        (new_role not in ("prefill", "decode"), True, f"invalid new_role={new_role!r}"),
        (mode == "null", True, "instance is not running in PD disaggregation mode"),
    )
    return next(((msg, safe) for failed, safe, msg in checks if failed), None)
