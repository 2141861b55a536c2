"""What a KV-event stream's sequence numbers say: its health state, what each live batch is, when to replay.

Pure (no sockets, no event loop, no index): kv_subscriber.py feeds it the seq of every live batch and
the outcome of every replay (the replay's own rules: replay_cursor.py), and does what it answers. The
rules (kv_subscriber.py's docstring says why each one):

- a stream starts `replaying` with a resync pending: replay from seq 0 before trusting anything;
- live seq last + 1 is applied; a jump is a gap (replay from last + 1, then untrusted if the replay did
  not reach the batch in hand); seq at or below last is a restarted publisher (blocks dropped, applied
  from 0 or replayed from 0), except the live copies of batches a replay already applied (`dup_from`,
  `dup_upto`);
- an untrusted stream only reads batches for an AllBlocksCleared (`repair`); a down one reads nothing;
- a dropped connection replays from the seq after the last applied one on the next subscription.

`FloodWindow` and `ByteRate` are the publisher's and the replay's rate limits, with the clock passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

EXACT, REPLAYING, UNTRUSTED, DOWN = "exact", "replaying", "untrusted", "down"


@dataclass(frozen=True)
class Live:
    """What one live batch is. kind: apply | skip (a replayed duplicate) | repair (the stream is
    untrusted: only a clear counts) | restart (the publisher started again) | gap (replay from `seq`
    first) | no_history (joined after seq 0 with no replay endpoint)."""

    kind: str
    seq: int = 0


APPLY, SKIP, REPAIR, RESTART, NO_HISTORY = Live("apply"), Live("skip"), Live("repair"), Live("restart"), Live("no_history")


class StreamSequence:
    def __init__(self) -> None:
        self.state = REPLAYING
        self.reason = "starting"
        #: the last batch applied (None: none yet, or what was applied was dropped)
        self.last_seq: int | None = None
        #: replay from 0 before trusting anything (a start, a worker restart)
        self.resync = True
        #: live seqs in (dup_from, dup_upto] were already applied from a replay
        self.dup_from = -1
        self.dup_upto = -1
        #: after a dropped connection: the seq to replay from on the next subscription
        self.replay_from: int | None = None

    @property
    def exact(self) -> bool:
        return self.state == EXACT

    # ---- what the stream is told ----------------------------------------------------------------------
    def restarted(self, why: str) -> None:
        """The worker process is new: its seq starts at 0 again (the caller drops the blocks)."""
        self.state, self.reason = REPLAYING, why
        self.last_seq = None
        self.resync = True

    def down(self, why: str) -> None:
        self.state, self.reason = DOWN, why
        self.last_seq = None

    def dropped(self) -> None:
        """The subscription's connection dropped: what was published meanwhile is replayed (when the
        stream knows where it stood)."""
        if self.state in (EXACT, REPLAYING) and self.last_seq is not None:
            self.replay_from = self.last_seq + 1
            self.state, self.reason = REPLAYING, f"connection dropped after seq {self.last_seq}"

    def untrusted(self, message: str) -> bool:
        """Whether the stream was not untrusted before."""
        newly = self.state != UNTRUSTED
        self.state, self.reason = UNTRUSTED, message
        return newly

    def repaired(self, seq: int) -> None:
        """A batch with an AllBlocksCleared was applied into fresh blocks: the stream is exact again."""
        self.last_seq = seq
        self.dup_from = self.dup_upto = -1
        self.state, self.reason = EXACT, "repaired by AllBlocksCleared"

    def applied(self, seq: int) -> None:
        self.last_seq = seq

    # ---- live batches ---------------------------------------------------------------------------------
    def ignores_live(self, has_replay: bool) -> bool:
        """Down; or restarted while a live batch was on its way: the replay from 0 that comes next has it."""
        return self.state == DOWN or (self.resync and has_replay)

    def live(self, seq: int) -> Live:
        if seq > self.dup_upto:
            # past the replayed range: the live copies of it (queued in order before this one) are behind
            # us, so a seq at or below it from now on is a restarted publisher, not a duplicate
            self.dup_from = self.dup_upto = -1
        if self.state == UNTRUSTED:
            return REPAIR
        last = self.last_seq
        if last is None:
            return APPLY if seq == 0 else NO_HISTORY  # seq 0: a publisher that started after we subscribed
        if seq == last + 1:
            return APPLY
        if seq <= last:
            return SKIP if self.dup_from < seq <= self.dup_upto else RESTART
        return Live("gap", last + 1)

    def restart_at(self, seq: int) -> bool:
        """A restarted publisher's first live batch (blocks dropped): whether it is applied at once (seq
        0), else the stream replays from 0 first."""
        self.last_seq = -1 if seq == 0 else None
        return seq == 0

    def after_replay(self, seq: int) -> str:
        """The live batch in hand once the replay it caused is over: apply (it follows), gap (the replay
        stopped short of it: untrusted), or none (the replay had it, or failed)."""
        if not self.exact or self.last_seq is None:
            return "none"
        if seq == self.last_seq + 1:
            return "apply"
        return "gap" if seq > self.last_seq + 1 else "none"

    # ---- replays --------------------------------------------------------------------------------------
    def take_replay(self) -> tuple[bool, int | None]:
        """Before the next live message: whether a replay is due (the live receive then stops: the
        replay reads the sockets), and from which seq (None: due, but moot, as the stream is not
        replaying any more)."""
        if self.resync and self.state != DOWN:
            self.resync, self.replay_from = False, None
            return True, 0
        if self.replay_from is not None:
            start, self.replay_from = self.replay_from, None
            return True, start if self.state == REPLAYING else None
        return False, None

    def replay_without_endpoint(self, start: int) -> bool:
        """No replay socket: a stream that never applied anything trusts the next batch (it must be seq
        0); whether so, else the replay failed."""
        if start == 0 and self.last_seq is None:
            self.state, self.reason = EXACT, "no replay endpoint: from the next batch on"
            return True
        return False

    def replay_begins(self, start: int) -> int:
        """The replay's baseline: the last seq applied before it (-1: none)."""
        self.state, self.reason = REPLAYING, f"replaying from seq {start}"
        return self.last_seq if self.last_seq is not None else -1

    def replay_applies(self, seq: int) -> None:
        """The replay applies `seq` next: with nothing applied before, the stream starts there."""
        if self.last_seq is None:
            self.last_seq = seq - 1

    def replayed(self, start: int, from_seq: int) -> None:
        """The replay ended in sync: the live copies of what it applied are duplicates."""
        if self.last_seq is None:
            self.last_seq = start - 1  # nothing published yet: the next batch is `start`
        self.dup_from, self.dup_upto = from_seq, self.last_seq
        self.state, self.reason = EXACT, "in sync"


