"""What every step gets: the node's connector, the profile, the node, the options. No globals."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from infer_ctl.core.provision.model import PlanEntry
from infer_ctl.profile import Profile
from infer_ctl.profile.nodes import Node
from infer_ctl.remote.base import Connector


def utc_now() -> datetime:
    return datetime.now(UTC)


DEFAULT_KEEP_BACKUPS = 5


@dataclass(frozen=True)
class ProvisionOptions:
    #: step names not to run (reported as SKIP)
    skip: frozenset[str] = frozenset()
    #: when set, only these steps run
    only: frozenset[str] | None = None
    #: a local wheelhouse directory (`inferctl provision wheelhouse build`); overrides sglang.wheelhouse
    wheelhouse: Path | None = None
    #: vm.nr_hugepages to set (Mooncake Store/HiCache only; plain PD needs none)
    hugepages: int | None = None
    #: try-restart SGLang units whose unit or env file changed
    restart: bool = False
    #: backups kept per managed file (`<file>.inferctl-backup-<UTC timestamp>`); older ones are removed
    keep_backups: int = DEFAULT_KEEP_BACKUPS
    now: Callable[[], datetime] = utc_now

    def runs(self, step: str) -> bool:
        if step in self.skip:
            return False
        return self.only is None or step in self.only


@dataclass
class StepContext:
    conn: Connector
    profile: Profile
    node: Node
    options: ProvisionOptions
    #: root is available (sudo -n works, or the SSH user is root)
    privileged: bool
    #: why root is not available (the preflight's message), for the ERROR entries of root-only steps
    privilege_error: str | None = None
    #: computed once per run for all nodes (the verified local wheelhouse, or the error refusing it)
    shared: Mapping[str, object] = field(default_factory=dict)

    def entry(self, step: str, subject: str, kind: str, summary: str, **kw: object) -> PlanEntry:
        return PlanEntry(self.node.name, step, subject, kind, summary, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Planned:
    """A plan entry plus the action that makes it true (CHANGE entries only)."""

    entry: PlanEntry
    action: Callable[[], None] | None = None
