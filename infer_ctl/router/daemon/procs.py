"""`router serve --processes N`: a supervisor and N router processes on one listening address.

The supervisor (the `router serve` process) decides N (`plan`), creates the shared in-flight block
(router/fleet/shared_load.py: load, then the flight board of router/fleet/shared_flights.py) and a private state
directory, and starts N copies of this module (`python -m infer_ctl.router.daemon.procs`; the config arrives
pickled on stdin, so the admin token is never on a command line), all with one random PYTHONHASHSEED
so that their block chains (Python's string hash) agree on the board. Each binds the same host:port with SO_REUSEPORT: the kernel spreads connections over
them by a hash of the 4-tuple. Process 0 leads (router/scaleout/follow.py); the followers start once the
leader wrote its first snapshot. A process that exits unexpectedly (a follower killed with -9, the
leader too) has its row of the load block zeroed and is started again; its clients' connections died
with it, the other processes' requests are not touched. SIGTERM or SIGINT to the supervisor is passed
to every process, each drains (config.settings.drain_timeout_s) and exits; then the supervisor removes the block
and the directory. A router process whose supervisor dies gets SIGTERM from the kernel
(PR_SET_PDEATHSIG), so no orphan keeps the port.

Why one process without KV events (`plan`): with `policy: cache_aware`, a router that does not hear the
prefills' KV events routes on its own *predicted* index, which it learns from its own routing decisions.
N processes would hold N different predictions, each seeing 1/N of the traffic, and send the same prefix
to different workers: the router would be worse at the very thing it is for. With every prefill
publishing KV events, each process subscribes and holds the same exact view. Policies without a cache
index (round_robin, power_of_two, random) share everything they use (in-flight load) and run N
processes. Tenant limits (rates, concurrency) are enforced per process, so with tenants configured
the router also runs one process; so does a replica of several (router.state_store, state_sync.py), whose
operator state comes from the store rather than from a leader process.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import glob
import json
import logging
import os
import pickle
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infer_ctl.errors import UsageError
from infer_ctl.router.config import RouterConfig
from infer_ctl.router.scaleout.follow import ProcessRole

log = logging.getLogger("infer_ctl.router")

#: the default number of processes is the number of cores, at most this
MAX_DEFAULT_PROCESSES = 8
MAX_PROCESSES = 64
#: worker slots beyond the configured workers, for workers added at runtime (admin API)
SPARE_SLOTS = 64
#: a process that exits this soon after its start counts as a crash loop
_EARLY_EXIT_S = 2.0
_MAX_EARLY_EXITS = 3
#: a process that exits within this of its start again and again is restarted after a growing delay
_STABLE_S = 60.0
_BACKOFF_MAX_S = 30.0
#: in the state directory: every live router process (and the supervisor) holds a shared lock on it
_MEMBERS = "members.lock"


def default_processes() -> int:
    return max(1, min(os.cpu_count() or 1, MAX_DEFAULT_PROCESSES))


def fetch_server_info(url: str, timeout: float = 3.0) -> dict[str, Any] | None:
    """A worker's /server_info, or None when it does not answer with a JSON object."""
    # no proxy from the environment: the router talks to its workers directly (as upstream.py does)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url + "/server_info", timeout=timeout) as resp:
            doc = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def plan(cfg: RouterConfig, requested: int | None,
         server_info: Callable[[str], dict[str, Any] | None] = fetch_server_info) -> tuple[int, str]:
    """How many processes to run, and why (logged at start-up)."""
    n = default_processes() if requested is None else requested
    if n == 1:
        return 1, "one process requested" if requested else "one core"
    if cfg.tenants:
        return 1, "tenant limits are enforced per process: with tenants configured the router runs one process"
    if cfg.settings.state_store:
        return 1, ("the router is one of several replicas (router.state_store): a replica runs one process, "
                   "its operator state comes from the store, not from a leader process")
    if cfg.settings.policy != "cache_aware":
        return n, f"policy {cfg.settings.policy} keeps no cache index; the processes share their in-flight load"
    if not cfg.settings.kv_events.enabled:
        return 1, ("KV events are off (kv_events: false): every process would route on its own predicted cache "
                   "index; one process keeps one view")
    for w in cfg.workers:
        if w.role == "decode":
            continue
        info = server_info(w.url)
        if info is None:
            return 1, (f"worker {w.url} did not answer /server_info at start-up, so it is not known to publish KV "
                       "events; without them every process would route on its own predicted cache index")
        if not isinstance(info.get("kv_events"), dict):
            return 1, (f"worker {w.url} publishes no KV events (launch it with --kv-events-config); without them "
                       "every process would route on its own predicted cache index")
    return n, "every prefill publishes KV events: each process subscribes and holds the same exact index"


