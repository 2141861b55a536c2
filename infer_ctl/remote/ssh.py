"""The paramiko SSH connector: one transport per node, one channel per command.

Connecting (host key check, auth, jump hosts) lives in `connect_ssh`; `SshConnector` only runs
commands over an established transport, and moves files through remote.transfer.SftpFiles. All paramiko/socket exceptions are
translated here into remote.errors classes with a plain reason and a next step.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import paramiko

from infer_ctl.remote.base import Command, CommandResult, as_command
from infer_ctl.remote.commandline import (
    ABORT_SCRIPT,
    KILL_AFTER_S,
    SudoMode,
    build_argv,
    is_remote_timeout,
    marker_pattern,
    raise_for_sudo,
    sudo_n_argv,
)
from infer_ctl.remote.errors import (
    AuthError,
    ConnectionLostError,
    ConnectionRefusedRemoteError,
    ConnectTimeoutError,
    DnsError,
    SessionRefusedError,
    UnreachableError,
)
from infer_ctl.remote.hostkeys import HostKeyStore, negotiable_key_types
from infer_ctl.remote.putfile import put_file_via_sudo
from infer_ctl.remote.target import SshTarget, default_key_files
from infer_ctl.remote.transfer import SftpFiles

_CHUNK = 1 << 20
#: tenths of a second the abort script waits between TERM and KILL
ABORT_GRACE_DS = 15
#: how long abort() waits for the abort script (its grace plus a round trip or two)
ABORT_WAIT_S = ABORT_GRACE_DS / 10 + 2.0
#: how long after one of our channels closed a refused session is retried (sshd frees it lazily: on a
#: loaded node it took over 1 s in a full-suite run, which refused the third of three commands)
_SLOT_FREE_GRACE_S = 3.0

# paramiko logs transport-thread failures (e.g. "Error reading SSH protocol banner") with a traceback
# at ERROR level. Without a handler, Python's last-resort handler would print that traceback on the
# user's stderr, although we translate the same failure into one plain error. A NullHandler keeps the
# records available to applications that configure logging, and silent otherwise.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class KeyRing:
    """Private keys loaded once per run (parsing a key costs more than using it) plus ssh-agent keys."""

    def __init__(self, *, use_agent: bool) -> None:
        self.use_agent = use_agent
        self._lock = threading.Lock()
        self._files: dict[str, paramiko.PKey | str] = {}  # path -> key, or why it could not be loaded
        self._agent: list[paramiko.AgentKey] | None = None

    def _load(self, path: str) -> paramiko.PKey | str:
        with self._lock:
            if path not in self._files:
                full = Path(path).expanduser()
                try:
                    self._files[path] = paramiko.PKey.from_path(full)
                except FileNotFoundError:
                    self._files[path] = "file not found"
                except (paramiko.PasswordRequiredException, TypeError):
                    # paramiko >= 3.2 raises TypeError for an OpenSSH-format key with a passphrase
                    self._files[path] = "encrypted (load it into ssh-agent: ssh-add KEY)"
                except (paramiko.SSHException, OSError, ValueError) as exc:
                    self._files[path] = f"unreadable ({exc})"
            return self._files[path]

    def _agent_keys(self) -> list[paramiko.AgentKey]:
        with self._lock:
            if self._agent is None:
                self._agent = []
                if self.use_agent:
                    try:
                        self._agent = list(paramiko.Agent().get_keys())
                    except (paramiko.SSHException, OSError):
                        self._agent = []
            return self._agent

    def candidates(self, target: SshTarget) -> tuple[list[tuple[str, paramiko.PKey]], list[str]]:
        """Keys to offer in order (configured files, agent, default files) and notes on skipped ones."""
        keys: list[tuple[str, paramiko.PKey]] = []
        notes: list[str] = []
        for path in target.identity_files:
            loaded = self._load(path)
            if isinstance(loaded, str):
                notes.append(f"{path}: {loaded}")
            else:
                keys.append((path, loaded))
        for agent_key in self._agent_keys():
            keys.append((f"agent key {agent_key.fingerprint}", agent_key))
        for path in default_key_files():
            if path not in target.identity_files:
                loaded = self._load(path)
                if not isinstance(loaded, str):
                    keys.append((path, loaded))
        return keys, notes


def _open_socket(target: SshTarget, timeout: float) -> socket.socket:
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise DnsError(
            f"{target.label}: cannot resolve host name {target.host!r} ({exc.strerror})",
            remedy="check the node's host in the profile (or HostName in ~/.ssh/config) and DNS",
        ) from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.settimeout(timeout)
    try:
        sock.connect(addr)
    except ConnectionRefusedError:
        sock.close()
        raise ConnectionRefusedRemoteError(
            f"{target.label}: connection refused by {target.host}:{target.port}",
            remedy="is sshd running on the node and listening on that port?",
        ) from None
    except TimeoutError:
        sock.close()
        raise ConnectTimeoutError(
            f"{target.label}: no answer from {target.host}:{target.port} within {timeout:g}s",
            remedy="check that the node is up and that a firewall lets SSH through (ssh.connect_timeout_s)",
        ) from None
    except OSError as exc:
        sock.close()
        raise UnreachableError(
            f"{target.label}: cannot connect to {target.host}:{target.port}: {exc.strerror or exc}",
            remedy="check the network path to the node",
        ) from None
    return sock


def _channel_through(
    gateway: paramiko.Transport, via: SshTarget, target: SshTarget, timeout: float
) -> paramiko.Channel:
    try:
        return gateway.open_channel(
            "direct-tcpip", (target.host, target.port), ("127.0.0.1", 0), timeout=timeout
        )
    except (paramiko.ChannelException, paramiko.SSHException) as exc:
        # paramiko keeps ONE pending exception per transport: when several nodes are refused through the
        # same jump host at once, one thread may take another's ChannelException and the rest see a bare
        # "Unable to open channel." -- the same refusal, so the same message
        if not isinstance(exc, paramiko.ChannelException) and "Unable to open channel" not in str(exc):
            raise UnreachableError(
                f"{target.label}: jump host {via.label} failed while connecting onward: {exc}",
                remedy=f"check the jump host {via.label}",
            ) from None
        reason = (exc.text or exc.code) if isinstance(exc, paramiko.ChannelException) else "refused"
        raise UnreachableError(
            f"{target.label}: jump host {via.label} could not open a connection to {target.host}:{target.port} "
            f"({reason})",
            remedy=f"check that {via.label} allows TCP forwarding (AllowTcpForwarding) and can reach the node",
        ) from None
    except (EOFError, OSError) as exc:
        raise UnreachableError(
            f"{target.label}: jump host {via.label} failed while connecting onward: {exc}",
            remedy=f"check the jump host {via.label}",
        ) from None


class PendingConnects:
    """Transports still in their handshake. Ctrl-C closes them (Fleet.abort): a worker thread waiting out
    ssh.connect_timeout_s on a node that accepted TCP but never spoke SSH otherwise held the exit for
    that long, since the interpreter joins the fleet's worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[paramiko.Transport] = set()
        self._closed = False

    def add(self, transport: paramiko.Transport) -> None:
        with self._lock:
            self._live.add(transport)
            closed = self._closed
        if closed:  # cancelled before this handshake began: it fails at once
            transport.close()

    def discard(self, transport: paramiko.Transport) -> None:
        with self._lock:
            self._live.discard(transport)

    def close_all(self) -> None:
        with self._lock:
            self._closed = True
            live = list(self._live)
        for transport in live:
            transport.close()


