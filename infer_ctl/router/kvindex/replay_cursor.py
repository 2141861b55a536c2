"""Where a replay stands: which batch comes next, what to do with each one received, when to ask again.

Pure (no sockets, no event loop): kv_subscriber.py's replay feeds it the seq numbers of what its DEALER
receives and the timeouts of its waits, and does what each `Step` says. Why each rule:

- a batch below what is needed (already applied, or below `start`) is skipped: a late answer to an
  earlier request, or a live batch the replay already had;
- a batch past what is needed is a gap *inside* the answer. SGLang's replay ROUTER (0.5.23
  `_service_replay`) sends its whole buffer in one loop, and a ROUTER drops what does not fit the
  peer's pipe (its SNDHWM, 1,000): under load an answer arrives with holes. The hole is asked for again
  from the missing seq (at most `gap_asks` times for the same missing seq); the rest of the holed
  answer, up to its end marker, is skipped. A buffer that really starts later than needed answers the
  new request with the same hole, and after `gap_asks` the replay fails (the stream is untrusted, as
  before this existed). The bound is per missing seq, not per replay: a long buffer (10,000 batches
  through a 1,000-message pipe) has a hole in each of several answers, each one further on, and a
  replay bounded to 3 holes in all failed 1 restart in 5 ("the worker's buffer starts at seq 8153, after
  8011 (3 requests again)", scripts/bench_kv_replay.py); each answer that moves on applies a batch at
  least, so `max_batches` still bounds the whole;
- answers come back in the order asked (one ROUTER, one DEALER, one replay thread): an end marker while
  a holed answer is still open ends that answer; the end of the last one asked ends the replay;
- no message within a wait: asked again from what is missing, each wait twice as long, at most
  `attempts` requests (a publisher, or this router, slowed by a loaded host answers late, not never);
- a replay is held to its own budget (`max_batches`), not the live stream's flood limit: SGLang buffers
  10,000 batches by default and every router start replays from 0, so a busy worker's legitimate
  replay is thousands of batches within a second.
"""

from __future__ import annotations

from dataclasses import dataclass

END_SEQ = -1


@dataclass(frozen=True)
class Step:
    #: apply | skip | ask (send a request from `seq`) | done | fail (`why`)
    kind: str
    seq: int = 0
    why: str = ""


SKIP = Step("skip")
DONE = Step("done")


class ReplayCursor:
    def __init__(self, start: int, last: int | None, *, attempts: int = 3, gap_asks: int = 3,
                 max_batches: int = 100_000, timeout_s: float) -> None:
        """`last`: the stream's last applied seq (None: nothing applied yet). The first request (from
        `start`) is the caller's to send. `timeout_s`: router.kv_events.replay_timeout_s (no default here)."""
        self.start = start
        self.last = last
        self.attempts = attempts
        self.gap_asks = gap_asks
        self.max_batches = max_batches
        self.timeout_s = timeout_s
        self.requests = 1
        self.gaps = 0
        self.batches = 0
        self.waited = 0.0
        #: holed answers still arriving (each ends with its own end marker before the next one starts)
        self._holed = 0
        #: the seq the last hole asked for, and how many asks it had: the bound is per missing seq
        self._asked: int | None = None
        self._asks = 0

    @property
    def want(self) -> int:
        """The next seq the stream needs."""
        return self.start if self.last is None else max(self.start, self.last + 1)

    def message(self, seq: int) -> Step:
        """A received batch's seq (END_SEQ: an end marker)."""
        if seq == END_SEQ:
            if self._holed > 0:
                self._holed -= 1
                return SKIP
            return DONE
        if seq < self.start or (self.last is not None and seq <= self.last):
            return SKIP
        want = self.want
        if seq == want:
            self.batches += 1
            if self.batches > self.max_batches:
                return Step("fail", why=f"more than {self.max_batches} batches in one replay")
            self.last = seq
            return Step("apply", seq)
        if self._holed > 0:
            return SKIP  # the rest of an answer with a hole: the next answer starts at `want`
        if want != self._asked:  # the answers moved on since the last hole: its asks are not this one's
            self._asked, self._asks = want, 0
        if self._asks >= self.gap_asks:
            return Step("fail", why=f"the worker's buffer starts at seq {seq}, after {want}"
                        + (f" ({self._asks} requests again)" if self._asks else ""))
        self._asks += 1
        self.gaps += 1
        self._holed += 1
        self.requests += 1
        return Step("ask", want)

    def timeout(self) -> Step:
        """No message within `wait_s`: ask again (the earlier answer counts as lost) or give up."""
        self.waited += self.wait_s
        if self.requests - self.gaps >= self.attempts:
            return Step("fail", why=f"no replay answer within {self.waited:g}s ({self.requests - self.gaps} requests)")
        self.requests += 1
        self._holed = 0
        return Step("ask", self.want)

    @property
    def wait_s(self) -> float:
        """The current request's wait: doubled with every timed-out request."""
        return self.timeout_s * 2 ** (self.requests - self.gaps - 1)
