"""Several router replicas: what this replica knows of its state store (state_sync.py): whether it is
used (reachable, and not another fleet's), with the reason when not, and its clock."""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("infer_ctl.router.state")


class FleetConflict(Exception):
    """The namespace is in use by another fleet (no worker in common): see `StateSync._check_fleet`."""


class StoreUnavailable(Exception):
    """The state store cannot be reached: an admin change would apply to this replica only."""


class StoreHealth:
    """Up or down, and why; its metrics; the errors an admin change gets while it is down. `shown`: the
    store's URL without credentials."""

    def __init__(self, shown: str, registry: CollectorRegistry) -> None:
        self.shown = shown
        self.up = False
        self.error: str | None = "not connected yet"
        #: down because the namespace is another fleet's (FleetConflict), not because the store is unreachable
        self.conflict = False
        self._up_gauge = Gauge("inferctl_router_state_store_up", "1 while the shared state store is reachable",
                               registry=registry)
        self._another_fleet = Gauge("inferctl_router_state_store_another_fleet",
                                    "1 while the state store is not used: its namespace is another fleet's",
                                    registry=registry)
        self._failures = Counter("inferctl_router_state_store_failures_total",
                                 "Operations on the state store that failed (unreachable, timeout)", registry=registry)

    def failed(self) -> None:
        """An operation failed without taking the store down (a silent subscription, replaced)."""
        self._failures.inc()

    def down(self, exc: BaseException) -> None:
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        conflict = isinstance(exc, FleetConflict)
        if not conflict:  # the store answered: an alert on failures (or on up alone) would send one to the network
            self._failures.inc()
        self._another_fleet.set(int(conflict))
        if conflict and (self.up or not self.conflict):
            # once while it lasts: the workers named in the reason change with the other fleet's last replica
            log.error("state store not used: its namespace is another fleet's; serving with the state held, "
                      "admin changes refused", extra={"store": self.shown, "error": reason})
        elif not conflict and (self.up or self.error != reason):
            log.warning("state store unreachable: serving with the state held, admin changes refused",
                        extra={"store": self.shown, "error": reason})
        self.up = False
        self.error = reason
        self.conflict = conflict
        self._up_gauge.set(0)

    def connected(self, epoch: str | None) -> None:
        if not self.up:
            log.info("state store connected", extra={"store": self.shown, "epoch": epoch})
        self.up, self.error, self.conflict = True, None, False
        self._up_gauge.set(1)
        self._another_fleet.set(0)

    def refusal(self) -> StoreUnavailable:
        """The error of a change refused because the store is down: made on no replica."""
        if self.conflict:
            return StoreUnavailable(f"the shared state store {self.shown} is not used ({self.error}); the "
                                    "change was not made")
        return StoreUnavailable(f"the shared state store {self.shown} is unreachable ({self.error}); the change "
                                "was not made on any replica (a change on one only would make them diverge); retry "
                                "when `inferctl router status` shows it connected")

    def unknown(self, what: str) -> StoreUnavailable:
        """The error of a change sent that got no answer: a store that only stalled runs it when it resumes,
        and publishes it."""
        return StoreUnavailable(f"the shared state store {self.shown} did not answer the change ({self.error}): "
                                "it may have been made (then it is in force on every replica once the store "
                                f"answers again); check `inferctl router {what}` before retrying")


class StoreClock:
    """The store's clock as seen from this router's (`clock`): records carry absolute times on it, so
    replicas whose wall clocks (`wall`) disagree still expire a TTL at the same moment."""

    def __init__(self, clock: Callable[[], float], wall: Callable[[], float], shown: str) -> None:
        self.clock = clock
        self.wall = wall
        self.shown = shown
        #: store time minus clock(), measured with Redis TIME at every sync (None before the first)
        self.offset: float | None = None
        self._rtt: float | None = None

    def wall_offset(self) -> float:
        """What to add to clock() for the absolute time records carry: the store's clock, this host's wall
        clock before the first measurement."""
        if self.offset is not None:
            return self.offset
        return self.wall() - self.clock()

    def measured(self, t0: float, store_s: float, t1: float) -> None:
        """The store said `store_s` (its TIME) between t0 and t1 of clock()."""
        rtt = t1 - t0
        # keep the old reading unless this one is about as precise (a slow round trip widens the error)
        if self.offset is None or self._rtt is None or rtt <= 2 * self._rtt + 0.002:
            self.offset, self._rtt = store_s - (t0 + t1) / 2, rtt
        skew = self.wall() - self.clock() - self.offset
        if abs(skew) > 1.0:
            log.warning("this host's wall clock differs from the state store's: TTLs follow the store's",
                        extra={"store": self.shown, "skew_s": round(skew, 3)})

    def skew(self, now: float) -> float | None:
        """This host's wall clock minus the store's at monotonic `now`; None before the first measurement."""
        return None if self.offset is None else self.wall() - now - self.offset
