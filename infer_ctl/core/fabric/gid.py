"""RoCE GID-index choice, following perftest's `get_best_gid_index` scoring.

The mlx5 layout 0/1 = link-local v1/v2, 2/3 = IPv4 v1/v2 is common but not universal (perftest#44,
ucx#7785; the Intel E810 fixture has IPv4 v2 at index 1), so the index is never hard-coded: each GID
scores +100 when its family is the preferred one (IPv4-mapped unless IPv6 is asked for, perftest's
`--ipv6`; profile `fabric.gid_family`), +10 when it is not link-local (fe80::/10, or 169.254.0.0/16
inside an IPv4-mapped GID), plus its RoCE version (2 for v2, 1 for v1). The highest score wins; ties
keep the lowest index, as perftest's scan does. This is perftest's `compute_gid_score` since its
commit 57927ab (2026-04); older perftest compared GIDs pairwise and could pick a link-local IPv6 GID
over a global one, which this scoring deliberately does not reproduce.
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


def _ipv4_mapped(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """perftest's ipv6_addr_v4mapped(): ::ffff:a.b.c.d, and IPv4 multicast encoded as ff0e::ffff:a.b.c.d."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    raw = addr.packed
    if raw[:4] == b"\xff\x0e\x00\x00" and raw[4:10] == bytes(6) and raw[10:12] == b"\xff\xff":
        return ipaddress.IPv4Address(raw[12:])
    return None


def _family(addr: ipaddress.IPv6Address) -> Family:
    return "ipv4" if _ipv4_mapped(addr) is not None else "ipv6"


def _link_local(addr: ipaddress.IPv6Address) -> bool:
    v4 = _ipv4_mapped(addr)
    return v4.is_link_local if v4 is not None else addr.is_link_local


def gid_family(gid: str) -> Family | None:
    addr = _address(gid)
    return _family(addr) if addr is not None else None


def is_link_local(gid: str) -> bool:
    addr = _address(gid)
    return addr is not None and _link_local(addr)


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
    score = 100 if _family(addr) == prefer else 0
    if not _link_local(addr):
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
