"""Which servers restart together: pure planning over instances, no I/O.

A *server* is every instance (node rank) of one group: a tp16 decode over two nodes is one server of
two instances. Its ranks always restart together: a new rank 0 cannot form a process group with an
old rank 1, so restarting rank by rank never becomes healthy.

`launch --rolling` restarts role by role (prefills, then collocated servers, then decodes), at most
`max_unavailable` servers of a role at a time, and never all servers of a role the profile has: at
least one keeps serving while the others restart (unless the role has a single server, which the plan
reports as `alone`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infer_ctl.core.sglang import Instance

#: prefills first: a decode restarted before the prefills would reconnect to prefills about to go away
ROLE_ORDER = ("prefill", "collocated", "decode")

Server = tuple[Instance, ...]


def servers(insts: Sequence[Instance]) -> list[Server]:
    """Instances grouped by server, in order of first appearance; ranks sorted (rank 0 first)."""
    by_group: dict[str, list[Instance]] = {}
    for i in insts:
        by_group.setdefault(i.group or i.name, []).append(i)
    return [tuple(sorted(g, key=lambda i: i.node_rank)) for g in by_group.values()]


def whole_servers(selected: Sequence[Instance], every: Sequence[Instance]) -> list[Instance]:
    """The selection widened to every rank of each server it touches (in `every`'s order)."""
    groups = {i.group or i.name for i in selected}
    return [i for i in every if (i.group or i.name) in groups]


@dataclass(frozen=True)
class Step:
    role: str | None  # None: a plain (non-rolling) launch, every role at once
    servers: tuple[Server, ...]
    #: the role has one server in the whole profile: nothing serves while it restarts
    alone: bool = False

    @property
    def instances(self) -> list[Instance]:
        return [i for s in self.servers for i in s]

    @property
    def leaders(self) -> list[Instance]:
        return [s[0] for s in self.servers]


def plan(selected: Sequence[Instance], every: Sequence[Instance], max_unavailable: int = 1) -> list[Step]:
    """Rolling steps for `selected` (whole servers), counting the servers of each role in `every` (the
    profile) so that one always keeps serving."""
    if max_unavailable < 1:
        raise ValueError("max_unavailable must be at least 1")
    chosen = servers(selected)
    total = {r: len([s for s in servers(every) if s[0].role == r]) for r in ROLE_ORDER}
    steps: list[Step] = []
    for role in ROLE_ORDER:
        mine = [s for s in chosen if s[0].role == role]
        if not mine:
            continue
        alone = total[role] <= 1
        n = 1 if alone else min(max_unavailable, total[role] - 1)
        steps += [Step(role, tuple(mine[k : k + n]), alone) for k in range(0, len(mine), n)]
    return steps


def at_once(selected: Sequence[Instance]) -> list[Step]:
    return [Step(None, tuple(servers(selected)))]
