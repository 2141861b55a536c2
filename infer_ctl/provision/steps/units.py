"""Env files and systemd units of the node's SGLang instances, from `infer_ctl.launch.deploy` (the
function launch writes them with: the same bytes, the same modes, and the GID index read from this node
when the profile pins none), so a launch after a provision changes nothing and the other way round."""

from __future__ import annotations

from infer_ctl.core.provision.desired import ManagedFile
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.launch.deploy import deployment
from infer_ctl.launch.render import env_file_path, instances, unit_name, unit_path
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.steps.base import plan_file, systemctl


class UnitsStep:
    name = "units"
    title = "SGLang env files and systemd units, as launch writes them (GID index read on the node); daemon-reload on change"
    needs_sudo = True

    def plan(self, ctx: StepContext) -> list[Planned]:
        mine = [i for i in instances(ctx.profile) if i.node == ctx.node.name]
        if not mine:
            return [Planned(ctx.entry(self.name, "units", EntryKind.SKIP, "no SGLang instance on this node"))]
        planned: list[Planned] = []
        for inst in mine:
            unit = unit_name(inst)
            restart = [systemctl("try-restart", unit)] if ctx.options.restart else []
            plan = deployment(ctx.conn, ctx.profile, inst, "systemd")
            if plan.refused:
                planned.append(
                    Planned(
                        ctx.entry(
                            self.name,
                            env_file_path(inst),
                            EntryKind.ERROR,
                            f"MC_GID_INDEX cannot be determined: {plan.refused}",
                            remedy="run `inferctl check fabric` on the node; fix the HCA (a RoCE v2 GID of "
                            "fabric.gid_family), or pin nodes[].rdma.gid_index",
                        )
                    )
                )
                continue
            env, unit_file = plan.files
            planned.append(plan_file(ctx, self.name, ManagedFile(env.path, env.text.encode(), mode=env.mode), after_write=restart))
            text = unit_file.text
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
                    ManagedFile(unit_path(inst), text.encode(), mode=unit_file.mode),
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

