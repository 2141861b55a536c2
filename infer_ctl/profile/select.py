"""Which nodes of the profile a command runs on: `--nodes` names/globs and `--role`, in profile order.

Pure (no connections): every fleet command selects first, then opens a `remote.fleet.Fleet` over the
selection.
"""

from __future__ import annotations

import fnmatch

from infer_ctl.errors import UsageError
from infer_ctl.profile.nodes import Node, Role
from infer_ctl.profile.profile import Profile


def select_nodes(profile: Profile, nodes: str | None = None, role: str | None = None) -> list[Node]:
    """Nodes matching comma-separated names/globs and/or a role, in profile order."""
    selected = list(profile.nodes)
    if nodes:
        patterns = [p.strip() for p in nodes.split(",") if p.strip()]
        if not patterns:
            raise UsageError(f"--nodes {nodes!r} names no node", remedy="e.g. --nodes pf-01,dc-*")
        names = [n.name for n in profile.nodes]
        for pattern in patterns:
            if not fnmatch.filter(names, pattern):
                raise UsageError(
                    f"--nodes: {pattern!r} matches no node of profile {profile.name!r}",
                    remedy=f"known nodes: {', '.join(names)}",
                )
        selected = [n for n in selected if any(fnmatch.fnmatchcase(n.name, p) for p in patterns)]
    if role:
        try:
            wanted = Role(role)
        except ValueError:
            raise UsageError(
                f"--role {role!r} is not a role", remedy=f"use one of: {', '.join(r.value for r in Role)}"
            ) from None
        selected = [n for n in selected if n.has_role(wanted)]
    if not selected:
        raise UsageError(
            "the selection matches no node"
            + (f" (--nodes {nodes})" if nodes else "")
            + (f" (--role {role})" if role else ""),
            remedy="run `inferctl nodes` to list the profile's nodes and roles",
        )
    return selected
