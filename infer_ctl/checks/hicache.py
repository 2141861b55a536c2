"""The HiCache part of `check servers`: each healthy server that the profile runs with HiCache (or decode
KV offload) is read over HTTP from the controller, `/metrics` and, with a storage tier,
`GET /hicache/storage-backend` (with the admin key from `sglang.hicache.admin_api_key_env`), and judged
by core/sglang/hicache_health.py: host pool full and evicting, write-back / write-through losses,
storage detached at runtime (with the exact re-attach request as the remedy), another backend or other
policies attached at runtime, failing prefetches; why the runtime state could not be read."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx

from infer_ctl.core.findings import Finding
from infer_ctl.core.sglang import Instance, build_argv
from infer_ctl.core.sglang.consistency import effective_args
from infer_ctl.core.sglang.hicache_argv import DECODE_OFFLOAD_FLAG, ENABLE_FLAG
from infer_ctl.core.sglang.hicache_health import (
    STORAGE_ENDPOINT,
    StorageLaunch,
    judge_backup,
    judge_host,
    judge_storage,
    parse_metrics,
)
from infer_ctl.launch import probe
from infer_ctl.profile import Profile


def _get(http: httpx.Client, url: str, headers: dict[str, str]) -> tuple[int | None, str, str | None]:
    try:
        resp = http.get(url, headers=headers)
    except httpx.HTTPError as exc:
        return None, "", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return resp.status_code, resp.text, None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def hicache_findings(profile: Profile, healthy: list[Instance], *, timeout: float = 5.0) -> list[Finding]:
    hc = profile.sglang.hicache
    key_env = hc.admin_api_key_env if hc is not None else None
    key = os.environ.get(key_env) if key_env else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    out: list[Finding] = []
    with probe.client(timeout=timeout) as http:
        for inst in healthy:
            args = effective_args(build_argv(profile, inst).argv)
            hicache, offload = ENABLE_FLAG in args, DECODE_OFFLOAD_FLAG in args
            if not (hicache or offload):
                continue
            status, text, error = _get(http, inst.url + "/metrics", {})
            if status != 200:
                out.append(Finding.unknown(
                    "servers.hicache_host", inst.node, inst.name,
                    f"{inst.url}/metrics: {error or f'HTTP {status}'}; the HiCache counters cannot be read",
                    remedy="keep sglang.enable_metrics on (--enable-metrics)"))  # fmt: skip
                continue
            metrics = parse_metrics(text)
            if hicache:
                out.append(judge_host(inst, metrics))
            out.append(judge_backup(inst, metrics))
            backend = args.get("--hicache-storage-backend")
            if backend:
                code, body, _ = _get(http, inst.url + STORAGE_ENDPOINT, headers)
                launch = StorageLaunch(  # what the command line runs, SGLang's defaults where unset
                    backend, args.get("--hicache-storage-backend-extra-config"),
                    args.get("--hicache-storage-prefetch-policy") or "timeout",
                    args.get("--hicache-write-policy") or "write_through", key_env, bool(key))  # fmt: skip
                out.extend(judge_storage(inst, metrics, launch, code, _json(body) if code else None))
    return out
