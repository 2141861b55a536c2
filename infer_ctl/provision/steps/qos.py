"""NIC QoS for RoCE (trust, PFC on the configured priority, ECN) when `fabric.apply_qos` is true.

These settings live in the NIC driver and are lost at reboot; rerun `inferctl provision --apply` after a
reboot (the plan shows the drift). The NIC's state is read with facts.qos (the parser `check fabric`
uses too); a setting the NIC does not show (trust on NICs without a trust mode) is reported as not
supported, never planned as a change that could not take effect.
"""

from __future__ import annotations

from infer_ctl.core.fabric.facts import QosFacts
from infer_ctl.core.provision.diff import settings_diff
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.core.provision.qos import LABELS, qos_settings
from infer_ctl.facts.qos import QosParseError, mlnx_qos_command, parse_mlnx_qos
from infer_ctl.profile.fabric import FabricPolicy
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
        qos = self._read(ctx, netdev)
        if isinstance(qos, str):
            return [
                Planned(
                    ctx.entry(
                        self.name,
                        netdev,
                        EntryKind.MANUAL,
                        f"cannot read QoS of {netdev}: {qos}",
                        remedy="install MLNX_OFED/mlnx-tools (mlnx_qos), or configure trust/PFC with iproute2 `dcb`",
                    )
                )
            ]
        settings = qos_settings(qos, policy.trust, policy.pfc_priority)
        planned = [self._settings(ctx, netdev, settings.want, settings.have)] if settings.want else []
        planned += [self._unsupported(ctx, netdev, name, policy) for name in settings.unsupported]
        if policy.ecn:
            planned.append(self._ecn(ctx, netdev, policy.pfc_priority))
        return planned

    def _read(self, ctx: StepContext, netdev: str) -> QosFacts | str:
        """The NIC's QoS as `mlnx_qos -i` shows it, or why it could not be read."""
        probe = ctx.conn.run(mlnx_qos_command(netdev), sudo=True, timeout=60)
        if not probe.ok:
            return "mlnx_qos not found" if probe.exit_code == NOT_FOUND else probe.err.strip()[:200]
        try:
            return parse_mlnx_qos(probe.out)
        except QosParseError as exc:
            return str(exc)

    def _settings(self, ctx: StepContext, netdev: str, want: dict[str, str], have: dict[str, str]) -> Planned:
        if have == want:
            shown = ", ".join(f"{LABELS[k]} {v}" for k, v in want.items())
            return Planned(ctx.entry(self.name, netdev, EntryKind.OK, shown))
        command = Command("mlnx_qos", "-i", netdev, *(arg for k, v in want.items() for arg in (f"--{k}", v)))

        def action() -> None:
            run_checked(ctx.conn, command, sudo=True, what=command.shell())

        return Planned(
            ctx.entry(
                self.name,
                netdev,
                EntryKind.CHANGE,
                "set " + " and ".join(LABELS[k] for k in want),
                diff=settings_diff(have, want),
                commands=(command.shell(),),
                needs_sudo=True,
            ),
            action,
        )

    def _unsupported(self, ctx: StepContext, netdev: str, setting: str, policy: FabricPolicy) -> Planned:
        """Nothing to apply: the NIC does not show the setting, so mlnx_qos cannot change it either."""
        if setting == "trust":
            summary = (f"trust not supported on this NIC: mlnx_qos shows no trust state for {netdev}, so "
                       f"fabric.trust ({policy.trust}) cannot be applied here")
        else:
            summary = (f"PFC not supported on this NIC: mlnx_qos shows no PFC table for {netdev}, so PFC on "
                       f"priority {policy.pfc_priority} cannot be applied here")
        return Planned(
            ctx.entry(
                self.name,
                f"{netdev} {setting}",
                EntryKind.SKIP,
                summary,
                remedy="nothing to apply on this host: mark or classify the RoCE traffic at the switch (or use a "
                "NIC and driver with this setting); `inferctl check fabric` shows what the NIC reports",
                details={"setting": setting, "supported": False},
            )
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
