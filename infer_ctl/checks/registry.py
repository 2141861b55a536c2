"""The audit's registry of check families: an explicit list, one line per family.

To plug a family into `inferctl audit`, write a module `infer_ctl/checks/NAME.py` that exposes
`FAMILY: CheckFamily` and append NAME to `FAMILY_NAMES` (checks/family_names.py, shared with the CLI).
The audit opens ONE fleet (one SSH connection per node) and hands it to every family through
`AuditContext`, so a family must not open its own connections: use `ctx.fleet.map(ctx.nodes, fn)`.

A family reports problems as findings, never by raising: an unreachable node or a missing tool is an
UNKNOWN finding that names the node and says what to do. An exception escaping `run` is caught by the
audit and turned into one UNKNOWN finding `<family>.internal` so the other families still run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infer_ctl.checks.family_names import FAMILY_ALIASES, FAMILY_NAMES
from infer_ctl.core.findings import Finding
from infer_ctl.errors import UsageError
from infer_ctl.profile import Node, Profile

if TYPE_CHECKING:
    from infer_ctl.remote.fleet import Fleet

# Order is the order families run and are reported in (that of FAMILY_NAMES).
FAMILY_MODULES: list[str] = [f"infer_ctl.checks.{name}" for name in FAMILY_NAMES]


@dataclass
class AuditContext:
    """What a family gets: the profile, the shared fleet (it connects lazily, so a family that needs no
    nodes never opens a connection), the selected nodes, and free-form options (e.g. {"since_s": ...});
    families ignore unknown keys."""

    profile: Profile
    #: opened once by the audit; imported for type checking only, so this module stays light
    fleet: Fleet
    nodes: list[Node]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckFamily:
    #: short name used by `--only` and as the check-id prefix ("gpu" -> "gpu.ecc")
    name: str
    description: str
    run: Callable[[AuditContext], list[Finding]]
    #: False for families that judge only local/profile data (e.g. tokenizer files on the controller)
    needs_nodes: bool = True


def family_name_of(module: str) -> str:
    """A family is named after its module (`infer_ctl.checks.gpu` -> "gpu"), so `--only gpu` can import
    just that module: the others' imports (tokenizers, HTTP clients) cost ~0.4 s per run."""
    return module.rsplit(".", 1)[-1]


def load_family(module: str) -> CheckFamily:
    mod = importlib.import_module(module)
    family = getattr(mod, "FAMILY", None)
    if not isinstance(family, CheckFamily):
        raise TypeError(f"{module} is listed in FAMILY_MODULES but has no FAMILY: CheckFamily")
    if family.name != family_name_of(module):
        raise TypeError(f"{module}: FAMILY.name must be {family_name_of(module)!r} (the module's name), "
                        f"not {family.name!r}")
    return family


def all_families(modules: Iterable[str] | None = None) -> list[CheckFamily]:
    return [load_family(m) for m in (FAMILY_MODULES if modules is None else modules)]


def families(only: set[str] | None = None, *, modules: Iterable[str] | None = None) -> list[CheckFamily]:
    """The families to run, in registry order; `only` names a subset (unknown names are a usage error).
    With `only`, the other families' modules are not imported."""
    listed = list(FAMILY_MODULES if modules is None else modules)
    if not only:
        return all_families(listed)
    only = {FAMILY_ALIASES.get(name, name) for name in only}
    known = {family_name_of(m) for m in listed}
    unknown = sorted(only - known)
    if unknown:
        raise UsageError(
            f"--only: unknown check famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}",
            remedy=f"choose from: {', '.join(sorted(known))}",
        )
    return all_families([m for m in listed if family_name_of(m) in only])
