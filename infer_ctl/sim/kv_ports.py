"""Every simulated worker of one process its own KV-event ports.

SGLang runs one publisher per DP rank and moves the configured ports by the rank
(`ZmqEventPublisher.offset_endpoint_port`, sglang/srt/disaggregation/kv_events.py): rank r binds
endpoint port + r and replay port + r. The simulator's workers all run on this host, so it does the
same per worker: the i-th worker of `inferctl sim serve` (in the order they are listed: `--from-profile`
servers, then `--worker`, then `--prefill`, `--decode`, `--mixed`) is given the config with both ports
moved by i, and `/server_info.kv_events` of each worker advertises its own ports. As with SGLang's DP
ranks, the replay port must then sit at least N ports past the endpoint port (N workers), or two workers
would bind one port: that is refused before anything starts.
"""

from __future__ import annotations

import json
from dataclasses import replace

from infer_ctl.sim.config import WorkerSpec
from infer_ctl.sim.kv_config import bound_ports, for_worker, parse_kv_events_config


def assign_kv_event_ports(specs: list[WorkerSpec], config: str | None = None) -> list[WorkerSpec]:
    """`specs` with their KV-events config (`config` for all when given, else each spec's own) moved
    to worker i's ports. Raises ValueError when two workers would bind one port."""
    out: list[WorkerSpec] = []
    taken: dict[int, str] = {}
    for i, spec in enumerate(specs):
        text = config if config is not None else spec.kv_events_config
        cfg = parse_kv_events_config(text)
        if text is None or cfg is None:
            out.append(spec)
            continue
        mine = for_worker(cfg, i)
        who = f"worker {i} ({spec.role})"
        for socket, port in bound_ports(mine):
            if port > 65535:
                raise ValueError(f"--kv-events-config: {who} would bind {socket} port {port}, past 65535")
            if port in taken:
                raise ValueError(
                    f"--kv-events-config: {who} would bind {socket} port {port}, as {taken[port]} does "
                    f"(worker i binds the ports + i); put replay_endpoint at least {len(specs)} ports "
                    "after endpoint"
                )
            taken[port] = f"{who} {socket}"
        out.append(replace(spec, kv_events_config=_moved(text, mine.endpoint, mine.replay_endpoint, i)))
    return out


def _moved(text: str, endpoint: str, replay: str | None, i: int) -> str:
    """The worker's --kv-events-config as the user wrote it, with only its ports changed."""
    if i == 0:
        return text
    raw = json.loads(text)
    raw["endpoint"] = endpoint
    if replay is not None:
        raw["replay_endpoint"] = replay
    return json.dumps(raw, separators=(",", ":"))
