"""Flap damping of a worker's health (time passed in): a worker that goes unhealthy again soon after it
was let back is held out longer each time, as BGP route-flap damping (RFC 2439) and Envoy's outlier
ejection (`base_ejection_time` times the ejection count) do.

An ejection (healthy -> unhealthy) less than `stable_s` after the worker's last readmission is a flap.
The n-th flap in a row sets the hold-down to `base_s * 2**(n - 1)`, at most `cap_s`; an ejection that is
not a flap (the first one, or one after the worker stayed healthy `stable_s`) sets none. The hold-down
runs from the worker's first passing check after the ejection, and a failed check starts it over: the
worker is let back once it has answered every check for the whole hold-down. Counted from the
ejection instead, a hold-down shorter than the restart (an SGLang server loads its weights for tens
of seconds to minutes) would pass while nothing answers, and a crash-looping server would be let back
on its first answer every time, which is what damping is for. A worker that stays healthy `stable_s`
after a readmission starts over (`settle`): its next ejection is a first one again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FlapDamper:
    #: times the worker went unhealthy, and the flaps in a row among them
    ejections: int = 0
    flaps: int = 0
    #: the hold-down of the current ejection (0: none)
    holddown_s: float = 0.0
    #: when it was last readmitted (None: never, since the router took it on), and since when it has
    #: answered every check while it is out (None: its last check failed)
    up_at: float | None = None
    answering_since: float | None = None

    def eject(self, now: float, *, base_s: float, cap_s: float, stable_s: float) -> float:
        """The worker went unhealthy at `now`: the hold-down chosen for its readmission."""
        self.ejections += 1
        if self.up_at is not None and now - self.up_at < stable_s:
            self.flaps += 1
            # the exponent bounded: 2.0 ** 1024 raises OverflowError, and a crash loop reaches 1025 flaps
            # in a row in about an hour with damping off (cap 0) or in a night at a 60 s cap; 2 ** 64 times
            # any base is past every cap that means something
            self.holddown_s = max(0.0, min(cap_s, base_s * 2.0 ** min(self.flaps - 1, 64)))
        else:
            self.flaps, self.holddown_s = 0, 0.0
        self.answering_since = None
        return self.holddown_s

    def checked(self, ok: bool, now: float) -> None:
        """A check of the worker while it is out: the hold-down runs while it answers."""
        if not ok:
            self.answering_since = None
        elif self.answering_since is None:
            self.answering_since = now

    def restarted(self, now: float) -> None:
        """A check while it is out found a new process (its /server_info start time changed): the one that
        answered before crashed between two checks, so the hold-down starts over from this answer. Without
        this a server that crash-loops faster than the probe period never fails a check and is let back."""
        self.answering_since = now

    def admits(self, now: float) -> bool:
        """Has its hold-down passed (it answered every check for that long)?"""
        return self.left_s(now) <= 0.0

    def left_s(self, now: float) -> float:
        """Seconds of hold-down still to go: the whole of it while the worker does not answer."""
        if self.holddown_s <= 0.0:
            return 0.0
        if self.answering_since is None:
            return self.holddown_s
        return max(0.0, self.holddown_s - (now - self.answering_since))

    def readmit(self, now: float) -> None:
        self.up_at, self.holddown_s, self.answering_since = now, 0.0, None

    def settle(self, now: float, stable_s: float) -> None:
        """A passing check of a healthy worker: up `stable_s` since its readmission, its flaps are forgotten."""
        if self.flaps and self.up_at is not None and now - self.up_at >= stable_s:
            self.flaps = 0
