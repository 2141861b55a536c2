"""Open the SGLang, bootstrap, Mooncake RPC and RoCE ports, but only in a firewall that is already
active (ufw or firewalld). inferctl never turns a firewall on."""

from __future__ import annotations

from collections.abc import Sequence

from infer_ctl.core.provision.desired import firewall_ports, missing_ports
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.facts.firewall import (
    FIREWALLD_LIST_PORTS,
    FIREWALLD_STATE,
    UFW_PRESENT,
    UFW_STATUS,
    firewalld_ports,
    firewalld_running,
    ufw_active,
    ufw_allowed,
)
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.remote_files import run_checked
from infer_ctl.remote.base import Command


class FirewallStep:
    name = "firewall"
    title = "allow server/bootstrap/Mooncake/RoCE ports in an active ufw or firewalld (never enables one)"
    needs_sudo = True

    def wanted(self, ctx: StepContext) -> list[str]:
        router = ctx.profile.router
        router_port = router.listen_port if router.listen_host == ctx.node.host else None
        return firewall_ports(
            ctx.profile.server_ports(ctx.node),
            mooncake=ctx.profile.sglang.transfer_backend == "mooncake",
            rdma=ctx.node.rdma is not None,
            router_port=router_port,
        )

    def plan(self, ctx: StepContext) -> list[Planned]:
        conn, wanted = ctx.conn, self.wanted(ctx)
        has_ufw = conn.run(UFW_PRESENT, timeout=30).ok
        if has_ufw:
            status = conn.run(UFW_STATUS, sudo=True, timeout=30)
            if status.ok and ufw_active(status.out):
                missing = missing_ports(wanted, ufw_allowed(status.out))
                commands = [Command("ufw", "allow", p, "comment", "inferctl") for p in missing]
                return [self._entry(ctx, "ufw", wanted, missing, commands)]
        state = conn.run(FIREWALLD_STATE, timeout=30)
        if state.ok and firewalld_running(state.out):
            listed = conn.run(FIREWALLD_LIST_PORTS, sudo=True, timeout=30)
            missing = missing_ports(wanted, firewalld_ports(listed.out))
            commands = [Command("firewall-cmd", "--permanent", f"--add-port={p.replace(':', '-')}") for p in missing]
            if commands:
                commands.append(Command("firewall-cmd", "--reload"))
            return [self._entry(ctx, "firewalld", wanted, missing, commands)]
        return [
            Planned(
                ctx.entry(
                    self.name,
                    "firewall",
                    EntryKind.OK,
                    "no active ufw/firewalld: nothing to open (inferctl never enables a firewall)",
                    details={"ports": wanted},
                )
            )
        ]

    def _entry(
        self, ctx: StepContext, kind: str, wanted: list[str], missing: list[str], commands: Sequence[Command]
    ) -> Planned:
        if not missing:
            return Planned(ctx.entry(self.name, kind, EntryKind.OK, f"{kind} allows {', '.join(wanted)}"))

        def action() -> None:
            for command in commands:
                run_checked(ctx.conn, command, sudo=True, what=command.shell())

        return Planned(
            ctx.entry(
                self.name,
                kind,
                EntryKind.CHANGE,
                f"allow {', '.join(missing)}",
                before="not allowed",
                after="allowed",
                commands=tuple(c.shell() for c in commands),
                needs_sudo=True,
            ),
            action,
        )
