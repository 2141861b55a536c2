"""How SGLang is installed and launched on the nodes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from infer_ctl.profile.base import Port, StrictModel


class PrefillServer(StrictModel):
    port: Port = 30000
    bootstrap_port: Port = 8998
    #: address the server (and its bootstrap server) listens on; must be routable from decode nodes
    host: str = "0.0.0.0"


class DecodeServer(StrictModel):
    port: Port = 30001
    host: str = "0.0.0.0"


class CollocatedServer(StrictModel):
    port: Port = 30000
    host: str = "0.0.0.0"


class ExtraArgs(StrictModel):
    prefill: list[str] = Field(default_factory=list)
    decode: list[str] = Field(default_factory=list)
    collocated: list[str] = Field(default_factory=list)


class SglangSettings(StrictModel):
    version: Annotated[str, Field(pattern=r"^\d+\.\d+(\.\d+)?([a-z0-9.+-]*)$")] = "0.5.23"
    #: directory holding versioned venvs and the `current` symlink
    venv: str = "/opt/inferctl/venvs"
    #: a local wheelhouse directory for air-gapped installs
    wheelhouse: str | None = None
    python: str = "python3"
    transfer_backend: Literal["mooncake", "nixl", "mooncake_tcp"] = "mooncake"
    prefill: PrefillServer = Field(default_factory=PrefillServer)
    decode: DecodeServer = Field(default_factory=DecodeServer)
    collocated: CollocatedServer = Field(default_factory=CollocatedServer)
    extra_args: ExtraArgs = Field(default_factory=ExtraArgs)
    #: extra environment for the servers (no secrets: values land in env files on the nodes)
    env: dict[str, str] = Field(default_factory=dict)
    mem_fraction_static: Annotated[float, Field(gt=0, lt=1)] | None = None
    #: passed to --kv-events-config as JSON when set
    kv_events: dict[str, str | int | float | bool] | None = None
    log_dir: str = "/var/log/inferctl"
