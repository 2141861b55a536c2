"""Rotation of the server log files the process supervisor writes (nodes without systemd:
`<sglang.log_dir>/sglang-<role>.log`). Under systemd the servers log to the journal, which journald
rotates itself (SystemMaxUse= in journald.conf)."""

from __future__ import annotations

from infer_ctl.core.provision.desired import HEADER, ManagedFile
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.core.sglang import log_file_path
from infer_ctl.launch.render import instances
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.steps.base import plan_file

LOGROTATE_PATH = "/etc/logrotate.d/inferctl-sglang"


def logrotate_file(log_dirs: list[str]) -> ManagedFile:
    """copytruncate: the server keeps its log open (appending, `>>`) for as long as it runs, so the file
    is copied and truncated in place rather than renamed (a renamed file would keep growing unseen).
    Daily, or sooner once a file passes 512 MB; seven old files kept, compressed from the second."""
    globs = " ".join(f"{d.rstrip('/')}/sglang-*.log" for d in sorted(set(log_dirs)))
    body = (
        f"{globs} {{\n"
        "    daily\n"
        "    maxsize 512M\n"
        "    rotate 7\n"
        "    compress\n"
        "    delaycompress\n"
        "    missingok\n"
        "    notifempty\n"
        "    copytruncate\n"
        "}\n"
    )
    return ManagedFile(LOGROTATE_PATH, (HEADER + body).encode())


class LogrotateStep:
    name = "logrotate"
    title = "logrotate for the server log files of nodes without systemd (journald rotates the journal)"
    needs_sudo = True

    def plan(self, ctx: StepContext) -> list[Planned]:
        mine = [i for i in instances(ctx.profile) if i.node == ctx.node.name]
        if not mine:
            return [Planned(ctx.entry(self.name, LOGROTATE_PATH, EntryKind.SKIP, "no SGLang instance on this node"))]
        return [plan_file(ctx, self.name, logrotate_file([log_file_path(i).rsplit("/", 1)[0] for i in mine]))]
