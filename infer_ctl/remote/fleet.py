"""Fan-out over a node selection: one connection per node per run, bounded parallelism, per-node
outcomes, --fail-fast, and Ctrl-C that stops remote work instead of abandoning it.

    with Fleet(profile, parallel=16) as fleet:
        outcomes = fleet.map(select_nodes(profile, "dc-*"), lambda conn, node: conn.run(UNAME))

(`select_nodes` is `infer_ctl.profile.select.select_nodes`: choosing nodes needs no connection.)

Errors raised inside `fn` become `outcome.error` (unexpected ones wrapped with their type), so one bad
node never crashes the fleet. Connection failures are remembered: a node that could not be reached is
not retried by later `map` calls of the same run (one timeout per node per run, not one per step).
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Generic, TypeVar

from infer_ctl.errors import InferctlError, UsageError
from infer_ctl.paths import state_dir
from infer_ctl.profile import Node, Profile
from infer_ctl.remote.base import Connector
from infer_ctl.remote.commandline import SudoMode
from infer_ctl.remote.errors import NodeSkippedError, UnexpectedNodeError
from infer_ctl.remote.hostkeys import HostKeyStore
from infer_ctl.remote.local import LocalConnector
from infer_ctl.remote.ssh import ABORT_WAIT_S, GatewayCache, KeyRing, PendingConnects, connect_ssh
from infer_ctl.remote.target import TargetResolver

T = TypeVar("T")


@dataclass(frozen=True)
class NodeOutcome(Generic[T]):
    node: Node
    value: T | None
    error: InferctlError | None
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.error is None


def accepted_known_hosts_path() -> Path:
    """inferctl's own known_hosts (keys accepted with --accept-new-host-keys); never ~/.ssh/known_hosts."""
    return state_dir() / "known_hosts"