def open_transport(
    target: SshTarget,
    hostkeys: HostKeyStore,
    keyring: KeyRing,
    *,
    timeout: float,
    keepalive: int,
    sock: socket.socket | paramiko.Channel | None = None,
    pending: PendingConnects | None = None,
) -> paramiko.Transport:
    """A verified, authenticated transport to `target` (over `sock` when tunnelled); `pending` holds it
    until connected, so an abort can close it mid-handshake."""
    if sock is None:
        sock = _open_socket(target, timeout)
    transport = paramiko.Transport(sock)
    if pending is not None:
        pending.add(transport)
    try:
        transport.banner_timeout = timeout
        transport.handshake_timeout = timeout
        # Ask the server for a key type we already know, so a host with several keys is not reported
        # as "changed" just because it offered another type first (as OpenSSH does).
        known_types = hostkeys.known_key_types(target.host, target.port, target.known_hosts_files)
        opts = transport.get_security_options()
        if known_types:
            opts.key_types = negotiable_key_types(known_types, opts.key_types)
        try:
            # start_client returns silently when its own timeout passes first; the extra second lets
            # the banner/handshake timeouts above fire instead, so the reason is known
            transport.start_client(timeout=timeout + 1)
            key = transport.get_remote_server_key()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            text = str(exc)
            # paramiko words a connection closed before the banner ("Error reading SSH protocol banner",
            # raised while handling EOFError) as it words a timeout: a peer that accepts and hangs up at
            # once (sshd's MaxStartups or tcp_wrappers, a firewall or proxy) waited no timeout at all
            if isinstance(exc.__context__, (EOFError, ConnectionError)) and "banner" in text:
                raise UnreachableError(
                    f"{target.label}: {target.host}:{target.port} accepted the connection and closed it "
                    "before the SSH greeting",
                    remedy="check the node's sshd log: it may refuse this client (MaxStartups, AllowUsers, "
                    "hosts.deny, fail2ban), or a firewall or proxy in between closes SSH connections",
                ) from None
            if "banner" in text or "No existing session" in text or "timed out" in text.lower():
                raise ConnectTimeoutError(
                    f"{target.label}: {target.host}:{target.port} accepted the connection but sent no SSH "
                    f"greeting within {timeout:g}s",
                    remedy="check that sshd (not another service) listens on that port and is not hung "
                    "(the node may be overloaded); ssh.connect_timeout_s sets the wait",
                ) from None
            raise UnreachableError(
                f"{target.label}: SSH handshake with {target.host}:{target.port} failed: {exc}",
                remedy="check that an SSH server listens on that port",
            ) from None
        hostkeys.verify(target.host, target.port, key.get_name(), key.asbytes(), target.known_hosts_files)
        _authenticate(transport, target, keyring)
        if keepalive:
            transport.set_keepalive(keepalive)
        return transport
    except BaseException:
        transport.close()
        raise
    finally:
        if pending is not None:
            pending.discard(transport)


