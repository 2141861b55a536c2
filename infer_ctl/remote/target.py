"""Where and as whom to connect: the profile merged with ~/.ssh/config (Host aliases, HostName, User,
Port, IdentityFile, ProxyJump, UserKnownHostsFile, GlobalKnownHostsFile).

Precedence, like OpenSSH's command line over its config: the node's own fields, then the profile's ssh
section (when set explicitly), then ~/.ssh/config, then OpenSSH defaults.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from infer_ctl.errors import ProfileError
from infer_ctl.profile import Node, Profile
from infer_ctl.remote.ssh_config_include import read_with_includes

DEFAULT_KEYS = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
#: OpenSSH's default GlobalKnownHostsFile (ssh_config(5)): read, never written
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")


@dataclass(frozen=True)
class SshTarget:
    label: str  # node name, or the jump host spec
    host: str  # what we connect to (after HostName)
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    jumps: tuple[SshTarget, ...] = field(default=())
    #: known_hosts files ~/.ssh/config names for this host (UserKnownHostsFile, then
    #: GlobalKnownHostsFile or its default), read on top of ssh.known_hosts and inferctl's own file
    known_hosts_files: tuple[str, ...] = DEFAULT_GLOBAL_KNOWN_HOSTS

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def load_ssh_config(path: str | None) -> paramiko.SSHConfig:
    if not path:
        return paramiko.SSHConfig()
    full = Path(path).expanduser()
    if not full.is_file():
        return paramiko.SSHConfig()
    text = read_with_includes(full)  # paramiko reads no Include itself
    try:
        return paramiko.SSHConfig.from_text(text)
    except Exception as exc:  # paramiko raises plain exceptions for bad config lines
        raise ProfileError(
            f"cannot parse SSH config {full}: {exc}", remedy="fix the file, or set ssh.config_file: null"
        ) from None


def parse_hop(spec: str) -> tuple[str | None, str, int | None]:
    """`user@host:port` (any part but host optional) -> (user, host, port)."""
    spec = spec.strip()
    user = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    if spec.startswith("["):  # [v6addr]:port
        host, _, rest = spec[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif spec.count(":") == 1:
        host, port_text = spec.split(":")
        if not port_text.isdigit():
            raise ProfileError(
                f"jump host {spec!r}: port {port_text!r} is not a number", remedy="use user@host:port"
            )
        port = int(port_text)
    else:
        host = spec
    if not host:
        raise ProfileError(f"jump host {spec!r} has no host name", remedy="use user@host:port")
    return user, host, port


class TargetResolver:
    def __init__(self, profile: Profile, ssh_config: paramiko.SSHConfig | None = None) -> None:
        self.profile = profile
        self.settings = profile.ssh
        self.config = ssh_config if ssh_config is not None else load_ssh_config(self.settings.config_file)

    def _explicit(self, name: str) -> bool:
        return name in self.settings.model_fields_set

    def for_node(self, node: Node) -> SshTarget:
        port = node.port or (self.settings.port if self._explicit("port") else None)
        jump_spec = self.settings.jump_host
        return self._resolve(node.name, node.host, node.user or self.settings.user, port, jump_spec, depth=0)

    def _resolve(
        self, label: str, alias: str, user: str | None, port: int | None, jump_spec: str | None, depth: int
    ) -> SshTarget:
        if depth > 8:
            raise ProfileError(
                f"jump host chain for {label} is longer than 8 hops (a loop?)",
                remedy="check ProxyJump in ~/.ssh/config and ssh.jump_host",
            )
        cfg = self.config.lookup(alias)
        host = cfg.get("hostname", alias)
        user = user or cfg.get("user") or self.settings.user or getpass.getuser()
        port = port or int(cfg.get("port", self.settings.port))
        files: list[str] = []
        if self.settings.identity_file:
            files.append(self.settings.identity_file)
        files.extend(cfg.get("identityfile", []))
        if jump_spec is None:
            jump_spec = cfg.get("proxyjump")
        known_hosts = self._known_hosts_files(cfg, alias, host, port, user)
        jumps: list[SshTarget] = []
        if jump_spec and jump_spec.lower() != "none":
            for hop in jump_spec.split(","):
                hop_user, hop_host, hop_port = parse_hop(hop)
                # a hop's own ProxyJump is not followed here: the chain is given left to right
                jumps.append(self._resolve(hop.strip(), hop_host, hop_user, hop_port, "none", depth + 1))
        return SshTarget(label, host, port, user, tuple(dict.fromkeys(files)), tuple(jumps), known_hosts)

    @staticmethod
    def _known_hosts_files(
        cfg: paramiko.SSHConfigDict, alias: str, host: str, port: int, user: str
    ) -> tuple[str, ...]:
        """UserKnownHostsFile (none when unset: ssh.known_hosts plays its part) and GlobalKnownHostsFile
        (OpenSSH's default when unset); `none` reads no file of that kind."""
        files: list[str] = []
        tokens = {"h": host, "n": alias, "k": alias, "p": str(port), "r": user}
        for key, default in (("userknownhostsfile", ()), ("globalknownhostsfile", DEFAULT_GLOBAL_KNOWN_HOSTS)):
            value = cfg.get(key)
            words = _split_words(value) if value else list(default)
            if [w.lower() for w in words] == ["none"]:
                continue
            files.extend(expand_path_tokens(w, tokens) for w in words)
        return tuple(dict.fromkeys(files))


def _split_words(value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError:  # an unbalanced quote: take the words as they are, like a lenient reader
        return value.split()


_TOKEN = re.compile(r"%(.)|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_path_tokens(path: str, tokens: dict[str, str]) -> str:
    """ssh_config(5) TOKENS and ${VAR} in a file name, then `~`: %% %d %u %i and the host's own (%h %n
    %k %p %r). Unknown tokens stay as written (the file then simply does not exist)."""
    local = {"%": "%", "d": os.path.expanduser("~"), "u": getpass.getuser(), "i": str(os.getuid()), **tokens}

    def one(m: re.Match[str]) -> str:
        if m.group(2) is not None:
            return os.environ.get(m.group(2), "")
        return local.get(m.group(1), m.group(0))

    return os.path.expanduser(_TOKEN.sub(one, path))


def default_key_files() -> list[str]:
    return [k for k in DEFAULT_KEYS if os.path.isfile(os.path.expanduser(k))]
