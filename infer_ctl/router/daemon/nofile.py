"""Descriptors at router start: the soft RLIMIT_NOFILE raised to the hard one, and the connection cap
that leaves room under it.

systemd starts services with a soft limit of 1,024 (DefaultLimitNOFILE=1024:524288), which would cap a
router near 1,000 clients; the hard limit is the most an unprivileged process may take, so the router
takes it (the units in templates/ also set LimitNOFILE=). Past the cap a client is answered 503 with
Retry-After instead of the accept failing with EMFILE, which resets every new client (issue 28 item 4).

The default cap is what is left of the limit once the other descriptors are budgeted: `RESERVE` (the
listening, KV event and admin sockets, log and metrics files), the refused connections lingering while
their clients read the 503 (`refusing_budget`), and two upstream connections (a PD pair) for each
request in flight. Measured with 22,000 idle connections on a 20,000 limit (scripts/bench_router_attack.py
connections): a cap of limit - 256 left no descriptor for the 256 lingering refusals, so the accept
failed with EMFILE and the clients past the cap were reset instead of answered."""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("infer_ctl.router")

#: descriptors kept for the router's own sockets and files
RESERVE = 64
#: the most refused connections lingering at once (each holds a descriptor for up to a second)
MAX_REFUSING = 1024
#: the default cap's ceiling: more idle connections than this per process are an attack, not a load
DEFAULT_MAX = 50_000


def raise_nofile() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (logging both); returns (soft, hard) in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = soft
    if hard == resource.RLIM_INFINITY or soft < hard:
        # RLIM_INFINITY as the hard limit: the kernel's nr_open bounds what the soft one may become
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the soft descriptor limit", extra={"soft": soft, "hard": hard, "error": str(exc)})
    log.info("descriptor limit", extra={"nofile_soft_before": before, "nofile_soft": soft, "nofile_hard": hard})
    return soft, hard


def refusing_budget(soft: int) -> int:
    """Refused connections that may linger at once under the soft limit `soft` (an eighth of it at most)."""
    return max(1, min(MAX_REFUSING, soft // 8))


def default_max_connections(soft: int, max_concurrent: int) -> int:
    """The cap when router.max_connections is unset, from the soft limit in force (after raise_nofile):
    clients C and their upstream connections (2 per request in flight, at most max_concurrent of them)
    fit beside the reserve and the lingering refusals: C + 2 * min(C, max_concurrent) <= what is left."""
    left = soft - RESERVE - refusing_budget(soft)
    return max(1, min(DEFAULT_MAX, max(left - 2 * max_concurrent, left // 3)))
