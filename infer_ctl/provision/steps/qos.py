"""NIC QoS for RoCE (trust, PFC on the configured priority, ECN) when `fabric.apply_qos` is true.

These settings live in the NIC driver and are lost at reboot; rerun `inferctl provision --apply` after a
reboot (the plan shows the drift).
"""

from __future__ import annotations

from infer_ctl.core.provision.diff import settings_diff
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.core.provision.qos import desired_pfc, parse_pfc_enabled, parse_trust, pfc_arg
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.remote_files import run_checked
from infer_ctl.remote.base import Command

NOT_FOUND = 127
ECN_ROOT = "/sys/class/net"


class QosStep:
    name = "qos"
    title = "RoCE QoS via mlnx_qos: trust, PFC on fabric.pfc_priority, ECN (only if fabric.apply_qos)"
    needs_sudo = True

    def plan(self, ctx: StepContext) -> list[Planned]:
        policy = ctx.profile.fabric_policy_for(ctx.node)
        netdev = ctx.node.rdma.netdev if ctx.node.rdma else None
        if not policy.apply_qos:
            return [Planned(ctx.entry(self.name, "qos", EntryKind.SKIP, "fabric.apply_qos is false"))]
        if not netdev:
            return [Planned(ctx.entry(self.name, "qos", EntryKind.SKIP, "no nodes[].rdma.netdev to configure"))]
        probe = ctx.conn.run(Command("mlnx_qos", "-i", netdev), sudo=True, timeout=60)
        if not probe.ok:
            why = "mlnx_qos not found" if probe.exit_code == NOT_FOUND else probe.err.strip()[:200]
            return [
                Planned(
                    ctx.entry(
                        self.name,
                        netdev,
                        EntryKind.MANUAL,
                        f"cannot read QoS of {netdev}: {why}",
                        remedy="install MLNX_OFED/mlnx-tools (mlnx_qos), or configure trust/PFC with iproute2 `dcb`",
                    )
                )
            ]
        want = {"trust": policy.trust, "pfc": pfc_arg(desired_pfc(policy.pfc_priority))}
        pfc = parse_pfc_enabled(probe.out)
        have: dict[str, str | None] = {
            "trust": parse_trust(probe.out),
            "pfc": pfc_arg(pfc) if pfc else None,
        }
        planned = [self._settings(ctx, netdev, want, have)]
        if policy.ecn:
            planned.append(self._ecn(ctx, netdev, policy.pfc_priority))
        return planned

    def _settings(self, ctx: StepContext, netdev: str, want: dict[str, str], have: dict[str, str | None]) -> Planned:
        if have == want:
            return Planned(ctx.entry(self.name, netdev, EntryKind.OK, f"trust {want['trust']}, PFC {want['pfc']}"))
        command = Command("mlnx_qos", "-i", netdev, "--trust", want["trust"], "--pfc", want["pfc"])

        def action() -> None:
            run_checked(ctx.conn, command, sudo=True, what=command.shell())

        return Planned(
            ctx.entry(
                self.name,
                netdev,
                EntryKind.CHANGE,
                "set trust and PFC",
                diff=settings_diff(have, want),
                commands=(command.shell(),),
                needs_sudo=True,
            ),
            action,
        )

    def _ecn(self, ctx: StepContext, netdev: str, prio: int) -> Planned:
        paths = [f"{ECN_ROOT}/{netdev}/ecn/{side}/enable/{prio}" for side in ("roce_np", "roce_rp")]
        read = ctx.conn.run(Command("cat", *paths), timeout=30)
        if not read.ok:
            return Planned(
                ctx.entry(
                    self.name,
                    f"{netdev} ecn",
                    EntryKind.WARN,
                    "no MLNX_OFED ECN sysfs (ecn/roce_np, ecn/roce_rp); ECN not checked",
                    remedy="with the upstream driver, check ECN with mlxconfig (ROCE_CC_PRIO_MASK_P1)",
                )
            )
        values = read.out.split()
        if values == ["1", "1"]:
            return Planned(ctx.entry(self.name, f"{netdev} ecn", EntryKind.OK, f"ECN np/rp on for priority {prio}"))
        script = 'for f in "$@"; do echo 1 > "$f" || exit 1; done'
        command = Command("sh", "-c", script, "sh", *paths)

        def action() -> None:
            run_checked(ctx.conn, command, sudo=True, what=f"enable ECN on {netdev}")

        return Planned(
            ctx.entry(
                self.name,
                f"{netdev} ecn",
                EntryKind.CHANGE,
                f"enable ECN (roce_np, roce_rp) on priority {prio}",
                before="/".join(values),
                after="1/1",
                commands=(command.shell(),),
                needs_sudo=True,
            ),
            action,
        )