def _authenticate(transport: paramiko.Transport, target: SshTarget, keyring: KeyRing) -> None:
    keys, notes = keyring.candidates(target)
    tried: list[str] = []
    for label, key in keys:
        try:
            transport.auth_publickey(target.user, key)
        except paramiko.AuthenticationException:
            tried.append(label)
            continue
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise ConnectionLostError(
                f"{target.label}: connection dropped during authentication: {exc}",
                remedy="check the sshd log on the node (MaxAuthTries, AllowUsers)",
            ) from None
        if transport.is_authenticated():
            return
        tried.append(f"{label} (partial: more factors required, not supported)")
    detail = "; ".join(tried + notes) if (tried or notes) else "no key available"
    remedy = (
        f"put the public key into ~{target.user}/.ssh/authorized_keys on the node, or set ssh.identity_file"
        " / ssh.user (or the node's user) in the profile"
    )
    if not tried:  # no key could even be offered: say how to make the configured one usable
        remedy = "no usable key: fix ssh.identity_file, or load the key into ssh-agent (ssh-add KEY); then " + remedy
    raise AuthError(
        f"{target.label}: authentication as {target.user}@{target.host}:{target.port} failed (tried: {detail})",
        remedy=remedy,
    )


def connect_ssh(
    target: SshTarget,
    hostkeys: HostKeyStore,
    keyring: KeyRing,
    *,
    timeout: float,
    keepalive: int,
    sudo_mode: SudoMode,
    command_timeout: float,
    gateway_cache: GatewayCache | None = None,
    run_marker: str | None = None,
    pending: PendingConnects | None = None,
) -> SshConnector:
    sock: paramiko.Channel | None = None
    if target.jumps:
        cache = gateway_cache or GatewayCache()
        gateway: paramiko.Transport | None = None
        previous: SshTarget | None = None
        for depth, hop in enumerate(target.jumps):

            def make(
                hop: SshTarget = hop,
                via: paramiko.Transport | None = gateway,
                via_target: SshTarget | None = previous,
            ) -> paramiko.Transport:
                hop_sock = _channel_through(via, via_target, hop, timeout) if via and via_target else None
                return open_transport(
                    hop, hostkeys, keyring, timeout=timeout, keepalive=keepalive, sock=hop_sock, pending=pending
                )

            gateway = cache.get(target.jumps[: depth + 1], make)
            previous = hop
        assert gateway is not None and previous is not None
        sock = _channel_through(gateway, previous, target, timeout)
    transport = open_transport(target, hostkeys, keyring, timeout=timeout, keepalive=keepalive, sock=sock,
                               pending=pending)
    return SshConnector(
        target,
        transport,
        sudo_mode=sudo_mode,
        connect_timeout=timeout,
        command_timeout=command_timeout,
        run_marker=run_marker,
    )