def _lock_port(port: int) -> int:
    """An exclusive lock on `port` among this user's routers of several processes, held (inherited by the
    router processes, `pass_fds`) until the last of them exits; the kernel drops it when they die, -9
    included. The bind check alone leaves a window: it closes its socket before the router processes
    bind with SO_REUSEPORT (a second or more, their start-up), and a second router started in that window
    passed the same check and joined the first one's listening group. Keyed by the port alone: a
    SO_REUSEPORT listener on 127.0.0.1:P beside one on 0.0.0.0:P would take the loopback traffic. Only
    the same user can join a SO_REUSEPORT group (the kernel compares the uid), so a per-user directory."""
    d = os.path.join(tempfile.gettempdir(), f"inferctl-router-ports-{os.getuid()}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise UsageError(f"{d} is not a private directory of this user", remedy=f"remove {d}")
    fd = os.open(os.path.join(d, f"{port}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise UsageError(f"cannot listen on port {port}: another inferctl router with several processes is "
                         "starting or serving on it",
                         remedy="stop that router (`inferctl router status --url ...`) or pick another "
                         "--listen (or the profile's router.listen)") from None
    return fd


def reserve_port(host: str, port: int) -> tuple[int, socket.socket | None, int]:
    """The port every process binds, and the port's lock (`_lock_port`; close it to release). A given
    port must be free: SO_REUSEPORT would otherwise let this router join another one's listening group
    (same user) and split its traffic silently, so it is first bound without SO_REUSEPORT, which fails
    while any socket listens on it. Port 0 means "any": one is bound (SO_REUSEPORT, never listening) and
    held until the router stops, so every process gets the same."""
    lock = _lock_port(port) if port else -1
    try:
        fam, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        s = socket.socket(fam, kind, proto)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if not port:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(addr)
    except OSError as exc:  # includes socket.gaierror (unresolvable host)
        if lock >= 0:
            os.close(lock)
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                         remedy="stop the process using that address or pick another --listen (or the "
                         "profile's router.listen)") from None
    if port:
        s.close()
        return port, None, lock
    port = int(s.getsockname()[1])
    try:
        return port, s, _lock_port(port)
    except UsageError:
        s.close()
        raise


class Supervisor:
    def __init__(self, cfg: RouterConfig, processes: int, log_level: str = "info") -> None:
        self.cfg = cfg
        self.n = processes
        self.log_level = log_level
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * processes
        self.started: list[float] = [0.0] * processes
        self.early_exits = [0] * processes
        #: consecutive exits within _STABLE_S of the start, and when a delayed restart is due
        self.crashes = [0] * processes
        self.restart_at: list[float | None] = [None] * processes
        self.restarts = 0
        self.stopping = False
        self.port_lock = -1
        self.hash_seed = secrets.randbelow(2**32 - 1) + 1  # 0 would turn hash randomization off

    def _spawn(self, role: ProcessRole) -> subprocess.Popen[bytes]:
        # one string hashing for every process (and every restart of one): the flight board compares
        # the processes' block chains (router/fleet/shared_flights.py). Random per router, never logged
        env = {**os.environ, "PYTHONHASHSEED": str(self.hash_seed)}
        proc = subprocess.Popen([sys.executable, "-m", "infer_ctl.router.daemon.procs"], stdin=subprocess.PIPE, env=env,
                                pass_fds=(self.port_lock,))  # the port's lock lives while any of them does
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps((self.cfg, role, self.log_level, os.getpid())))
        proc.stdin.close()
        self.procs[role.index] = proc
        self.started[role.index] = time.monotonic()
        return proc

    def _stop(self, *_: Any) -> None:
        self.stopping = True

    def run(self) -> int:
        from infer_ctl.router.fleet import shared_flights
        from infer_ctl.router.fleet.shared_load import SharedLoad

        cfg = self.cfg
        for sig in (signal.SIGTERM, signal.SIGINT):  # first: a signal from here on stops through the clean-up
            signal.signal(sig, self._stop)
        port, holder, self.port_lock = reserve_port(cfg.host, cfg.port)
        cfg.port = port
        sweep_stale()
        state_dir = tempfile.mkdtemp(prefix="inferctl-router-")
        os.chmod(state_dir, 0o700)
        member = _join(state_dir)
        slots = len(cfg.workers) + SPARE_SLOTS
        shared = SharedLoad.create(self.n, slots, extra=shared_flights.ROW_CELLS)
        Path(state_dir, "shm").write_text(shared.name)  # for sweep_stale, should every process be killed
        roles = [ProcessRole(i, self.n, state_dir, shared.name, slots) for i in range(self.n)]
        rc = 0
        try:
            leader = self._spawn(roles[0])
            # the followers take the leader's state from its first snapshot (follow.py)
            while not roles[0].snapshot.exists() and leader.poll() is None and not self.stopping:
                time.sleep(0.05)
            if leader.poll() is not None:
                return leader.returncode or 1
            for role in roles[1:] if not self.stopping else []:  # stopped during the leader's start-up
                self._spawn(role)
            ready = False
            while not self.stopping:
                time.sleep(0.1)
                if not ready and all(role.ready_file(role.index).exists() for role in roles):
                    ready = True
                    log.info("router processes ready", extra={"processes": self.n, "url": cfg.url,
                                                              "pids": [p.pid for p in self.procs if p],
                                                              "state_dir": state_dir})
                for role in roles:
                    rc = self._check(role, shared)
                    if rc:
                        self.stopping = True
                        break
        finally:
            self._shutdown()
            shared.close()
            shutil.rmtree(state_dir, ignore_errors=True)
            if holder is not None:
                holder.close()
            os.close(self.port_lock)
            os.close(member)
        log.info("router stopped", extra={"processes": self.n, "restarts": self.restarts})
        return rc

    def _check(self, role: ProcessRole, shared: Any) -> int:
        """Restart a process that exited; a crash loop at start-up (or a start-up error) stops the router,
        a crash loop later restarts it after a growing delay (0.5 s doubling to 30 s)."""
        i = role.index
        proc = self.procs[i]
        now = time.monotonic()
        if self.stopping:
            return 0
        if proc is None:
            due = self.restart_at[i]
            if due is not None and now >= due:
                self.restart_at[i] = None
                self._spawn(role)
            return 0
        if proc.poll() is None:
            return 0
        lived = now - self.started[i]
        # a process that never got ready failed at start-up, however long its start-up took (a loaded box)
        early = lived < _EARLY_EXIT_S or not role.ready_file(i).exists()
        self.early_exits[i] = self.early_exits[i] + 1 if early else 0
        if self.early_exits[i] >= _MAX_EARLY_EXITS or proc.returncode == 64:
            log.error("router process keeps failing at start-up: stopping the router",
                      extra={"router_process": i, "rc": proc.returncode})
            return proc.returncode or 1
        shared.zero_row(i)  # its requests died with its sockets (shared_load.py)
        role.ready_file(i).unlink(missing_ok=True)
        self.restarts += 1
        self.crashes[i] = self.crashes[i] + 1 if lived < _STABLE_S else 0
        delay = 0.0 if self.crashes[i] <= 1 else min(_BACKOFF_MAX_S, 0.5 * 2 ** (self.crashes[i] - 2))
        log.warning("router process exited: starting it again",
                    extra={"router_process": i, "rc": proc.returncode, "pid": proc.pid, "leader": role.leader,
                           "restart_in_s": delay})
        if delay:
            self.procs[i], self.restart_at[i] = None, now + delay
        else:
            self._spawn(role)
        return 0

    def _shutdown(self) -> None:
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.settings.drain_timeout_s + 15
        for p in live:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("router process did not stop: killing it", extra={"pid": p.pid})
                p.kill()
                p.wait()


