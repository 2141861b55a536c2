"""Descriptors at router start: the soft RLIMIT_NOFILE raised to the hard one, and the connection cap
that leaves room under it.

systemd starts services with a soft limit of 1,024 (DefaultLimitNOFILE=1024:524288), which would cap a
router near 1,000 clients; the hard limit is the most an unprivileged process may take, so the router
takes it (the units in templates/ also set LimitNOFILE=). The cap defaults to the hard limit less 256
descriptors (upstream connections, the KV event sockets, the admin socket, log and metrics files), at
most 50,000 connections: past the cap a client is answered 503 with Retry-After instead of the accept
failing with EMFILE, which resets every new client (issue 28 item 4)."""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("infer_ctl.router")

#: descriptors kept free of client connections
HEADROOM = 256
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


def default_max_connections(soft: int) -> int:
    """The cap when router.max_connections is unset, from the soft limit in force (after raise_nofile)."""
    return max(1, min(soft - HEADROOM, DEFAULT_MAX))