class GatewayCache:
    """Jump host transports shared by all nodes behind them (one connection to the bastion per run)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._transports: dict[tuple[str, ...], paramiko.Transport] = {}
        self._pending: dict[tuple[str, ...], threading.Lock] = {}

    def get(self, chain: Sequence[SshTarget], make: Callable[[], paramiko.Transport]) -> paramiko.Transport:
        key = tuple(h.address for h in chain)
        with self._lock:
            lock = self._pending.setdefault(key, threading.Lock())
        with lock:
            existing = self._transports.get(key)
            if existing is not None and existing.is_active():
                return existing
            transport: paramiko.Transport = make()
            self._transports[key] = transport
            return transport

    def close(self) -> None:
        with self._lock:
            for transport in reversed(list(self._transports.values())):
                transport.close()
            self._transports.clear()


def _send_signal(chan: paramiko.Channel, name: str) -> None:
    """RFC 4254 "signal" request (paramiko has no public API for it); OpenSSH's sshd delivers it."""
    msg = paramiko.Message()
    msg.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
    msg.add_int(chan.remote_chanid)
    msg.add_string("signal")
    msg.add_boolean(False)
    msg.add_string(name)
    chan.transport._send_user_message(msg)  # type: ignore[union-attr]


class SshConnector:
    def __init__(
        self,
        target: SshTarget,
        transport: paramiko.Transport,
        *,
        sudo_mode: SudoMode,
        connect_timeout: float,
        command_timeout: float,
        run_marker: str | None = None,
    ) -> None:
        self.node_name = target.label
        # tags every command of this connector, so abort() finds exactly these (ABORT_SCRIPT)
        self.run_marker = run_marker or secrets.token_hex(8)
        self.target = target
        self._transport = transport
        self.sudo_mode = sudo_mode
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._lock = threading.Lock()
        self._channel_closed = threading.Condition(self._lock)  # a session slot may have come free
        self._channels: set[paramiko.Channel] = set()
        # threads inside open_session: sshd may already have granted one of them a slot it has not
        # recorded in _channels yet
        self._opening = 0
        self._slot_freed_at = 0.0  # when a channel of ours last closed (see _open_channel)
        self._sudo_in_flight = 0
        self._aborted = False
        self._files = SftpFiles(self, transport, self._lost)

    # ---- commands ------------------------------------------------------------------------------
    def run(
        self,
        command: Command | Sequence[str],
        *,
        timeout: float | None = None,
        sudo: bool = False,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        cmd = as_command(command)
        limit = self._command_timeout if timeout is None else timeout
        argv, prefix = build_argv(
            cmd, sudo=sudo, sudo_mode=self.sudo_mode, env=env, timeout=limit, marker=self.run_marker
        )
        line = shlex.join(argv)
        started = time.monotonic()
        chan = self._open_channel()
        if sudo:
            with self._lock:
                self._sudo_in_flight += 1
        try:
            chan.exec_command(line)
            feeder = self._feed_stdin(chan, prefix + (stdin or b""))
            out, err, timed_out = self._collect(chan, started + limit + KILL_AFTER_S + 2)
            exit_code: int | None = None
            if not timed_out and chan.status_event.wait(
                max(0.1, started + limit + KILL_AFTER_S + 2 - time.monotonic())
            ):
                exit_code = chan.recv_exit_status()
                exit_code = None if exit_code == -1 else exit_code
            elif not timed_out:
                timed_out = True
            if timed_out:
                with contextlib.suppress(Exception):
                    _send_signal(chan, "TERM")
            if feeder is not None:
                feeder.join(timeout=1)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise self._lost(exc) from None
        finally:
            chan.close()
            with self._lock:
                self._channels.discard(chan)
                if sudo:
                    self._sudo_in_flight -= 1
                self._slot_freed_at = time.monotonic()
                self._channel_closed.notify_all()
        duration = time.monotonic() - started
        timed_out = timed_out or is_remote_timeout(exit_code, duration, limit)
        result = CommandResult(exit_code, bytes(out), bytes(err), duration, timed_out, command=cmd.shell())
        if sudo:
            raise_for_sudo(self.node_name, result, self.sudo_mode)
        return result

    def _open_channel(self) -> paramiko.Channel:
        """A session channel. When sshd refuses one (MaxSessions reached), an idle SFTP channel is given
        back, or a command of this connection that is still running gets up to connect_timeout_s to
        finish and free its slot; only then is the refusal an error (SessionRefusedError). The wait is
        connect_timeout_s without progress: each slot freed meanwhile starts it again, so the last of
        several queued commands is not refused for the queue's length (a full-suite run refused the
        second of three on a MaxSessions 1 node)."""
        deadline = time.monotonic() + self._connect_timeout
        while True:
            with self._lock:
                deadline = max(deadline, self._slot_freed_at + self._connect_timeout)
            if not self._transport.is_active():
                raise self._lost(None)
            try:
                return self._open_session_counted()
            except (paramiko.ChannelException, paramiko.SSHException) as exc:
                if not self._is_refusal(exc):
                    raise self._lost(exc) from None
                if self._files.release_idle():
                    with self._lock:
                        self._slot_freed_at = time.monotonic()
                    continue
                with self._lock:
                    # a channel sshd granted another thread a moment ago holds a slot before that
                    # thread's open_session returns (a CI run refused the second of three commands
                    # with "0 still running" in that window)
                    in_flight = len(self._channels) + self._opening
                    # sshd frees a closed session's slot a moment after the close (its channel garbage
                    # collection runs after the request that follows): retry briefly after one closed
                    freed_lately = time.monotonic() - self._slot_freed_at < _SLOT_FREE_GRACE_S
                    if (in_flight or freed_lately) and time.monotonic() < deadline:
                        wait = 0.5 if in_flight else 0.02
                        self._channel_closed.wait(timeout=min(wait, max(0.0, deadline - time.monotonic())))
                        continue
                reason = exc.text if isinstance(exc, paramiko.ChannelException) else "refused"
                raise SessionRefusedError(
                    f"{self.node_name}: sshd refused another session channel ({reason}) with {in_flight} "
                    f"command(s) of this run still running on the node",
                    remedy="the node allows fewer concurrent sessions per connection than inferctl uses: raise "
                    "MaxSessions in the node's sshd_config (OpenSSH's default is 10)",
                ) from None
            except (EOFError, OSError) as exc:
                raise self._lost(exc) from None

    def _open_session_counted(self) -> paramiko.Channel:
        with self._lock:
            self._opening += 1
        try:
            chan = self._transport.open_session(timeout=self._connect_timeout)
        except BaseException:
            with self._lock:
                self._opening -= 1
            raise
        with self._lock:
            self._opening -= 1
            self._channels.add(chan)
        return chan

    def _is_refusal(self, exc: Exception) -> bool:
        """sshd said no to the channel. paramiko keeps ONE pending exception per transport: when several
        threads are refused at once, all but one see a bare "Unable to open channel." while the
        transport is still up -- the same refusal."""
        if isinstance(exc, paramiko.ChannelException):
            return True
        return "Unable to open channel" in str(exc) and self._transport.is_active()

    def _lost(self, exc: BaseException | None) -> ConnectionLostError:
        reason = f": {exc}" if exc else ""
        return ConnectionLostError(
            f"{self.node_name}: connection to {self.target.host}:{self.target.port} lost{reason}",
            remedy="check that the node is up; rerun the command",
        )

    @staticmethod
    def _feed_stdin(chan: paramiko.Channel, data: bytes) -> threading.Thread | None:
        if not data:
            chan.shutdown_write()
            return None

        # a thread, so a command that writes a lot before reading its stdin cannot deadlock us
        def feed() -> None:
            with contextlib.suppress(Exception):
                chan.sendall(data)
                chan.shutdown_write()

        thread = threading.Thread(target=feed, name=f"stdin-{chan.get_id()}", daemon=True)
        thread.start()
        return thread

    @staticmethod
    def _collect(chan: paramiko.Channel, deadline: float) -> tuple[bytearray, bytearray, bool]:
        out, err = bytearray(), bytearray()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return out, err, True
            select.select([chan], [], [], min(remaining, 1.0))
            while chan.recv_ready():
                out += chan.recv(_CHUNK)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(_CHUNK)
            if (chan.eof_received or chan.closed) and not chan.recv_ready() and not chan.recv_stderr_ready():
                return out, err, False

    # ---- files -------------------------------------------------------------------------------
    def put_file(
        self,
        remote_path: str,
        data: bytes,
        *,
        mode: int = 0o644,
        owner: str | None = None,
        sudo: bool = False,
    ) -> None:
        if sudo and self.sudo_mode.enabled:
            put_file_via_sudo(self, remote_path, data, mode, owner)
            return
        self._files.put(remote_path, data, mode, owner)

    def get_file(self, remote_path: str) -> bytes:
        return self._files.get(remote_path)

    # ---- lifecycle ---------------------------------------------------------------------------
    def abort(self) -> None:
        """Ctrl-C: stop this run's remote commands, then drop the link. Returns within ABORT_WAIT_S.

        The SSH "signal" request works for non-root logins (TERM reaches the remote `timeout`, which
        forwards it to the command's process group); OpenSSH refuses it for root, so the run marker
        is used as well: a fresh channel kills the process groups tagged with it (ABORT_SCRIPT).
        """
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            channels = list(self._channels)
            via_sudo = self._sudo_in_flight > 0
        for chan in channels:
            with contextlib.suppress(Exception):
                _send_signal(chan, "TERM")
        if channels:
            with contextlib.suppress(Exception):  # best effort: the link may be what failed
                self._kill_marked(via_sudo)
        self.close()

    def _kill_marked(self, via_sudo: bool) -> None:
        argv = ["sh", "-c", ABORT_SCRIPT, "inferctl-abort", marker_pattern(self.run_marker), str(ABORT_GRACE_DS)]
        if via_sudo and self.sudo_mode.enabled and self.sudo_mode.password is None:
            argv = sudo_n_argv(argv)  # commands run through sudo belong to root
        chan = self._transport.open_session(timeout=min(self._connect_timeout, 2.0))
        try:
            chan.exec_command(shlex.join(argv))
            chan.shutdown_write()
            chan.status_event.wait(ABORT_WAIT_S)
        finally:
            chan.close()

    def close(self) -> None:
        self._files.close()
        self._transport.close()