def serve(cfg: RouterConfig, requested: int | None, log_level: str = "info") -> int:
    """`router serve`: one process in this one (run.py), or a supervisor of several."""
    from infer_ctl.router.daemon.run import serve_forever
    from infer_ctl.router.observe.logs import setup_logging

    setup_logging(log_level)
    n, why = plan(cfg, requested)
    if n == 1:
        if requested is None or requested > 1:
            log.warning("router runs one process: " + why, extra={"requested": requested})
        return serve_forever(cfg, log_level)
    log.info("router runs several processes: " + why, extra={"processes": n})
    return Supervisor(cfg, n, log_level).run()


# ---- one router process ---------------------------------------------------------------------------
class _ProcessField(logging.Filter):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.router_process = self.index
        return True


def _die_with_parent(supervisor: int) -> bool:
    """SIGTERM when the supervisor dies; False when it is gone already (it died before the prctl, so
    no signal will come)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    return os.getppid() == supervisor


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(0)  # before run.py's handlers (start-up): exit through the `finally` that cleans up


def _join(state_dir: str) -> int:
    """Hold a shared lock on the state directory's member file while this process runs (`_leave`,
    `sweep_stale`). The supervisor creates the file already locked (locked under a temporary name, then
    renamed), so no sweep can find it unlocked while its router starts."""
    path = os.path.join(state_dir, _MEMBERS)
    if os.path.exists(path):
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd
    tmp = path + ".new"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.replace(tmp, path)
    return fd


def sweep_stale() -> list[str]:
    """Remove what routers killed all at once left (systemd's SIGKILL of the whole group, `kill -9 -PGID`:
    no process is left to clean up, not even the resource tracker that would unlink the shared block):
    this user's state directories whose member file nobody holds, and the shared block named in them."""
    removed = []
    for d in glob.glob(os.path.join(tempfile.gettempdir(), "inferctl-router-*")):
        try:
            st = os.lstat(d)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(d, _MEMBERS), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # not a state directory of several processes (or not yet one)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live router's
            with contextlib.suppress(OSError):
                name = Path(d, "shm").read_text().strip()
                if name.isidentifier():  # psm_... (Python's SharedMemory names), nothing with a path in it
                    os.unlink(f"/dev/shm/{name}")
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
        finally:
            os.close(fd)
    if removed:
        log.warning("removed the state of routers that were killed without a clean-up", extra={"dirs": removed})
    return removed


