"""HTTP probes of a running SGLang server (real SGLang or the inferctl simulator): /health,
/server_info, /v1/loads. Each returns data or an error string, never raises: callers turn a missing
answer into a state ("starting", "unreachable"), not a crash."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from infer_ctl.core.sglang import Instance


@dataclass(frozen=True)
class Probe:
    ok: bool
    status: int | None = None
    data: Any = None
    error: str | None = None


def get(client: httpx.Client, instance: Instance, path: str) -> Probe:
    try:
        resp = client.get(instance.url + path)
    except httpx.HTTPError as exc:
        return Probe(False, error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    data: Any = None
    if resp.headers.get("content-type", "").startswith("application/json"):
        try:
            data = resp.json()
        except ValueError:
            data = None
    return Probe(
        resp.status_code == 200,
        resp.status_code,
        data,
        None if resp.status_code == 200 else f"HTTP {resp.status_code}",
    )


def health(client: httpx.Client, instance: Instance) -> Probe:
    return get(client, instance, "/health")


def server_info(client: httpx.Client, instance: Instance) -> Probe:
    probe = get(client, instance, "/server_info")
    if probe.ok and not isinstance(probe.data, dict):
        return Probe(False, probe.status, None, "/server_info did not return a JSON object")
    return probe


def loads(client: httpx.Client, instance: Instance) -> Probe:
    probe = get(client, instance, "/v1/loads?include=all")
    if probe.ok and not isinstance(probe.data, dict):
        return Probe(False, probe.status, None, "/v1/loads did not return a JSON object")
    return probe


def client(timeout: float = 5.0) -> httpx.Client:
    # trust_env=False: a proxy from the environment must not sit between us and the cluster's servers
    return httpx.Client(timeout=timeout, trust_env=False)
