"""How inferctl reaches nodes. Secrets never live here: keys via files/agent, passwords via env vars."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from infer_ctl.profile.base import Port, PositiveFloat, StrictModel


class SshSettings(StrictModel):
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    #: inferctl's own known_hosts, where --accept-new-host-keys records keys (never ~/.ssh/known_hosts);
    #: null means $XDG_STATE_HOME/inferctl/known_hosts (default ~/.local/state/inferctl/known_hosts)
    accepted_known_hosts: str | None = None
    #: reject: unknown host keys are refused. accept-new: unknown keys are recorded (changed keys never are)
    host_key_policy: Literal["reject", "accept-new"] = "reject"
    port: Port = 22
    connect_timeout_s: PositiveFloat = 10.0
    command_timeout_s: PositiveFloat = 120.0
    keepalive_s: Annotated[int, Field(ge=0)] = 15
    parallelism: Annotated[int, Field(ge=1, le=1024)] = 32
    #: user@host:port of a bastion; chains are comma separated (like OpenSSH's ProxyJump)
    jump_host: str | None = None
    config_file: str | None = "~/.ssh/config"
    use_agent: bool = True
    #: use `sudo -n` for privileged steps
    sudo: bool = True
    #: name of an environment variable holding the sudo password (sent on stdin, never in argv)
    sudo_password_env: str | None = None
