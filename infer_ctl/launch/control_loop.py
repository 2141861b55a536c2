"""What the fleet controllers (`spec control`, `pd control`) share: one decision record posted to the router
and appended to the history file, the round loop (which outlives a router that does not answer for a while),
one round at a time per state file (`LockedRounds`), and where that state file is by default."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import ipaddress
import json
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from infer_ctl.atomicfile import append_line, write_atomic
from infer_ctl.errors import InferctlError
from infer_ctl.paths import state_dir
from infer_ctl.router.control.client import RouterRefused, RouterUnreachable


def router_key(url: str) -> str:
    """A short stable name for the router a controller talks to: its URL as typed in any of the ways that
    reach the same place (`127.0.0.1:8177`, `HTTP://127.0.0.1:8177/`), hashed."""
    u = urlsplit(url.strip() if "://" in url else f"http://{url.strip()}")
    scheme, host = u.scheme.lower(), (u.hostname or "").lower()
    with contextlib.suppress(ValueError):  # an IPv6 address in any of its spellings ([::1], [0:0:...:1])
        host = ipaddress.ip_address(host).compressed
    host = f"[{host}]" if ":" in host else host
    try:
        port = u.port
    except ValueError:  # not a port: kept as typed, as the URL itself will fail to connect
        port = None
    # the scheme's own port is the same place as no port (`http://router` and `http://router:80`)
    netloc = host if port in (None, {"http": 80, "https": 443}.get(scheme)) else f"{host}:{port}"
    canon = f"{scheme}://{netloc}{u.path.rstrip('/')}"
    return hashlib.blake2b(canon.encode(), digest_size=5).hexdigest()


def default_state_path(kind: str, profile_name: str, router_url: str) -> Path:
    """`<state dir>/<kind>-<profile>-<router_key>.json`: one state (and lock) per cluster. By the profile's
    name alone, two clusters whose profiles share a name shared one file: each controller read the other's
    `fatal` servers and cool-down, and while one was in its round the other's was skipped."""
    return state_dir() / f"{kind}-{profile_name}-{router_key(router_url)}.json"


def legacy_state_path(kind: str, profile_name: str) -> Path:
    """Where versions before `default_state_path` kept the state: read while the new file is absent."""
    return state_dir() / f"{kind}-{profile_name}.json"


def append_action(history: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """One JSON line, appended the audit history's own way (atomicfile.append_line)."""
    append_line(history, json.dumps(record, separators=(",", ":")))


def post_action(client: Any, path: str, history: str | os.PathLike[str] | None, kind: str, profile_name: str,
                rec: dict[str, Any], *, timespec: str = "seconds") -> dict[str, Any]:
    """Stamp a decision, tell the router (`POST path`) and append it to the history (JSON lines)."""
    rec = {"ts": datetime.now(UTC).isoformat(timespec=timespec).replace("+00:00", "Z"), **rec}
    try:
        client.call("POST", path, rec)
    except InferctlError as exc:  # the router went away: the history and the output still have it
        rec["router_error"] = exc.message
    if history is not None:
        append_action(history, {"kind": kind, "profile_name": profile_name, **rec})
    return rec


def transient(exc: InferctlError) -> bool:
    """A round's error that a loop outlives: no answer from the router (stopped, restarting, a network
    error, a timeout), or a proxy in front of it saying it is away (502, 503, 504). Anything else (a
    refused token, a state file or lock that cannot be used) is no better at the next round."""
    return isinstance(exc, RouterUnreachable) or (isinstance(exc, RouterRefused) and exc.status in (502, 503, 504))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _n_rounds(n: int) -> str:
    return f"{n} round" if n == 1 else f"{n} rounds"


def run_rounds(tick: Callable[[], list[dict[str, Any]]], interval_s: float, *, rounds: int | None = None,
               stop: Callable[[], bool] = lambda: False,
               on_records: Callable[[list[dict[str, Any]]], None] = lambda _r: None) -> None:
    """Call `tick` every `interval_s` (measured from each round's start) until `stop()` or `rounds`."""
    n = 0
    while not stop() and (rounds is None or n < rounds):
        started = time.monotonic()
        on_records(tick())
        n += 1
        if rounds is not None and n >= rounds:
            break
        end = started + interval_s
        while not stop() and (left := end - time.monotonic()) > 0:  # a stop asked meanwhile: now
            time.sleep(min(left, 0.2))


class StopAfterRound:
    """SIGTERM (systemd's stop) or SIGINT (Ctrl-C) while a controller runs: the round in progress finishes,
    then the loop stops (`stop`, for `run_rounds`). Cut at once, a switch or relaunch left its server
    drained half way, in no record, and the state unsaved (no cool-down, no `fatal`); the next round took
    the drained server for one down. A second signal stops at once (KeyboardInterrupt)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.requested = False

    def stop(self) -> bool:
        return self.requested

    def _handler(self, signum: int, _frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.say(f"{signal.Signals(signum).name}: stopping once this round ends (again: at once)")

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopAfterRound]:
        """The handlers, for the `with` block (the main thread only: elsewhere Python has no handlers)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        for sig in old:
            signal.signal(sig, self._handler)
        try:
            yield self
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)


