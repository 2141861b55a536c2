"""The root of a cluster profile and its cross-field rules."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Self

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from infer_ctl.profile.base import StrictModel
from infer_ctl.profile.fabric import FabricPolicy
from infer_ctl.profile.gpu import GpuPolicy
from infer_ctl.profile.hicache import hicache_problems
from infer_ctl.profile.messages import error_message
from infer_ctl.profile.models import Models
from infer_ctl.profile.nodes import Node, NodeName, Role
from infer_ctl.profile.pd import PdControlSettings
from infer_ctl.profile.ports import OVERRIDE_KEY, PortSource, clash_loc, describe, port_sources
from infer_ctl.profile.remediation import RemediationSettings
from infer_ctl.profile.router import RouterSettings
from infer_ctl.profile.sglang import SglangSettings
from infer_ctl.profile.speculative import SpeculativeSettings
from infer_ctl.profile.ssh import SshSettings
from infer_ctl.profile.tenants import tenant_problems


class CrossFieldError(ValueError):
    """A rule spanning fields; `loc` is the path of the field to blame."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


class CrossFieldErrors(ValueError):
    """All cross-field problems of a profile at once; the loader unpacks them into field-named lines."""

    def __init__(self, problems: list[CrossFieldError]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, p.loc))}: {p.message}" for p in problems))
        self.problems = problems


