"""RoCE GID-index choice, following perftest's `get_best_gid_index` scoring.

The mlx5 layout 0/1 = link-local v1/v2, 2/3 = IPv4 v1/v2 is common but not universal (perftest#44,
ucx#7785; the Intel E810 fixture has IPv4 v2 at index 1), so the index is never hard-coded: each GID
scores +100 when its family is the preferred one (IPv4-mapped unless IPv6 is asked for), +10 when it
is not link-local, plus its RoCE version (2 for v2, 1 for v1). The highest score wins; ties keep the
lowest index, as perftest's scan does.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

Family = Literal["ipv4", "ipv6"]


class GidLike(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def gid(self) -> str: ...
    @property
    def type(self) -> str | None: ...


@dataclass(frozen=True)
class GidChoice:
    index: int
    gid: str
    family: Family
    roce_version: int
    link_local: bool
    score: int


def _address(gid: str) -> ipaddress.IPv6Address | None:
    try:
        return ipaddress.IPv6Address(gid.strip())
    except ValueError:
        return None


def gid_family(gid: str) -> Family | None:
    addr = _address(gid)
    if addr is None:
        return None
    return "ipv4" if addr.ipv4_mapped is not None else "ipv6"


def is_link_local(gid: str) -> bool:
    addr = _address(gid)
    return bool(addr and addr.is_link_local)


def roce_version(gid_type: str | None) -> int:
    """2 for "RoCE v2", 1 for "IB/RoCE v1" / "RoCE v1", 0 when unknown."""
    t = (gid_type or "").lower()
    if "v2" in t:
        return 2
    if "v1" in t:
        return 1
    return 0


def score_gid(entry: GidLike, prefer: Family = "ipv4") -> int | None:
    """perftest's score; None for an empty or unparsable slot."""
    addr = _address(entry.gid)
    if addr is None or addr.packed == bytes(16):
        return None
    family = "ipv4" if addr.ipv4_mapped is not None else "ipv6"
    score = 100 if family == prefer else 0
    if not addr.is_link_local:
        score += 10
    return score + roce_version(entry.type)


def describe(entry: GidLike, prefer: Family = "ipv4") -> GidChoice | None:
    score = score_gid(entry, prefer)
    family = gid_family(entry.gid)
    if score is None or family is None:
        return None
    return GidChoice(entry.index, entry.gid, family, roce_version(entry.type), is_link_local(entry.gid), score)


def choose_gid(entries: Iterable[GidLike], prefer: Family = "ipv4") -> GidChoice | None:
    best: GidChoice | None = None
    for entry in sorted(entries, key=lambda e: e.index):
        choice = describe(entry, prefer)
        if choice is not None and (best is None or choice.score > best.score):
            best = choice
    return best