class StateFileError(InferctlError):
    """The state file is there but is not the controller's JSON (cut short, edited, another file), or it
    cannot be read or written."""


def unreadable(path: str | os.PathLike[str], why: str) -> StateFileError:
    return StateFileError(
        f"the controller state file {path} cannot be read: {why}",
        remedy="look at it (its timers and fatal servers); it is left as it is: move it aside to start with an "
               "empty state (the controller then forgets the servers it marked fatal and its cool-down)")


def read_state(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A controller's state file as its JSON object; None when there is none. One that is there but does
    not read is an error (`StateFileError`), not an empty state: the round would save over it and forget
    the fatal servers and the cool-down it holds (the file is only ever replaced whole, by rename, so it
    is never cut short by a controller; what breaks it came from outside)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        raise StateFileError(f"the controller state file {path} cannot be read: {exc.strerror}",
                              remedy="run as the user the controller runs as (the file's owner)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise unreadable(path, getattr(exc, "strerror", None) or str(exc)) from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise unreadable(path, f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise unreadable(path, "not a JSON object")
    return doc


def write_state(path: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """The state file replaced whole (atomicfile.write_atomic: a kill mid-write leaves the old one); one
    that cannot be written (a read-only or full filesystem) is an error naming it, not an internal error."""
    try:
        write_atomic(path, json.dumps(doc, indent=1) + "\n")
    except OSError as exc:
        raise StateFileError(f"cannot write the controller state file {path}: {exc.strerror or exc}",
                              remedy="pass --state in a writable directory, or free space there") from None


def skip_line(skip: dict[str, Any]) -> str:
    """A skipped round in words: who holds the lock, where known."""
    h = skip.get("holder") or {}
    who = f"another controller (pid {h.get('pid')} on {h.get('host')}, since {h.get('since')})" if h else \
        "another controller"
    return f"skipped: {who} holds {skip['lock']}: this round did not run"


def unreachable_line(rounds: LockedRounds) -> str:
    """A loop's rounds that could not reach the router, in words (its exit is 3 unless one failed)."""
    last = rounds.outages[-1]
    now = f"back at {last['back']}" if last["back"] else "still unreachable when the loop stopped"
    return (f"{rounds.rounds_unreachable} of {_n_rounds(rounds.rounds_run)} could not reach the router "
            f"({rounds.outages_seen} time(s); the last since {last['since']}, {now}): {last['error']}")


#: the most of a lock file read for its holder: the holder writes ~80 bytes; a huge file (not ours) is not
#: read whole
HOLDER_MAX_BYTES = 4096


class LockUnusable(InferctlError):
    """`<state>.lock` cannot be opened or locked: a symlink, not a file, a directory that refuses it."""


def _open_lock(path: str) -> int:
    """The lock file, opened read-write (created if absent). A symbolic link is refused, not followed: the
    holder truncates and rewrites the file, which through a link is whatever file it points to. Not a
    regular file (a FIFO, a device) is refused too: a reader of its holder would block."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if os.path.islink(path):
            why = "it is a symbolic link (not followed: the lock's holder rewrites the file)"
        elif exc.errno in (errno.EACCES, errno.EPERM):
            # not "remove it": a controller running meanwhile keeps its flock on the old file, and the
            # next one locks the new file: two rounds at once
            raise LockUnusable(f"cannot use the controller lock {path}: {exc.strerror}",
                               remedy="run as the user the controller runs as (the lock's owner)") from None
        else:
            why = exc.strerror or str(exc)
        raise LockUnusable(f"cannot use the controller lock {path}: {why}",
                           remedy=f"remove {path} (or pass another --state); it is recreated as a plain file") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LockUnusable(f"cannot use the controller lock {path}: not a regular file",
                           remedy=f"remove {path} (or pass another --state); it is recreated as a plain file")
    return fd


def _alive_here(holder: dict[str, Any]) -> bool:
    """False only when the holder ran on this host and its pid is gone: left by a holder killed -9 and read
    in the instant before the new holder wrote itself over it."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # alive, another user's
    return True


class LockedRounds:
    """One round at a time per state file, across processes (a cron run overlapping the unit, a round that
    outlasts the interval: a relaunch or a drain takes minutes): flock on `<state>.lock`, which the kernel
    releases when the holder dies, even by kill -9. Without it two rounds read the same cool-down and both
    act. The holder writes who it is into the lock file, so that the round it makes skip can name it; a
    skipped round is counted and described (`last_skip`), for the command to say so rather than look like
    a round that found nothing to do."""

    def __init__(self, state_path: str | os.PathLike[str] | None, say: Callable[[str], None],
                 legacy_path: str | os.PathLike[str] | None = None) -> None:
        self.state_path = Path(state_path) if state_path is not None else None
        self.say = say
        #: rounds that ran, rounds skipped (another controller held the lock) and the last skip's why
        self.rounds_run = 0
        self.rounds_skipped = 0
        self.last_skip: dict[str, Any] | None = None
        #: rounds that could not reach the router (a loop goes on: `outliving`), and each spell of them
        #: (`since`, `last`, `rounds`, `error`, `back`: when the router answered again, None while it does
        #: not), the last OUTAGES_KEPT
        self.rounds_unreachable = 0
        self.outages: list[dict[str, Any]] = []
        self.outages_seen = 0
        self._told_at = 0.0
        #: the state file of a version before per-cluster default paths, read while `state_path` is absent
        self.legacy_path = Path(legacy_path) if legacy_path is not None else None
        self._legacy_said = False

    #: the outages kept for the report (a router flapping every round for a day would be thousands)
    OUTAGES_KEPT = 100
    #: while the router stays unreachable, a line every this many seconds, not every round
    REMIND_S = 60.0

    def state_doc(self) -> dict[str, Any] | None:
        """`read_state` of the state file; while it is absent, of the legacy file when there is one (its
        fatal servers and cool-down carried over: the round saves them to the new file, and the old one is
        left as it is, for a second cluster of the same profile name to carry its own over too)."""
        assert self.state_path is not None
        doc = read_state(self.state_path)
        if doc is None and self.legacy_path is not None:
            doc = read_state(self.legacy_path)
            if doc is not None and not self._legacy_said:
                self._legacy_said = True
                self.say(f"read the state an older version kept in {self.legacy_path}; it is now kept in "
                         f"{self.state_path} (one per router); the old file is left as it is")
        return doc

    def outliving(self, tick: Callable[[], list[dict[str, Any]]], interval_s: float
                  ) -> Callable[[], list[dict[str, Any]]]:
        """`tick` for a loop that outlives the router: a round that cannot reach it (`transient`) is said,
        counted and returns no record, and the next round is tried at the interval as usual, with the
        controller's state (its state file and what it keeps in memory) as it was. A router restarted by
        systemd, or a network blip, ended the loop (exit 3) and the controller stayed down. One line when
        the router goes away, a reminder every REMIND_S while it stays away, one when it is back."""
        def guarded() -> list[dict[str, Any]]:
            ran = self.rounds_run
            try:
                records = tick()
            except InferctlError as exc:
                if not transient(exc):
                    raise
                self._unreachable(exc.message, interval_s)
                return []
            if self.rounds_run != ran:  # a round skipped for the lock did not ask the router
                self._reachable()
            return records
        return guarded

    def _unreachable(self, error: str, interval_s: float) -> None:
        self.rounds_unreachable += 1
        now, out = _now(), self.outages[-1] if self.outages else None
        if out is None or out["back"] is not None:
            self.outages_seen += 1
            self.outages = [*self.outages, {"since": now, "last": now, "rounds": 1, "error": error, "back": None}]
            self.outages = self.outages[-self.OUTAGES_KEPT:]
            self._told_at = time.monotonic()
            self.say(f"this round could not reach the router: {error}; the loop goes on (next round in "
                     f"{interval_s:g} s), its state kept")
            return
        out.update(last=now, rounds=out["rounds"] + 1)
        if error != out["error"] or time.monotonic() - self._told_at >= self.REMIND_S:
            self._told_at = time.monotonic()
            self.say(f"the router is still unreachable ({_n_rounds(out['rounds'])} since {out['since']}): {error}")
        out["error"] = error

    def _reachable(self) -> None:
        out = self.outages[-1] if self.outages else None
        if out is not None and out["back"] is None:
            out["back"] = _now()
            self.say(f"the router answers again ({_n_rounds(out['rounds'])} could not reach it, since {out['since']})")

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[bool]:
        """Whether this process holds the lock (no state file: always), for the `with` block."""
        if self.state_path is None:
            yield True
            return
        lock = f"{self.state_path}.lock"
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LockUnusable(f"cannot create the state directory {self.state_path.parent}: {exc.strerror}",
                               remedy="pass --state in a writable directory") from None
        fd = _open_lock(lock)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            me = {"pid": os.getpid(), "host": socket.gethostname(),
                  "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            with contextlib.suppress(OSError):  # who holds it is a courtesy: the flock is the lock
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(me).encode(), 0)
            try:
                yield True
            finally:  # a holder that is gone is not named to the next skipped round (kill -9 leaves it)
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
        finally:
            os.close(fd)

    def _holder(self) -> dict[str, Any] | None:
        """Who holds the lock, as it wrote it (None: unknown: an older controller, caught mid-write, or what
        a holder killed -9 left, read before the new holder wrote itself over it: its pid is gone)."""
        try:
            fd = os.open(f"{self.state_path}.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            doc = json.loads(os.pread(fd, HOLDER_MAX_BYTES, 0).decode("utf-8"))
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        return doc if isinstance(doc, dict) and _alive_here(doc) else None

    def _locked_out(self) -> dict[str, Any]:
        """Note that the lock was held by another: `last_skip`, returned."""
        self.last_skip = {"reason": "locked", "lock": f"{self.state_path}.lock", "holder": self._holder()}
        return self.last_skip

    @contextlib.contextmanager
    def _round(self) -> Iterator[bool]:
        """`_exclusive` for one round: counts it as run or skipped, and says a skip."""
        with self._exclusive() as mine:
            if mine:
                self.rounds_run += 1
            else:
                self.rounds_skipped += 1
                self.say(skip_line(self._locked_out()))
            yield mine