class Profile(StrictModel):
    name: NodeName
    description: str | None = None
    #: true: every node runs one plain (non-disaggregated) SGLang server
    collocated: bool = False
    ssh: SshSettings = Field(default_factory=SshSettings)
    nodes: Annotated[list[Node], Field(min_length=1)]
    gpu: GpuPolicy = Field(default_factory=GpuPolicy)
    fabric: FabricPolicy = Field(default_factory=FabricPolicy)
    models: Models | None = None
    sglang: SglangSettings = Field(default_factory=SglangSettings)
    router: RouterSettings = Field(default_factory=RouterSettings)
    speculative: SpeculativeSettings = Field(default_factory=SpeculativeSettings)
    #: the prefill:decode balance controller (`inferctl pd control`; profile/pd.py)
    pd: PdControlSettings = Field(default_factory=PdControlSettings)
    #: `audit --remediate` (off by default; profile/remediation.py)
    remediation: RemediationSettings = Field(default_factory=RemediationSettings)

    #: directory of the profile file, for resolving relative paths (prefix files, probes)
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    def with_base_dir(self, base_dir: Path) -> Self:
        self._base_dir = base_dir
        return self

    # ---- cross-field rules -------------------------------------------------------------------
    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        problems = self.cross_field_problems()
        if problems:
            raise CrossFieldErrors(problems)
        return self

    def cross_field_problems(self) -> list[CrossFieldError]:
        problems: list[CrossFieldError] = []
        names = Counter(n.name for n in self.nodes)
        seen_ssh: dict[tuple[str, int], str] = {}
        seen_server: dict[tuple[str, int], tuple[int, str, PortSource]] = {}
        for i, node in enumerate(self.nodes):
            if names[node.name] > 1:
                problems.append(CrossFieldError(("nodes", i, "name"), f"duplicate node name {node.name!r}"))
            if node.connection == "ssh":
                key = (node.host, self.ssh_port(node))
                if key in seen_ssh:
                    problems.append(
                        CrossFieldError(
                            ("nodes", i, "host"),
                            f"{node.host}:{key[1]} is also node {seen_ssh[key]!r}; each node needs its own host:port",
                        )
                    )
                seen_ssh.setdefault(key, node.name)
            for role, src in port_sources(i, node, self.sglang, self.collocated).items():
                key = (node.host, src.port)
                if key in seen_server:
                    j, other, osrc = seen_server[key]
                    fix = ("" if j == i else f"; nodes {other.split('/')[0]!r} and {node.name!r} share host "
                           f"{node.host}: give nodes[{i}] its own overrides.{OVERRIDE_KEY[role]}")
                    problems.append(CrossFieldError(
                        clash_loc(i, src, osrc, j == i),
                        f"server port {node.host}:{src.port} of {node.name}/{role} ({describe(src)}) collides "
                        f"with {other} ({describe(osrc)}){fix}"))
                seen_server.setdefault(key, (i, f"{node.name}/{role}", src))
            problems.extend(self._override_problems(i, node))
        if not self.collocated:
            for role in Role:
                if not any(n.has_role(role) for n in self.nodes):
                    problems.append(
                        CrossFieldError(
                            ("nodes",),
                            f"no node has role {role.value!r}; PD disaggregation needs at least one prefill "
                            f"and one decode node (set `collocated: true` for plain servers)",
                        )
                    )
        names_set = set(names)
        for j, (a, b) in enumerate(self.fabric.pingpong.explicit_pairs):
            for end in (a, b):
                if end not in names_set:
                    problems.append(
                        CrossFieldError(
                            ("fabric", "pingpong", "explicit_pairs", j), f"unknown node {end!r} in pair"
                        )
                    )
        prefix_names = Counter(p.name for p in self.router.prefixes)
        for k, prefix in enumerate(self.router.prefixes):
            if prefix_names[prefix.name] > 1:
                problems.append(
                    CrossFieldError(
                        ("router", "prefixes", k, "name"), f"duplicate prefix name {prefix.name!r}"
                    )
                )
        problems.extend(CrossFieldError(("router", "tenants", *loc), message)
                        for loc, message in tenant_problems(self.router.tenants))
        problems.extend(self._speculative_problems())
        problems.extend(self._pd_problems())
        problems.extend(self._hicache_problems())
        return problems

    def _hicache_problems(self) -> list[CrossFieldError]:
        """sglang.hicache: SGLang's HiCache rules (profile/hicache.py), with the roles this profile runs."""
        hc = self.sglang.hicache
        if hc is None:
            return []
        present = {"collocated"} if self.collocated else {r.value for r in Role if any(n.has_role(r) for n in self.nodes)}
        draft = self.models.draft if self.models else None
        found = hicache_problems(hc, collocated=self.collocated, roles_present=present,
                                 pinned_prefixes=any(p.pin for p in self.router.prefixes),
                                 spec_algorithm=draft.algorithm.value if draft else None)
        return [CrossFieldError(loc, message) for loc, message in found]

    def _speculative_problems(self) -> list[CrossFieldError]:
        """docs/speculative.md: pools name decode nodes (once), steps ranges are ordered, the pool settings
        are ones SGLang runs as written, and `act` has a router to drain through and measure at."""
        spec = self.speculative
        out: list[CrossFieldError] = []
        if spec.min_steps > spec.max_steps:
            out.append(CrossFieldError(("speculative", "min_steps"),
                                       f"min_steps {spec.min_steps} is above max_steps {spec.max_steps}"))
        if spec.control == "act" and "router" not in self.model_fields_set:
            out.append(CrossFieldError(
                ("speculative", "control"),
                "act needs a router: the controller measures acceptance at the router and drains each decode "
                "from it before the relaunch; add a `router:` section (and run `inferctl router serve`), or use "
                "control: advise"))
        server_role = "collocated" if self.collocated else "decode"
        servers = {n.name for n in self.nodes if self.collocated or n.has_role(Role.DECODE)}
        draft = self.models.draft if self.models else None
        owner: dict[str, str] = {}
        for i, pool in enumerate(spec.pools):
            loc = ("speculative", "pools", i)
            for j, name in enumerate(pool.nodes):
                if name not in servers:
                    known = "no such node" if name not in {n.name for n in self.nodes} else f"it runs no {server_role} server"
                    out.append(CrossFieldError((*loc, "nodes", j), f"{name!r}: {known}; a pool lists {server_role} nodes"))
                elif name in owner:
                    out.append(CrossFieldError((*loc, "nodes", j), f"{name!r} is already in pool {owner[name]!r}"))
                owner.setdefault(name, pool.name)
            lo, hi = pool.min_steps or spec.min_steps, pool.max_steps or spec.max_steps
            if lo > hi:
                out.append(CrossFieldError((*loc, "min_steps" if pool.min_steps else "max_steps"),
                                           f"min_steps {lo} is above max_steps {hi}"))
            if (pool.num_steps or pool.adaptive_steps) and (draft is None or draft.algorithm.value == "NGRAM"):
                out.append(CrossFieldError((*loc, "num_steps" if pool.num_steps else "adaptive_steps"),
                                           "needs an EAGLE-family draft in models.draft"))
                continue
            if pool.adaptive_steps is not None and draft is not None:
                if draft.algorithm.value not in ("EAGLE", "EAGLE3") or draft.eagle_topk not in (None, 1):
                    out.append(CrossFieldError(
                        (*loc, "adaptive_steps"),
                        f"SGLang runs --speculative-adaptive for EAGLE/EAGLE3 with eagle_topk 1 only (this draft: "
                        f"{draft.algorithm.value}, topk {draft.eagle_topk}); it would warn and run static steps"))
                launch = pool.num_steps or draft.num_steps
                if launch is not None and launch not in pool.adaptive_steps:
                    out.append(CrossFieldError(
                        (*loc, "adaptive_steps"),
                        f"the launch step count {launch} is not a candidate {sorted(set(pool.adaptive_steps))}; "
                        "SGLang refuses to start (set num_steps to one of them)"))
        names = Counter(p.name for p in spec.pools)
        for i, pool in enumerate(spec.pools):
            if names[pool.name] > 1:
                out.append(CrossFieldError(("speculative", "pools", i, "name"), f"duplicate pool name {pool.name!r}"))
        return out

    def _pd_problems(self) -> list[CrossFieldError]:
        """SGLang 0.5.23 refuses --enable-pd-role-switch with any speculative algorithm (its launch check,
        sglang/srt/arg_groups/pd_disaggregation_hook.py) and on a server that is not prefill/decode; the
        controller's `act` switches only servers launched with it and drains them through a router."""
        out: list[CrossFieldError] = []
        draft = self.models.draft if self.models else None
        if self.sglang.pd_role_switch and draft is not None:
            out.append(CrossFieldError(
                ("sglang", "pd_role_switch"),
                f"cannot be combined with speculative decoding (models.draft: {draft.algorithm.value}): SGLang "
                "refuses --enable-pd-role-switch with any speculative algorithm; remove models.draft or set "
                "sglang.pd_role_switch: false"))
        if self.sglang.pd_role_switch and self.collocated:
            out.append(CrossFieldError(("sglang", "pd_role_switch"),
                                       "needs prefill/decode servers; a collocated profile has no pools to switch"))
        if self.pd.control == "act" and not self.sglang.pd_role_switch:
            out.append(CrossFieldError(
                ("pd", "control"),
                "act switches only servers launched with role switching: set sglang.pd_role_switch: true (and "
                "relaunch), or use control: advise"))
        if self.pd.control != "off" and self.pd.stale_s <= self.router.health_interval_s:
            out.append(CrossFieldError(
                ("pd", "stale_s"),
                f"{self.pd.stale_s:g} s is not above router.health_interval_s ({self.router.health_interval_s:g} s): "
                "the router polls each worker's load that often, so every view would be stale and nothing would "
                "ever be switched"))
        if self.pd.control == "act" and "router" not in self.model_fields_set:
            out.append(CrossFieldError(
                ("pd", "control"),
                "act needs a router: the controller reads the pools there and drains each server through it; "
                "add a `router:` section (and run `inferctl router serve`), or use control: advise"))
        return out

    def _override_problems(self, i: int, node: Node) -> list[CrossFieldError]:
        problems = []
        for section, model in (("gpu", GpuPolicy), ("fabric", FabricPolicy)):
            overrides = getattr(node.overrides, section)
            if not overrides:
                continue
            base = getattr(self, section).model_dump()
            try:
                model.model_validate({**base, **overrides})
            except ValidationError as exc:
                for err in exc.errors():  # worded as for the fleet-wide section, "did you mean" included
                    loc = ("nodes", i, "overrides", section, *err["loc"])
                    problems.append(CrossFieldError(loc, error_message(model, err)))
        return problems

    # ---- lookups -------------------------------------------------------------------------------
    def ssh_port(self, node: Node) -> int:
        return node.port or self.ssh.port

    def server_ports(self, node: Node) -> dict[str, int]:
        """The HTTP (and bootstrap) ports the node's SGLang servers listen on."""
        return {role: src.port for role, src in port_sources(0, node, self.sglang, self.collocated).items()}

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def nodes_with_role(self, role: Role | str) -> list[Node]:
        return [n for n in self.nodes if n.has_role(role)]

    def gpu_policy_for(self, node: Node) -> GpuPolicy:
        if not node.overrides.gpu:
            return self.gpu
        return GpuPolicy.model_validate({**self.gpu.model_dump(), **node.overrides.gpu})

    def fabric_policy_for(self, node: Node) -> FabricPolicy:
        if not node.overrides.fabric:
            return self.fabric
        return FabricPolicy.model_validate({**self.fabric.model_dump(), **node.overrides.fabric})