class Flood(Exception):
    """A publisher over its flood limits (live or replay): the stream's task closes its sockets for a pause."""


class FloodWindow:
    """Batches and bytes a second of one publisher, over a one-second window: a flood's reason, or None."""

    def __init__(self, max_batches_per_s: int, max_bytes_per_s: int) -> None:
        self.max_batches_per_s = max_batches_per_s
        self.max_bytes_per_s = max_bytes_per_s
        self.start, self.count, self.nbytes = 0.0, 0, 0

    def over(self, size: int, now: float) -> str | None:
        if now - self.start >= 1.0:
            self.start, self.count, self.nbytes = now, 0, 0
        self.count += 1
        self.nbytes += size
        why = None
        if self.count > self.max_batches_per_s:
            why = f"more than {self.max_batches_per_s} batches/s"
        elif self.nbytes > self.max_bytes_per_s:
            why = f"more than {self.max_bytes_per_s} bytes/s"
        if why is not None:
            self.start, self.count, self.nbytes = now, 0, 0
        return why


class ByteRate:
    """Bytes a second over a one-second window (a replay's budget): whether one more message goes over."""

    def __init__(self, limit: int, now: float) -> None:
        self.limit = limit
        self.start = now
        self.n = 0

    def over(self, size: int, now: float) -> bool:
        if now - self.start >= 1.0:
            self.start, self.n = now, 0
        self.n += size
        return self.n > self.limit