class Fleet:
    """Connections to the nodes of one profile for one inferctl run. Use as a context manager."""

    def __init__(
        self, profile: Profile, *, accept_new_host_keys: bool = False, parallel: int | None = None
    ) -> None:
        if parallel is not None and parallel < 1:
            raise UsageError(f"--parallel must be at least 1, got {parallel}", remedy="e.g. --parallel 32")
        self.profile = profile
        ssh = profile.ssh
        self.parallel = parallel or ssh.parallelism
        accepted = (
            Path(ssh.accepted_known_hosts).expanduser()
            if ssh.accepted_known_hosts
            else accepted_known_hosts_path()
        )
        self.hostkeys = HostKeyStore(
            Path(ssh.known_hosts).expanduser(),
            accepted,
            accept_new=accept_new_host_keys or ssh.host_key_policy == "accept-new",
        )
        password = os.environ.get(ssh.sudo_password_env) if ssh.sudo_password_env else None
        self.sudo_mode = SudoMode(enabled=ssh.sudo, password=password)
        self._resolver: TargetResolver | None = None
        self._keyring = KeyRing(use_agent=ssh.use_agent)
        self._gateways = GatewayCache()
        self._pending = PendingConnects()  # handshakes in flight, closed by abort()
        self._lock = threading.Lock()
        self._node_locks: dict[str, threading.Lock] = {}
        self._connectors: dict[str, Connector] = {}
        self._failures: dict[str, InferctlError] = {}
        self._connect_s: dict[str, float] = {}
        self._cancelled = threading.Event()
        # tags this run's remote commands (INFERCTL_RUN=<run_id>-<n>) so Ctrl-C can kill exactly them
        self.run_id = secrets.token_hex(6)
        self._marker_seq = itertools.count(1)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(ev, KeyboardInterrupt):
            self.abort()
        self.close()

    # ---- connections -----------------------------------------------------------------------------
    def connector(self, node: Node) -> Connector:
        """The node's connector, connecting on first use. Raises RemoteError subclasses."""
        with self._lock:
            lock = self._node_locks.setdefault(node.name, threading.Lock())
        with lock:
            if node.name in self._connectors:
                return self._connectors[node.name]
            if node.name in self._failures:
                raise self._failures[node.name]
            if self._cancelled.is_set():
                raise NodeSkippedError(f"{node.name}: cancelled", remedy="rerun the command")
            started = time.monotonic()
            try:
                conn = self._connect(node)
            except InferctlError as exc:
                self._failures[node.name] = exc
                raise
            with self._lock:
                self._connectors[node.name] = conn
                self._connect_s[node.name] = time.monotonic() - started
            return conn

    def connect_seconds(self, node: Node) -> float | None:
        """How long connecting (TCP, handshake, host key, auth) to the node took, once connected."""
        with self._lock:
            return self._connect_s.get(node.name)

    def _connect(self, node: Node) -> Connector:
        ssh = self.profile.ssh
        if node.connection == "local":
            return LocalConnector(node.name, sudo_mode=self.sudo_mode, command_timeout=ssh.command_timeout_s)
        if self._resolver is None:
            with self._lock:
                if self._resolver is None:
                    self._resolver = TargetResolver(self.profile)
        target = self._resolver.for_node(node)
        return connect_ssh(
            target,
            self.hostkeys,
            self._keyring,
            timeout=ssh.connect_timeout_s,
            keepalive=ssh.keepalive_s,
            sudo_mode=self.sudo_mode,
            command_timeout=ssh.command_timeout_s,
            gateway_cache=self._gateways,
            run_marker=f"{self.run_id}-{next(self._marker_seq)}",
            pending=self._pending,
        )

    # ---- fan-out ---------------------------------------------------------------------------------
    def map(
        self,
        nodes: Sequence[Node],
        fn: Callable[[Connector, Node], T],
        *,
        fail_fast: bool = False,
        progress: Callable[[NodeOutcome[T]], None] | None = None,
        failed: Callable[[NodeOutcome[T]], bool] | None = None,
    ) -> list[NodeOutcome[T]]:
        """Run `fn(connector, node)` on every node, at most `parallel` at a time; results in node order.

        `progress` is called in the calling thread as each node finishes. With `fail_fast`, the first
        outcome for which `failed` is true (default: it has an error) stops nodes not yet started;
        they get a NodeSkippedError. Ctrl-C aborts running commands and re-raises KeyboardInterrupt.
        """
        is_failure = failed or (lambda o: o.error is not None)
        outcomes: dict[int, NodeOutcome[T]] = {}
        stop = threading.Event()
        first_failure: list[str] = []
        stop_lock = threading.Lock()

        def attempt(node: Node) -> NodeOutcome[T]:
            started = time.monotonic()
            try:
                value = fn(self.connector(node), node)
                return NodeOutcome(node, value, None, time.monotonic() - started)
            except InferctlError as exc:
                return NodeOutcome(node, None, exc, time.monotonic() - started)
            except Exception as exc:
                error = UnexpectedNodeError(
                    f"{node.name}: unexpected {type(exc).__name__}: {exc}",
                    remedy="this is a bug in inferctl; rerun with --debug and report it",
                )
                error.__cause__ = exc
                return NodeOutcome(node, None, error, time.monotonic() - started)

        def one(node: Node) -> NodeOutcome[T]:
            if stop.is_set() or self._cancelled.is_set():
                why = f"--fail-fast stopped after {first_failure[0]} failed" if first_failure else "cancelled"
                skipped = NodeSkippedError(
                    f"{node.name}: not run: {why}",
                    remedy="fix the failing node, or rerun without --fail-fast",
                )
                return NodeOutcome(node, None, skipped, 0.0)
            outcome = attempt(node)
            # decided in the worker, so a free worker cannot pick up the next node before the stop
            if fail_fast and is_failure(outcome):
                with stop_lock:
                    if not stop.is_set():
                        first_failure.append(node.name)
                        stop.set()
            return outcome

        if not nodes:
            return []
        workers = max(1, min(self.parallel, len(nodes)))
        pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleet")
        futures = {pool.submit(one, node): i for i, node in enumerate(nodes)}
        try:
            pending = set(futures)
            while pending:
                done, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_COMPLETED)
                for future in done:
                    outcome = future.result()
                    outcomes[futures[future]] = outcome
                    if progress is not None:
                        progress(outcome)
        except BaseException:
            self.abort()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return [outcomes[i] for i in range(len(nodes))]

    # ---- teardown --------------------------------------------------------------------------------
    def abort(self) -> None:
        """Stop everything in flight: kill remote commands, drop connections. Used on Ctrl-C.

        Nodes are aborted in parallel (each waits at most a few seconds for its kill to finish), so
        Ctrl-C on a large fleet still returns promptly.
        """
        self._cancelled.set()
        self._pending.close_all()
        with self._lock:
            conns = list(self._connectors.values())

        def one(conn: Connector) -> None:
            abort = getattr(conn, "abort", None)
            if abort is not None:
                try:
                    abort()
                except Exception:  # best effort while shutting down
                    pass

        threads = [threading.Thread(target=one, args=(c,), name="fleet-abort", daemon=True) for c in conns]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + ABORT_WAIT_S + 1.0
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        with self._lock:
            conns = list(self._connectors.values())
            self._connectors.clear()
        for conn in conns:
            try:
                conn.close()
            except Exception:  # closing a dead transport must not mask the real outcome
                pass
        self._gateways.close()
