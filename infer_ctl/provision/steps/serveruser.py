"""The dedicated system user the SGLang units run as (`sglang.lifecycle.user`, User=/Group= in the
units launch renders). Created once, never changed or removed afterwards: its uid may own caches."""

from __future__ import annotations

from infer_ctl.core.provision.model import EntryKind
from infer_ctl.launch.render import instances
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.remote_files import run_checked
from infer_ctl.remote.base import Command

# a system user with its own group and a home for the caches torch/triton/flashinfer write (systemd sets
# HOME from the passwd entry); no login shell
_CREATE = (
    'set -e; shell=$(command -v nologin || echo /bin/false); '
    'useradd --system --user-group --create-home --home-dir "/var/lib/$1" --shell "$shell" '
    '--comment "SGLang servers (inferctl)" -- "$1"'
)


def home_of(user: str) -> str:
    return f"/var/lib/{user}"


class ServerUserStep:
    name = "user"
    title = "the system user the SGLang units run as (sglang.lifecycle.user; `root` opts out)"
    needs_sudo = True

    def plan(self, ctx: StepContext) -> list[Planned]:
        user = ctx.profile.sglang.lifecycle.user
        if not any(i.node == ctx.node.name for i in instances(ctx.profile)):
            return [Planned(ctx.entry(self.name, user, EntryKind.SKIP, "no SGLang instance on this node"))]
        if user == "root":
            return [Planned(ctx.entry(self.name, user, EntryKind.SKIP, "servers run as root (sglang.lifecycle.user: root)"))]
        found = ctx.conn.run(Command("getent", "passwd", user), timeout=30)
        if found.ok and found.out.strip():
            fields = found.out.strip().split(":")
            uid, home = (fields[2], fields[5]) if len(fields) >= 6 else ("?", "?")
            return [Planned(ctx.entry(self.name, user, EntryKind.OK, f"exists (uid {uid}, home {home})"))]
        create = Command("sh", "-c", _CREATE, "sh", user)

        def action() -> None:
            run_checked(ctx.conn, create, sudo=True, what=f"useradd {user}")

        entry = ctx.entry(
            self.name,
            user,
            EntryKind.CHANGE,
            f"create system user {user} (home {home_of(user)}, no login shell)",
            before="<none>",
            after=user,
            commands=(f"useradd --system --user-group --create-home --home-dir {home_of(user)} --shell nologin {user}",),
            needs_sudo=True,
        )
        return [Planned(entry, action)]
