"""Time sync is reported, not configured: NTP servers are site-specific (air-gapped sites run their own)."""

from __future__ import annotations

from infer_ctl.core.provision.model import EntryKind
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.remote.base import Command


class TimeSyncStep:
    name = "timesync"
    title = "clock NTP-synchronized (report only)"
    needs_sudo = False

    def plan(self, ctx: StepContext) -> list[Planned]:
        result = ctx.conn.run(Command("timedatectl", "show", "-p", "NTPSynchronized", "--value"), timeout=30)
        value = result.out.strip()
        if result.ok and value == "yes":
            return [Planned(ctx.entry(self.name, "clock", EntryKind.OK, "NTP-synchronized"))]
        summary = (
            "clock is not NTP-synchronized"
            if result.ok
            else f"could not read time sync state ({(result.err or result.out).strip()[:120] or 'timedatectl failed'})"
        )
        return [
            Planned(
                ctx.entry(
                    self.name,
                    "clock",
                    EntryKind.WARN,
                    summary,
                    remedy="configure chrony or systemd-timesyncd with your site's NTP servers and enable it",
                )
            )
        ]