def _leave(role: ProcessRole, member: int, supervisor: int) -> None:
    """An orphan's clean-up: the supervisor removes the state directory (snapshot with the prefix texts,
    metrics files, the admin socket) when it stops, but one killed with -9 cannot; its processes get
    SIGTERM (PR_SET_PDEATHSIG), drain and exit, and the last of them to leave removes the directory. "The
    last" is the one that can take the member file's lock exclusively once its own shared lock is gone
    (the kernel drops a dead process's lock, so a process killed meanwhile does not keep it)."""
    os.close(member)
    if os.getppid() == supervisor:
        return
    fd = os.open(os.path.join(role.state_dir, _MEMBERS), os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another router process is still draining: it will
    finally:
        os.close(fd)
    shutil.rmtree(role.state_dir, ignore_errors=True)
    log.info("router's supervisor is gone: removed its state directory", extra={"state_dir": role.state_dir})


def _child() -> int:
    from infer_ctl.errors import InferctlError
    from infer_ctl.router.daemon.run import serve_forever
    from infer_ctl.router.observe.logs import setup_logging

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_on_signal)
    cfg, role, log_level, supervisor = pickle.loads(sys.stdin.buffer.read())
    handler = setup_logging(log_level)
    handler.addFilter(_ProcessField(role.index))
    member = _join(role.state_dir)
    try:
        if not _die_with_parent(supervisor):
            return 0
        return serve_forever(cfg, log_level, proc=role, handler=handler)
    except InferctlError as exc:
        log.error(exc.message, extra={"remedy": exc.remedy})
        return int(exc.exit_code)
    finally:
        _leave(role, member, supervisor)


if __name__ == "__main__":
    raise SystemExit(_child())
