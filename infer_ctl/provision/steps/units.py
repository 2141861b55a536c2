"""Env files and systemd units of the node's SGLang instances, rendered by `infer_ctl.launch.render`
(so provision installs byte-for-byte what launch expects)."""

from __future__ import annotations

from infer_ctl.core.provision.desired import ManagedFile
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.launch.render import (
    env_file_path,
    instances,
    render_env_file,
    render_unit,
    unit_name,
    unit_path,
)
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.steps.base import plan_file, systemctl


class UnitsStep:
    name = "units"
    title = "SGLang env files (mode 0640) and systemd units from launch's templates; daemon-reload on change"
    needs_sudo = True

    def plan(self, ctx: StepContext) -> list[Planned]:
        mine = [i for i in instances(ctx.profile) if i.node == ctx.node.name]
        if not mine:
            return [Planned(ctx.entry(self.name, "units", EntryKind.SKIP, "no SGLang instance on this node"))]
        gid = ctx.node.rdma.gid_index if ctx.node.rdma else None
        planned: list[Planned] = []
        for inst in mine:
            unit = unit_name(inst)
            restart = [systemctl("try-restart", unit)] if ctx.options.restart else []
            env = ManagedFile(env_file_path(inst), render_env_file(ctx.profile, inst, gid_index=gid).encode(), mode=0o640)
            planned.append(plan_file(ctx, self.name, env, after_write=restart))
            text = render_unit(ctx.profile, inst)
            if "LimitMEMLOCK=infinity" not in text:
                planned.append(
                    Planned(
                        ctx.entry(
                            self.name,
                            unit,
                            EntryKind.WARN,
                            "the rendered unit lacks LimitMEMLOCK=infinity: RDMA registration will fail",
                            remedy="report this: launch's unit template must set LimitMEMLOCK=infinity",
                        )
                    )
                )
            planned.append(
                plan_file(
                    ctx,
                    self.name,
                    ManagedFile(unit_path(inst), text.encode()),
                    after_write=[systemctl("daemon-reload"), *restart],
                )
            )
        if ctx.options.restart:
            return planned
        # Without --restart a running server keeps its old config; say so instead of restarting it.
        changed_units = {unit_name(i) for i in mine if any(p.action for p in planned)}
        for unit in sorted(changed_units):
            if ctx.conn.run(systemctl("is-active", unit), timeout=30).out.strip() == "active":
                planned.append(
                    Planned(
                        ctx.entry(
                            self.name,
                            unit,
                            EntryKind.WARN,
                            "running with the old unit/env until restarted",
                            remedy="restart it when convenient (`inferctl provision --apply --restart`, or launch)",
                        )
                    )
                )
        return planned

