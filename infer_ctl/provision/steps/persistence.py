"""GPU persistence mode through a systemd drop-in for nvidia-persistenced (survives reboots)."""

from __future__ import annotations

from infer_ctl.core.provision.desired import persistence_dropin
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.remote_files import run_checked
from infer_ctl.provision.steps.base import plan_file, systemctl

UNIT = "nvidia-persistenced.service"


class PersistenceStep:
    name = "persistence"
    title = "GPU persistence mode: nvidia-persistenced drop-in without --no-persistence-mode, enabled"
    needs_sudo = True

    def plan(self, ctx: StepContext) -> list[Planned]:
        if ctx.node.gpus == 0:
            return [Planned(ctx.entry(self.name, UNIT, EntryKind.SKIP, "node has no GPUs"))]
        dropin = plan_file(ctx, self.name, persistence_dropin(), after_write=(systemctl("daemon-reload"),))
        enabled = ctx.conn.run(systemctl("is-enabled", UNIT), timeout=30).out.strip()
        active = ctx.conn.run(systemctl("is-active", UNIT), timeout=30).out.strip()
        restart = dropin.action is not None
        if enabled == "enabled" and active == "active" and not restart:
            service = Planned(ctx.entry(self.name, UNIT, EntryKind.OK, "enabled and active"))
        else:
            command = systemctl("restart" if restart else "start", UNIT)

            def action() -> None:
                run_checked(ctx.conn, systemctl("enable", UNIT), sudo=True, what=f"enable {UNIT}")
                run_checked(ctx.conn, command, sudo=True, what=command.shell())

            service = Planned(
                ctx.entry(
                    self.name,
                    UNIT,
                    EntryKind.CHANGE,
                    "enable and (re)start with the drop-in",
                    before=f"{enabled or 'unknown'}/{active or 'unknown'}",
                    after="enabled/active",
                    commands=(systemctl("enable", UNIT).shell(), command.shell()),
                    needs_sudo=True,
                ),
                action,
            )
        return [dropin, service]
