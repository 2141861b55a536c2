"""`audit --remediate`: taking a node whose findings say "drain" out of service, and returning it.

Off unless `enabled: true` AND the audit runs with `--remediate` (a cron line that forgets the flag, or a
profile copied without the section, never drains anything). What the audit does with it is in
docs/runbooks/cron-audit.md ("Remediation"); the plan itself is pure (core/remediation.py).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from infer_ctl.profile.base import StrictModel

#: argv elements may hold these; each is replaced inside its own element (never a shell, never re-split)
HOOK_PLACEHOLDERS = ("{node}", "{reason}", "{host}")


class RemediationSettings(StrictModel):
    enabled: bool = False
    #: findings of these checks (fnmatch patterns) may drain a node, when they FAIL and say "drain"
    #: (their remedy asks to drain the node or the GPU, or the check is in `always_drain`)
    checks: list[str] = Field(default_factory=lambda: ["gpu.*"])
    #: checks whose FAIL drains whatever its remedy says (e.g. a diagnostic run by `check gpu --diag`)
    always_drain: list[str] = Field(default_factory=list)
    #: never more than this many nodes of one role out of service at once (a node with two roles counts
    #: for both); the last node of a role in service is never drained whatever this says
    max_drained: Annotated[int, Field(ge=1)] = 1
    #: a drained node returns after this many consecutive audits that checked it and found nothing that
    #: drains (the recovery window)
    recovery_audits: Annotated[int, Field(ge=1, le=1000)] = 3
    #: how long the audit waits for the drained workers' in-flight requests to finish before it records
    #: the node as `draining` (the router keeps it out either way; they finish on their own)
    drain_wait_s: Annotated[float, Field(ge=0, le=3600)] = 60.0
    #: the router to drain through; unset: the profile's router.listen (a wildcard host means loopback)
    router_url: Annotated[str, Field(pattern=r"^https?://\S+$")] | None = None
    #: a site command run on the controller after the router drained a node, e.g.
    #: ["scontrol", "update", "NodeName={node}", "State=DRAIN", "Reason=inferctl: {reason}"];
    #: run without a shell; without a {node} element the node name is appended as the last argument
    drain_hook: list[str] | None = None
    #: the same when a node is returned, e.g. ["scontrol", "update", "NodeName={node}", "State=RESUME"]
    return_hook: list[str] | None = None
    hook_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60.0

    @field_validator("drain_hook", "return_hook")
    @classmethod
    def _argv(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or not v[0].strip()):
            raise ValueError("give the command as a non-empty argv list, e.g. [scontrol, update, ...]")
        return v
