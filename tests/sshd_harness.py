"""Real OpenSSH servers on loopback addresses, one per simulated node, for every remote test.

What is real: `/usr/sbin/sshd` (Debian openssh-server), its host keys, public-key authentication,
SFTP (internal-sftp), TCP forwarding (for jump hosts), and the shell commands run on the "node".
What is not: every node is this machine. Tests that need hardware tools (nvidia-smi, ibv_devinfo, ...)
drop stand-in executables into `cluster.bin_dir(name)`, which sshd puts first on that node's PATH.

Layout (all under one pytest tmp dir, removed at the end of the test):

    user_key, user_key.pub, authorized_keys, known_hosts
    <node>/host_key, <node>/sshd_config, <node>/sshd.log, <node>/bin/

Design choices, measured on the 2-core build machine:
- One sshd process per node (not one process on 16 addresses): each node gets its own host key (so
  "changed host key" and fingerprints are per node), its own PATH via `SetEnv`, and `stop(name)` makes
  exactly one node unreachable. Starting an sshd costs ~10-20 ms; 32 of them start in well under 1 s.
- Addresses are 127.A.B.2, 127.A.B.3, ... with A.B random per cluster, and ports picked free per
  address, so parallel tests (and other helpers' servers bound on node addresses) do not collide.
  Everything in 127.0.0.0/8 is loopback on Linux.
- Keys are ed25519, generated in-process with `cryptography` (no ssh-keygen round trips). Host keys
  may be of other types too: `host_key_types=("rsa",)` (any of HOST_KEY_TYPES, several per node),
  and `replace_host_keys(name, types)` gives one node fresh keys of other types.
- Works as root (login as root, `PermitRootLogin prohibit-password`, creates /run/sshd if missing)
  and as an ordinary user (sshd without privilege separation serves only that user).
- `sshd_prefix` runs sshd under a wrapper (e.g. `["unshare", "--mount", "--", "/path/wrapper"]`) so
  provisioning tests can give a node private bind mounts. `extra_sshd_config` lines override the
  defaults (they are placed first, since sshd keeps the first value); a `Match` block goes last.
  `node_sshd_config={"node-02": "MaxSessions 1"}` does the same for single nodes (before the cluster's
  extra lines). `sftp_subsystem=None` serves no sftp subsystem (`"/bin/false"`: one that fails to start).

The profile from `profile_data()` sets `ssh.sudo` to false when the tests run as root (root needs no
sudo, and the build image has no sudo binary); tests of sudo behaviour set it explicitly. inferctl runs
privileged commands of a root login (uid 0) without sudo, so a test of sudo itself, when the tests run
as root, first calls `pose_as_unprivileged(name)`: a stand-in `id` on that node reports an ordinary
login user (and the real identity under sudo, i.e. when SUDO_UID is set).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import getpass
import hashlib
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.ports import free_port as free_port  # re-exported: the launch and audit tests import it from here

SSHD = "/usr/sbin/sshd"
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: host key types the harness can give a node, by the name ssh-keygen -t uses; the known_hosts type of
#: each is in KEY_TYPE_NAMES
HOST_KEY_TYPES = ("ed25519", "ecdsa", "rsa")
KEY_TYPE_NAMES = {"ed25519": "ssh-ed25519", "ecdsa": "ecdsa-sha2-nistp256", "rsa": "ssh-rsa"}


def sshd_available() -> bool:
    return os.access(SSHD, os.X_OK)


@dataclass(frozen=True)
class HarnessNode:
    name: str
    host: str
    port: int


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public_line: str  # "ssh-ed25519 AAAA..."

    @property
    def fingerprint(self) -> str:
        blob = base64.b64decode(self.public_line.split()[1])
        return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def generate_keypair(path: Path, comment: str = "", key_type: str = "ed25519") -> KeyPair:
    """A key (ed25519 unless `key_type` is "ecdsa" (nistp256) or "rsa" (2048 bits)) in OpenSSH format
    at `path` (mode 600) and `path.pub`."""
    key: Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
    if key_type == "ed25519":
        key = Ed25519PrivateKey.generate()
    elif key_type == "ecdsa":
        key = ec.generate_private_key(ec.SECP256R1())
    elif key_type == "rsa":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    else:
        raise ValueError(f"key_type must be one of {HOST_KEY_TYPES}, got {key_type!r}")
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    line = public.decode() + (f" {comment}" if comment else "")
    path.with_name(path.name + ".pub").write_text(line + "\n")
    return KeyPair(path, public.decode())


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def default_roles(n: int) -> list[list[str]]:
    if n == 1:
        return [["prefill", "decode"]]
    half = n // 2
    return [["prefill"] if i < half else ["decode"] for i in range(n)]


class SshdProcess:
    """One sshd (foreground, -D) serving one node."""

    def __init__(self, node_dir: Path, prefix: list[str]) -> None:
        self.config = node_dir / "sshd_config"
        self.log = node_dir / "sshd.log"
        self.prefix = prefix
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, host: str, port: int, timeout: float = 10.0) -> None:
        argv = [*self.prefix, SSHD, "-D", "-f", str(self.config), "-E", str(self.log)]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                log = self.log.read_text(errors="replace") if self.log.exists() else ""
                raise RuntimeError(
                    f"sshd for {host}:{port} exited {self.proc.returncode}: {err}{log[-2000:]}"
                )
            with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5) as s:
                s.settimeout(2)
                if s.recv(4).startswith(b"SSH-"):
                    return
            time.sleep(0.005)
        self.stop()
        raise RuntimeError(f"sshd for {host}:{port} did not start within {timeout}s (log: {self.log})")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class SshCluster:
    """N real sshd "nodes" on loopback. Build it with the `ssh_cluster` fixture (tests/conftest.py)."""

    def __init__(
        self,
        root: Path,
        n_nodes: int = 2,
        *,
        names: list[str] | None = None,
        roles: list[list[str]] | None = None,
        extra_sshd_config: str = "",
        sshd_prefix: list[str] | None = None,
        host_key_types: tuple[str, ...] | list[str] = ("ed25519",),
        node_sshd_config: dict[str, str] | None = None,
        sftp_subsystem: str | None = "internal-sftp",
    ) -> None:
        if names is not None:
            n_nodes = len(names)
        if n_nodes < 1 or n_nodes > 250:
            raise ValueError("n_nodes must be 1..250")
        self.root = root
        self.names = names or [f"node-{i + 1:02d}" for i in range(n_nodes)]
        self.roles = roles or default_roles(n_nodes)
        if len(self.roles) != n_nodes:
            raise ValueError("roles needs one entry per node")
        self.extra_sshd_config = extra_sshd_config
        self.node_sshd_config = dict(node_sshd_config or {})
        if unknown := set(self.node_sshd_config) - set(self.names):
            raise ValueError(f"node_sshd_config names unknown nodes: {sorted(unknown)}")
        self.sftp_subsystem = sftp_subsystem
        self.sshd_prefix = list(sshd_prefix or [])
        if not host_key_types or any(t not in HOST_KEY_TYPES for t in host_key_types):
            raise ValueError(f"host_key_types: one or more of {HOST_KEY_TYPES}")
        self.user = getpass.getuser()
        self.is_root = os.geteuid() == 0
        self._user_key = generate_keypair(root / "user_key", "inferctl-test-user")
        (root / "authorized_keys").write_text(self._user_key.public_line + "\n")
        (root / "authorized_keys").chmod(0o600)
        if self.is_root:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        net = f"127.{random.randint(16, 250)}.{random.randint(0, 255)}"
        self.nodes: list[HarnessNode] = []
        self._host_keys: dict[str, KeyPair] = {}  # the node's first host key (`host_key`)
        self._all_host_keys: dict[str, dict[str, KeyPair]] = {}  # key type -> key, in HostKey order
        self._sshd: dict[str, SshdProcess] = {}
        try:
            for i, name in enumerate(self.names):
                host = f"{net}.{i + 2}"
                node_dir = root / name
                (node_dir / "bin").mkdir(parents=True)
                self._set_host_keys(name, host_key_types, f"host-{name}")
                self._sshd[name] = SshdProcess(node_dir, self.sshd_prefix)
                self.nodes.append(self._start_node(name, host))
        except BaseException:
            self.close()
            raise
        self.write_known_hosts()

    # ---- accessors -------------------------------------------------------------------------------
    @property
    def identity_file(self) -> Path:
        return self._user_key.private_path

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def accepted_known_hosts(self) -> Path:
        """inferctl's own known_hosts for this cluster (where --accept-new-host-keys writes)."""
        return self.root / "accepted_known_hosts"

    def node(self, name: str) -> HarnessNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def bin_dir(self, name: str) -> Path:
        self.node(name)
        return self.root / name / "bin"

    def sshd_log(self, name: str) -> Path:
        return self.root / name / "sshd.log"

    def host_key_fingerprint(self, name: str, key_type: str | None = None) -> str:
        return self._host_key(name, key_type).fingerprint

    def host_key_line(self, name: str, key_type: str | None = None) -> str:
        """The known_hosts line for this node ("[host]:port ssh-ed25519 AAAA..."); its first host key
        unless `key_type` names another one it has."""
        node = self.node(name)
        return f"{known_hosts_name(node.host, node.port)} {self._host_key(name, key_type).public_line}"

    def host_key_types(self, name: str) -> list[str]:
        """The types of the host keys node `name` serves ("ed25519", "ecdsa", "rsa")."""
        return list(self._all_host_keys[name])

    def _host_key(self, name: str, key_type: str | None) -> KeyPair:
        if key_type is None:
            return self._host_keys[name]
        return self._all_host_keys[name][key_type]

    def write_known_hosts(self, names: list[str] | None = None, path: Path | None = None) -> Path:
        """(Re)write a known_hosts file holding the host keys of `names` (default: every node)."""
        path = path or self.known_hosts
        wanted = self.names if names is None else names
        path.write_text("".join(self.host_key_line(n) + "\n" for n in wanted))
        return path

    def add_executable(self, name: str, tool: str, script: str) -> Path:
        """Drop a stand-in executable `tool` (a shell script body) on node `name`'s PATH."""
        path = self.bin_dir(name) / tool
        path.write_text(script if script.startswith("#!") else "#!/bin/sh\n" + script)
        path.chmod(0o755)
        return path

    def pose_as_unprivileged(self, name: str, user: str = "ops", uid: int = 1000) -> Path:
        """Make node `name`'s login user look unprivileged to `id` (a stand-in on its PATH), so commands
        with sudo=True go through (stand-in) sudo although sshd runs the session as the test's user.
        Under sudo (SUDO_UID set, as sudo and the stand-ins set it) `id` is the real one."""
        return self.add_executable(
            name,
            "id",
            "# stand-in for id(1): an unprivileged login user (tests/sshd_harness.py pose_as_unprivileged)\n"
            'if [ -n "$SUDO_UID" ]; then exec /usr/bin/id "$@"; fi\n'
            'case "$*" in\n'
            f"  -u|-ru|-ur) echo {uid} ;;\n"
            f"  -un|-nu|'-u -n'|'-n -u') echo {user} ;;\n"
            f"  -g) echo {uid} ;;\n"
            f"  '') echo 'uid={uid}({user}) gid={uid}({user}) groups={uid}({user})' ;;\n"
            '  *) exec /usr/bin/id "$@" ;;\n'
            "esac\n",
        )

    # ---- profiles --------------------------------------------------------------------------------
    def profile_data(self, **section_overrides: Any) -> dict[str, Any]:
        """A valid profile dict for these nodes. Dict-valued overrides merge into their section
        (`ssh={"sudo": True}`); anything else replaces it (`nodes=[...]`, `name="x"`)."""
        data: dict[str, Any] = {
            "name": "sshd-harness",
            "description": "real sshd nodes on loopback (tests/sshd_harness.py)",
            "ssh": {
                "user": self.user,
                "identity_file": str(self.identity_file),
                "known_hosts": str(self.known_hosts),
                "accepted_known_hosts": str(self.accepted_known_hosts),
                "host_key_policy": "reject",
                "connect_timeout_s": 5.0,
                "command_timeout_s": 30.0,
                "config_file": None,
                "use_agent": False,
                "sudo": not self.is_root,
                "parallelism": 32,
            },
            "nodes": [
                {"name": n.name, "host": n.host, "port": n.port, "roles": list(r)}
                for n, r in zip(self.nodes, self.roles, strict=True)
            ],
        }
        for key, value in section_overrides.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **copy.deepcopy(value)}
            else:
                data[key] = copy.deepcopy(value)
        return data

    def write_profile(self, path: Path | str, **overrides: Any) -> Path:
        path = Path(path)
        path.write_text(yaml.safe_dump(self.profile_data(**overrides), sort_keys=False))
        return path

    # ---- lifecycle -------------------------------------------------------------------------------
    def _write_config(self, name: str, host: str, port: int) -> None:
        node_dir = self.root / name
        lines = [
            f"ListenAddress {host}:{port}",
            *(f"HostKey {key.private_path}" for key in self._all_host_keys[name].values()),
            f"PidFile {node_dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
            "StrictModes no",
            "UsePAM no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "AllowTcpForwarding yes",
            "MaxSessions 64",
            "MaxStartups 512",
            "LoginGraceTime 30",
            "UseDNS no",
            "LogLevel VERBOSE",
            *([f"Subsystem sftp {self.sftp_subsystem}"] if self.sftp_subsystem else []),
            # SHLVL=1 keeps bash (run by sshd) from sourcing ~/.bashrc, which on build machines prepends
            # its own PATH entries (pyenv, cargo) and costs ~0.1 s per command.
            f"SetEnv PATH={node_dir / 'bin'}:{STANDARD_PATH} SHLVL=1 INFERCTL_TEST_NODE={name}",
        ]
        # sshd keeps the FIRST value of a keyword, so extra lines go before our defaults to override
        # them; a Match block must come last, so everything from the first `Match` goes at the end.
        first: list[str] = []
        last: list[str] = []
        for text in (self.node_sshd_config.get(name, ""), self.extra_sshd_config):  # the node's win
            extra = text.splitlines()
            cut = next(
                (i for i, line in enumerate(extra) if line.strip().lower().startswith("match ")), len(extra)
            )
            first += extra[:cut]
            last += extra[cut:]
        lines = first + lines + last
        (node_dir / "sshd_config").write_text("\n".join(lines) + "\n")

    def _start_node(self, name: str, host: str, port: int | None = None) -> HarnessNode:
        last: Exception | None = None
        for _ in range(3):  # a port picked free can be taken by a parallel test before sshd binds it
            chosen = port or free_port(host)
            self._write_config(name, host, chosen)
            try:
                self._sshd[name].start(host, chosen)
                return HarnessNode(name, host, chosen)
            except RuntimeError as exc:
                last = exc
                if port is not None:
                    break
        raise RuntimeError(f"could not start sshd for {name}: {last}")

    def stop(self, name: str) -> None:
        """Make node `name` unreachable (connection refused)."""
        self._sshd[name].stop()

    def start(self, name: str) -> None:
        node = self.node(name)
        if not self._sshd[name].running:
            self._start_node(name, node.host, node.port)

    def regenerate_host_key(self, name: str) -> None:
        """Give node `name` a new host key (a "reinstalled" or impostor server) and restart it."""
        self.replace_host_keys(name, self.host_key_types(name))

    def replace_host_keys(self, name: str, key_types: tuple[str, ...] | list[str]) -> None:
        """Give node `name` fresh host keys of `key_types` (only those) and restart it: an impostor,
        or a reinstalled node, that serves e.g. only an RSA key where an ed25519 one was known."""
        if not key_types or any(t not in HOST_KEY_TYPES for t in key_types):
            raise ValueError(f"key_types: one or more of {HOST_KEY_TYPES}")
        self.stop(name)
        self._set_host_keys(name, key_types, f"host-{name}-new")
        self.start(name)

    def _set_host_keys(self, name: str, key_types: tuple[str, ...] | list[str], comment: str) -> None:
        node_dir = self.root / name
        keys: dict[str, KeyPair] = {}
        for i, key_type in enumerate(dict.fromkeys(key_types)):
            path = node_dir / ("host_key" if i == 0 else f"host_key_{key_type}")
            keys[key_type] = generate_keypair(path, comment, key_type)
        self._all_host_keys[name] = keys
        self._host_keys[name] = next(iter(keys.values()))

    def close(self) -> None:
        for proc in self._sshd.values():
            proc.stop()


def cluster_factory(tmp_root: Path) -> tuple[Callable[..., SshCluster], Callable[[], None]]:
    """A factory building clusters under `tmp_root`, and a teardown stopping all of them."""
    clusters: list[SshCluster] = []

    def make(n_nodes: int = 2, **kwargs: Any) -> SshCluster:
        root = tmp_root / f"cluster{len(clusters)}"
        root.mkdir(parents=True)
        cluster = SshCluster(root, n_nodes, **kwargs)
        clusters.append(cluster)
        return cluster

    def teardown() -> None:
        for cluster in clusters:
            cluster.close()
        shutil.rmtree(tmp_root, ignore_errors=True)

    return make, teardown
