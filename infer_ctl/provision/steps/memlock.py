"""memlock: services get LimitMEMLOCK=infinity in their units (rendered by launch; checked here);
interactive shells get a limits.d file (PAM applies it; systemd services ignore limits.conf)."""

from __future__ import annotations

from infer_ctl.core.provision.desired import limits_file
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.steps.base import plan_file


class MemlockStep:
    name = "memlock"
    title = "memlock unlimited for interactive shells (limits.d); units carry LimitMEMLOCK=infinity"
    needs_sudo = True

    def plan(self, ctx: StepContext) -> list[Planned]:
        return [plan_file(ctx, self.name, limits_file())]
