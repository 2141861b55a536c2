"""Kernel settings in one sysctl.d file, applied live with `sysctl -p <that file>` (nothing else)."""

from __future__ import annotations

from infer_ctl.core.provision.desired import (
    MOONCAKE_RPC_RANGE,
    SYSCTL_PATH,
    normalize_sysctl_value,
    sysctl_file,
    sysctl_settings,
)
from infer_ctl.core.provision.diff import settings_diff
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.remote_files import run_checked
from infer_ctl.provision.steps.base import plan_file
from infer_ctl.remote.base import Command


def desired_settings(ctx: StepContext) -> dict[str, str]:
    ports = list(ctx.profile.server_ports(ctx.node).values())
    if ctx.profile.sglang.transfer_backend == "mooncake":
        ports.extend(range(MOONCAKE_RPC_RANGE[0], MOONCAKE_RPC_RANGE[1] + 1))
    return sysctl_settings(ports, ctx.options.hugepages)


class SysctlStep:
    name = "sysctl"
    title = "vm.max_map_count, ephemeral port range (+ reserved server ports), optional hugepages"
    needs_sudo = True

    def plan(self, ctx: StepContext) -> list[Planned]:
        settings = desired_settings(ctx)
        apply_live = Command("sysctl", "-p", SYSCTL_PATH)
        file = plan_file(ctx, self.name, sysctl_file(settings), after_write=(apply_live,))
        live = self.live_values(ctx, list(settings))
        differs = {k: v for k, v in settings.items() if live.get(k) != normalize_sysctl_value(v)}
        if not differs:
            return [file, Planned(ctx.entry(self.name, "live values", EntryKind.OK, "kernel values match"))]
        if file.action is not None:
            # the file's own action runs `sysctl -p`; the live entry only shows what will move
            return [
                file,
                Planned(
                    ctx.entry(
                        self.name,
                        "live values",
                        EntryKind.CHANGE,
                        "applied by `sysctl -p` after the file is written",
                        diff=settings_diff(live, {k: normalize_sysctl_value(v) for k, v in differs.items()}),
                        commands=(apply_live.shell(),),
                        needs_sudo=True,
                    )
                ),
            ]

        def action() -> None:
            run_checked(ctx.conn, apply_live, sudo=True, what=apply_live.shell())

        return [
            file,
            Planned(
                ctx.entry(
                    self.name,
                    "live values",
                    EntryKind.CHANGE,
                    "kernel values differ from the file (changed since boot?)",
                    diff=settings_diff(live, {k: normalize_sysctl_value(v) for k, v in differs.items()}),
                    commands=(apply_live.shell(),),
                    needs_sudo=True,
                ),
                action,
            ),
        ]

    @staticmethod
    def live_values(ctx: StepContext, keys: list[str]) -> dict[str, str | None]:
        # one round trip; a key the kernel lacks prints nothing, so read them one per line in order
        script = 'for k in "$@"; do printf "%s=" "$k"; sysctl -n "$k" 2>/dev/null || echo; done'
        result = ctx.conn.run(Command("sh", "-c", script, "sh", *keys), timeout=30)
        values: dict[str, str | None] = dict.fromkeys(keys)
        for line in result.out.splitlines():
            key, sep, value = line.partition("=")
            if sep and key in values and value.strip():
                values[key] = normalize_sysctl_value(value)
        return values
