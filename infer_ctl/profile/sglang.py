"""How SGLang is installed and launched on the nodes."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from infer_ctl.profile.base import Port, StrictModel
from infer_ctl.profile.hicache import HiCache

#: host None means "the node's own address" (`nodes[].host`): routable from the other nodes (the
#: prefill's bootstrap server listens on --host) and distinct per node, so several nodes on one
#: machine (the loopback test harness, the local demo) do not collide on 0.0.0.0.
BindHost = str | None


def _node_path(value: str) -> str:
    """A directory on the nodes, written into units and env files: absolute (systemd refuses a relative
    EnvironmentFile= and ExecStart=, and launch would resolve it against the SSH user's home), and
    without whitespace, control characters or `%` (EnvironmentFile= cannot quote them; `%` starts a
    systemd specifier). `{node}` is replaced by the node name."""
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path on the nodes, got {value!r} (starting with /)")
    bad = sorted({c for c in value if c.isspace() or ord(c) < 32 or ord(c) == 127 or c == "%"})
    if bad:
        raise ValueError(f"{value!r} contains {', '.join(repr(c) for c in bad)}, which systemd units cannot carry")
    return value


#: an absolute directory on the nodes (see _node_path)
NodePath = Annotated[str, AfterValidator(_node_path)]
#: a user name as useradd(8) takes it (lowercase, digits, `_` and `-`, not starting with a digit or `-`)
UnixUser = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")]


class _ServerBase(StrictModel):
    host: BindHost = None
    #: tensor/data parallel size of this role's instances (default: models.target.tp / dp)
    tp: Annotated[int, Field(ge=1, le=64)] | None = None
    dp: Annotated[int, Field(ge=1, le=64)] | None = None


class PrefillServer(_ServerBase):
    port: Port = 30000
    bootstrap_port: Port = 8998


class DecodeServer(_ServerBase):
    port: Port = 30001


class CollocatedServer(_ServerBase):
    port: Port = 30000


class ExtraArgs(StrictModel):
    prefill: list[str] = Field(default_factory=list)
    decode: list[str] = Field(default_factory=list)
    collocated: list[str] = Field(default_factory=list)


class DisaggregationTimeouts(StrictModel):
    """SGLANG_DISAGGREGATION_* environment of the servers (SGLang 0.5.23 defaults)."""

    #: prefill waits this long for the decode's KV indices
    bootstrap_timeout_s: Annotated[int, Field(ge=1)] = 300
    #: decode waits this long for the KV to land
    waiting_timeout_s: Annotated[int, Field(ge=1)] = 300
    heartbeat_interval_s: Annotated[float, Field(gt=0)] = 5.0
    heartbeat_max_failure: Annotated[int, Field(ge=1)] = 2


class Lifecycle(StrictModel):
    """How `inferctl launch/stop` run the servers."""

    #: auto: systemd units where systemd runs (PID 1 is systemd), else a managed background process
    supervisor: Literal["auto", "systemd", "process"] = "auto"
    #: where env files (and, for the process supervisor, pid files) live on the nodes; `{node}` is
    #: replaced by the node name (for nodes sharing a filesystem)
    config_dir: NodePath = "/etc/inferctl"
    #: model loading and CUDA-graph capture can take many minutes
    start_timeout_s: Annotated[float, Field(gt=0)] = 1800.0
    #: graceful stop (SIGTERM) before SIGKILL; RDMA registrations leak on kill -9
    stop_timeout_s: Annotated[float, Field(gt=0)] = 120.0
    limit_nofile: Annotated[int, Field(ge=1024)] = 1048576
    #: systemd runs the servers as this user (User=/Group=), which `inferctl provision` creates (a
    #: system user with a home for torch/triton caches); "root" is the opt-in to run them as root. The
    #: process supervisor (no systemd) runs them as the SSH user.
    user: UnixUser = "inferctl-sglang"
    #: systemd restarts a server that fails (Restart=on-failure) at most this many times within
    #: restart_limit_burst x (start_timeout_s + restart_sec), then stops trying (start limit hit):
    #: a server that runs out of memory while loading is not restarted forever
    restart_limit_burst: Annotated[int, Field(ge=1, le=100)] = 3
    #: systemd's pause before such a restart (RestartSec=)
    restart_sec: Annotated[float, Field(gt=0)] = 15.0


class KvEvents(StrictModel):
    """SGLang 0.5.23's `KVEventsConfig` (sglang/srt/disaggregation/kv_events.py), field for field. SGLang's
    own defaults apply to what is left out, and only what is set is rendered; note `publisher` defaults
    to "null" there, which publishes nothing."""

    publisher: Literal["null", "zmq"] = "null"
    #: the PUB socket; DP rank r of a server publishes on this port + r
    endpoint: str = "tcp://*:5557"
    #: bind (true) or connect (false) the PUB socket; unset: bind a wildcard host, connect a concrete one
    bind: bool | None = None
    #: the ROUTER socket answering replay requests (rank r: this port + r)
    replay_endpoint: str | None = None
    buffer_steps: Annotated[int, Field(ge=0)] = 10_000
    hwm: Annotated[int, Field(ge=0)] = 100_000
    max_queue_size: Annotated[int, Field(ge=0)] = 100_000
    topic: str = ""
    format: Literal["default", "dynamo"] = "default"

    def to_json(self) -> str:
        """The --kv-events-config value: the keys the profile sets, sorted, compact."""
        return json.dumps(self.model_dump(exclude_unset=True), sort_keys=True, separators=(",", ":"))


class SglangSettings(StrictModel):
    version: Annotated[str, Field(pattern=r"^\d+\.\d+(\.\d+)?([a-z0-9.+-]*)$")] = "0.5.23"
    #: directory holding versioned venvs (`<venv>/<version>/bin/python`) and the `current` symlink
    venv: NodePath = "/opt/inferctl/venvs"
    #: a local wheelhouse directory for air-gapped installs
    wheelhouse: str | None = None
    #: a lockfile pinning SGLang and every dependency by version and sha256 (`inferctl provision lock`
    #: makes it once), on this machine, relative to the profile: every node installs exactly it, and
    #: `provision wheelhouse build --lock` downloads exactly it. Unset: each node resolves
    #: `sglang==<version>` from its index on its own.
    lock_file: str | None = None
    python: str = "python3"
    transfer_backend: Literal["mooncake", "nixl", "mooncake_tcp"] = "mooncake"
    prefill: PrefillServer = Field(default_factory=PrefillServer)
    decode: DecodeServer = Field(default_factory=DecodeServer)
    collocated: CollocatedServer = Field(default_factory=CollocatedServer)
    extra_args: ExtraArgs = Field(default_factory=ExtraArgs)
    #: extra environment for the servers (no secrets: values land in env files on the nodes)
    env: dict[str, str] = Field(default_factory=dict)
    mem_fraction_static: Annotated[float, Field(gt=0, lt=1)] | None = None
    #: passed to every server as --kv-events-config (the keys set here, as JSON) when set
    kv_events: KvEvents | None = None
    #: SGLang's hierarchical KV cache (host DRAM and storage tiers) per role (profile/hicache.py)
    hicache: HiCache | None = None
    #: server log files of the process supervisor (`{node}` is replaced by the node name)
    log_dir: NodePath = "/var/log/inferctl"
    #: --enable-metrics (/metrics; `check servers` reads queue gauges from it)
    enable_metrics: bool = True
    #: --enable-cache-report (cached_tokens in OpenAI usage; the router and bench read it)
    enable_cache_report: bool = True
    #: first port of --dist-init-addr for instances spanning nodes (prefill +0, decode +1)
    dist_init_port: Port = 25000
    disaggregation: DisaggregationTimeouts = Field(default_factory=DisaggregationTimeouts)
    lifecycle: Lifecycle = Field(default_factory=Lifecycle)
    #: SGLang 0.5.23's --enable-pd-role-switch on every prefill and decode server: `inferctl pd control`
    #: may move them between the pools at runtime (POST /pd_role_switch). SGLang refuses it together with
    #: speculative decoding (models.draft), and so does the profile
    pd_role_switch: bool = False
