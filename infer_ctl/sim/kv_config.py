"""`--kv-events-config`: SGLang 0.5.23's JSON, its per-rank port offset and its `/server_info` descriptor. Pure.

The schema is SGLang's `KVEventsConfig` (sglang/srt/disaggregation/kv_events.py): `publisher` ("null" or
"zmq"; "null" publishes nothing), `endpoint` (the PUB socket, `tcp://*:5557`), `bind` (bind or connect the
PUB socket; unset: bind a wildcard host, `ipc://` or `inproc://`, connect anything else), `replay_endpoint`
(a ROUTER socket, always bound, answering replay requests), `buffer_steps` (batches kept for replay),
`hwm` (the PUB socket's high-water mark), `max_queue_size` (batches waiting for the publisher thread),
`topic` (the first frame of every message) and `format` ("default" or "dynamo"). Unlike SGLang's pydantic
model, which ignores unknown keys, an unknown key is refused here: a misspelt key would otherwise silently
fall back to a default.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

PUBLISHERS = ("null", "zmq")
FORMATS = ("default", "dynamo")
DEFAULT_ENDPOINT = "tcp://*:5557"
#: hosts SGLang's describe/bind treat as "every interface"
WILDCARD_HOSTS = ("*", "0.0.0.0", "::")

_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]*\]|[^\[\]]*):(?P<port>\d+)$")


@dataclass(frozen=True)
class KvEventsConfig:
    publisher: str = "null"
    endpoint: str = DEFAULT_ENDPOINT
    bind: bool | None = None
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    format: str = "default"

    @property
    def enabled(self) -> bool:
        return self.publisher == "zmq"

    def should_bind(self) -> bool:
        """SGLang's rule (ZmqEventPublisher._socket_setup): `bind` if set, else bind an endpoint that
        names a wildcard host or a local transport and connect to anything else."""
        if self.bind is not None:
            return self.bind
        e = self.endpoint
        return any(w in e for w in ("*", "::", "0.0.0.0")) or e.startswith(("ipc://", "inproc://"))


_TYPES: dict[str, tuple[type, ...]] = {
    "publisher": (str,),
    "endpoint": (str,),
    "bind": (bool, type(None)),
    "replay_endpoint": (str, type(None)),
    "buffer_steps": (int,),
    "hwm": (int,),
    "max_queue_size": (int,),
    "topic": (str,),
    "format": (str,),
}


def parse_kv_events_config(text: str | None) -> KvEventsConfig | None:
    """The config of one `--kv-events-config` value (None: the flag is absent). Raises ValueError with
    the reason, as SGLang refuses a malformed config at start-up."""
    if text is None or not text.strip():
        return None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--kv-events-config is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("--kv-events-config must be a JSON object")
    unknown = sorted(set(raw) - set(_TYPES))
    if unknown:
        raise ValueError(
            f"--kv-events-config: unknown key(s) {', '.join(unknown)}; known: {', '.join(_TYPES)}"
        )
    for key, value in raw.items():
        ok = _TYPES[key]
        if not isinstance(value, ok) or (isinstance(value, bool) and bool not in ok):
            raise ValueError(f"--kv-events-config: {key} has the wrong type ({type(value).__name__})")
    cfg = KvEventsConfig(**raw)
    if cfg.publisher not in PUBLISHERS:
        raise ValueError(f"Unknown event publisher '{cfg.publisher}' (known: {', '.join(PUBLISHERS)})")
    if cfg.format not in FORMATS:
        raise ValueError(
            f"--kv-events-config: format must be one of {', '.join(FORMATS)}, got {cfg.format!r}"
        )
    for key in ("buffer_steps", "hwm", "max_queue_size"):
        if getattr(cfg, key) < 0:
            raise ValueError(f"--kv-events-config: {key} must not be negative")
    return cfg


def offset_endpoint(endpoint: str | None, rank: int) -> str | None:
    """SGLang's `ZmqEventPublisher.offset_endpoint_port`: rank r of a server publishes on the endpoint's
    port + r (an `inproc://` name gets `_dp<r>`); rank 0 keeps the endpoint as it is."""
    if not endpoint or rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    if "tcp" in endpoint:
        head, sep, port = endpoint.rpartition(":")
        if not sep or not port.isdigit():
            return endpoint
        return f"{head}:{int(port) + rank}"
    raise ValueError(f"cannot offset {endpoint!r} by {rank}: only tcp:// and inproc:// endpoints can be")


def for_worker(cfg: KvEventsConfig, index: int) -> KvEventsConfig:
    """The config worker `index` of one simulator process is given: its endpoint and replay ports moved
    by `index`, as SGLang moves them per DP rank, because every simulated worker runs on this host."""
    return replace(
        cfg,
        endpoint=offset_endpoint(cfg.endpoint, index) or cfg.endpoint,
        replay_endpoint=offset_endpoint(cfg.replay_endpoint, index),
    )


def tcp_host_port(endpoint: str | None) -> tuple[str, int] | None:
    """(host, port) of a `tcp://host:port` endpoint with a legal port; IPv6 hosts keep their brackets."""
    m = _TCP.match(endpoint or "")
    if not m:
        return None
    port = int(m["port"])
    host = m["host"]
    if not host or not 0 < port <= 65535 or (":" in host and not host.startswith("[")):
        return None  # SGLang refuses a bare IPv6 host as ambiguous
    return host, port


def bound_ports(cfg: KvEventsConfig) -> list[tuple[str, int]]:
    """The (socket, port) pairs this config binds on this host: the PUB port when it binds, the replay port."""
    out: list[tuple[str, int]] = []
    pub = tcp_host_port(cfg.endpoint)
    if cfg.enabled and pub and cfg.should_bind():
        out.append(("endpoint", pub[1]))
    replay = tcp_host_port(cfg.replay_endpoint)
    if cfg.enabled and replay:
        out.append(("replay_endpoint", replay[1]))
    return out


def describe(cfg: KvEventsConfig | None, *, block_size: int, dp_size: int = 1) -> dict[str, Any] | None:
    """`/server_info.kv_events`, SGLang 0.5.23's `describe_kv_events_publisher` (runtime_context.py):
    None when there is no publisher to subscribe to (absent, "null", not a routable tcp:// endpoint, no
    page size). `endpoint_host` may be a wildcard: a subscriber dials the worker URL's host instead.
    The load socket (`--load-publish-endpoint`, off by default) is not simulated, so its keys never appear."""
    if cfg is None or not cfg.enabled or block_size <= 0:
        return None
    pub = tcp_host_port(cfg.endpoint)
    if pub is None:
        return None
    out: dict[str, Any] = {
        "publisher": cfg.publisher,
        "endpoint_host": pub[0],
        "endpoint_port_base": pub[1],
        "topic": cfg.topic,
        "block_size": block_size,
        "dp_size": dp_size,
    }
    replay = tcp_host_port(cfg.replay_endpoint)
    if replay is not None:
        out["replay_endpoint_port_base"] = replay[1]
    return out
