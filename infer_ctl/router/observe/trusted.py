"""Which clients may name their tenant by header (router.tenant_trusted_proxies, issue 28 item 8).

In header mode (tenants without API keys, docs/observability.md) the tenant is whatever the request's
`tenant_header` says, so any client that reaches the router can claim any tenant - its limits, its
bill. The intended deployment puts an authenticating proxy in front that sets the header; this list
names those proxies (CIDRs), and a header from any other address is refused (403: a client that names
a tenant it may not name should hear so, not be charged to the default tenant silently). With no list,
every client is trusted, as before, and the router logs a warning at start."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from infer_ctl.errors import UsageError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(cidrs: Sequence[str]) -> tuple[Network, ...]:
    """CIDRs (or bare addresses) to networks; host bits set are refused (a typo, e.g. 10.0.0.1/8)."""
    out = []
    for c in cidrs:
        try:
            out.append(ipaddress.ip_network(str(c).strip()))
        except ValueError as exc:
            raise UsageError(f"router.tenant_trusted_proxies: {c!r} is not a CIDR ({exc})",
                             remedy="give networks such as 10.0.0.0/24 or addresses such as 10.0.0.5") from None
    return tuple(out)


def trusted(networks: tuple[Network, ...], peer: str | None) -> bool:
    """Whether `peer` (the connection's remote address) is one of `networks`; a client on a unix socket or
    with no address is not. An IPv4 client seen as ::ffff:a.b.c.d on a dual-stack socket is matched as
    a.b.c.d."""
    if peer is None:
        return False
    try:
        addr = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return any(addr in net for net in networks)
