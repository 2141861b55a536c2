"""The load generator: sends a workload to one URL (a router or a worker) and records each request.

Streaming is used for every request so time-to-first-token and inter-token latency are measured on
the wire. Latencies are divided by `time_scale` (the simulator's wall seconds per model second; 1.0
for real servers), so a fast-forwarded simulated run reports modelled latencies.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from infer_ctl.bench.stats import RequestResult
from infer_ctl.bench.workloads import BenchRequest
from infer_ctl.core.routing.spec_fields import (
    META_CORRECT_DRAFTS_HISTOGRAM,
    META_VERIFY_CT,
    SpecFieldError,
    decode_meta_info,
    decode_openai_response,
)

APIS = ("generate", "chat")


@dataclass(frozen=True)
class LoadSpec:
    concurrency: int | None = 32  # jobs in flight; None with rate set = open loop
    rate: float | None = None  # requests per second (Poisson arrivals), open loop
    seed: int = 0
    api: str = "generate"
    time_scale: float = 1.0
    timeout_s: float = 600.0
    #: SGLang's per-request label (`custom_labels: {"domain": ...}`): the router and SGLang's metrics
    #: account each request to it
    domain: str | None = None
    #: a tenant's API key, sent as `Authorization: Bearer` (the router's tenants); read by the CLI from
    #: an environment variable so the secret is never in argv (ps, shell history); kept out of repr
    api_key: str | None = field(default=None, repr=False)


@dataclass
class LoadRun:
    results: list[RequestResult]
    duration_s: float
    #: why the run stopped before sending everything (None: it sent everything), and how many it did not send
    stopped: str | None = None
    not_sent: int = 0


async def detect_time_scale(url: str, timeout_s: float = 5.0) -> float:
    """The simulator advertises its time scale in /server_info (`sim.time_scale`); others mean 1.0."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s,
            s.get(url.rstrip("/") + "/server_info") as r,
        ):
            if r.status != 200:
                return 1.0
            info = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return 1.0
    sim = info.get("sim") if isinstance(info, dict) else None
    if not isinstance(sim, dict):  # behind sglang-router's /get_server_info aggregation
        for part in (info.get("prefill") or []) if isinstance(info, dict) else []:
            if isinstance(part, dict) and isinstance(part.get("sim"), dict):
                sim = part["sim"]
                break
    try:
        return float(sim["time_scale"]) if isinstance(sim, dict) else 1.0
    except (KeyError, TypeError, ValueError):
        return 1.0


def _payload(req: BenchRequest, api: str, domain: str | None = None) -> tuple[str, dict[str, Any]]:
    labels = {"custom_labels": {"domain": domain}} if domain else {}
    if api == "chat":
        return "/v1/chat/completions", {
            "model": "default",
            "messages": req.messages or [{"role": "user", "content": req.text}],
            "max_tokens": req.max_new_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            **labels,
        }
    return "/generate", {
        "text": req.text,
        "sampling_params": {"max_new_tokens": req.max_new_tokens, "ignore_eos": True},
        "stream": True,
        **labels,
    }


async def send_one(
    session: aiohttp.ClientSession, url: str, req: BenchRequest, load: LoadSpec, t_run: float,
    headers: dict[str, str] | None = None,
) -> RequestResult:
    loop = asyncio.get_running_loop()
    scale = load.time_scale
    path, body = _payload(req, load.api, load.domain)
    t0 = loop.time()
    res = RequestResult(index=req.index, tenant=req.tenant, ok=False, start=t0 - t_run)
    last: float | None = None
    seen = 0
    try:
        async with session.post(url.rstrip("/") + path, json=body, headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                res.error = f"HTTP {resp.status}: {text}"
                return res
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                obj = json.loads(data)
                now = loop.time()
                if "error" in obj:
                    res.error = str(obj["error"])[:300]
                    return res
                n = _tokens_in_chunk(obj, load.api, seen)
                if load.api == "generate":
                    meta = obj.get("meta_info") or {}
                    finish = meta.get("finish_reason") or {}
                    if finish.get("type") == "abort":
                        res.error = str(finish.get("message"))[:300]
                        return res
                    res.prompt_tokens = int(meta.get("prompt_tokens", 0))
                    res.cached_tokens = int(meta.get("cached_tokens", 0))
                    res.completion_tokens = seen = int(meta.get("completion_tokens", seen))
                    if META_VERIFY_CT in meta or META_CORRECT_DRAFTS_HISTOGRAM in meta:  # the finishing chunk
                        res.spec = _spec(decode_meta_info, meta)
                elif obj.get("sglext"):  # SGLang's SpecTokensDetails (return_spec_tokens_details)
                    found = _spec(decode_openai_response, obj)
                    res.spec = found[0] if found else None
                if load.api == "chat" and obj.get("usage"):
                    u = obj["usage"]
                    res.prompt_tokens = int(u.get("prompt_tokens", 0))
                    res.completion_tokens = int(u.get("completion_tokens", 0))
                    details = u.get("prompt_tokens_details") or {}
                    res.cached_tokens = int(details.get("cached_tokens") or 0)
                if n > 0:
                    if res.ttft is None:
                        res.ttft = (now - t0) / scale
                    elif last is not None:
                        res.itls.extend([(now - last) / scale / n] * n)
                    last = now
                    if load.api == "chat":
                        seen += n
        res.e2e = (loop.time() - t0) / scale
        res.ok = res.ttft is not None or req.max_new_tokens == 0
        if not res.ok:
            res.error = "the stream ended without any token"
    except aiohttp.ClientConnectorError as exc:  # refused, unresolvable, no route: nothing answered
        res.error = f"{type(exc).__name__}: {exc}"
        res.unreachable = True
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:300]
    return res


def _spec(decode: Any, obj: Any) -> Any:
    """Decoded speculative fields; a malformed set is left out of the report, not an error of the request."""
    try:
        return decode(obj)
    except SpecFieldError:
        return None


def _tokens_in_chunk(obj: dict[str, Any], api: str, seen: int) -> int:
    if api == "generate":
        meta = obj.get("meta_info") or {}
        return max(0, int(meta.get("completion_tokens", seen)) - seen)
    choices = obj.get("choices") or []
    if choices and (choices[0].get("delta") or {}).get("content"):
        return 1  # OpenAI chunks do not carry token counts: count one step per content chunk
    return 0


def _jobs(requests: list[BenchRequest]) -> list[list[BenchRequest]]:
    """Multi-turn sessions run their turns in order; everything else is one request per job."""
    sessions: dict[int, list[BenchRequest]] = {}
    jobs: list[list[BenchRequest]] = []
    for r in requests:
        if r.session is None:
            jobs.append([r])
        else:
            if r.session not in sessions:
                sessions[r.session] = []
                jobs.append(sessions[r.session])
            sessions[r.session].append(r)
    return jobs


async def run_load(
    url: str,
    requests: list[BenchRequest],
    load: LoadSpec,
    on_result: Callable[[RequestResult], None] | None = None,
) -> LoadRun:
    """Run the workload; returns the results (in request order) and the wall duration.

    Fail fast: a connection refused (or unresolvable host) before any request succeeded means nothing
    listens there, so no further request is sent. Against a dead address the run used to send every
    request and print an empty table (issue 29)."""
    if load.api not in APIS:
        raise ValueError(f"unknown api {load.api!r}; known: {', '.join(APIS)}")
    if load.rate is None and (load.concurrency is None or load.concurrency < 1):
        raise ValueError("give a concurrency >= 1 or a request rate")
    if load.rate is not None and load.rate <= 0:
        raise ValueError("rate must be positive")
    loop = asyncio.get_running_loop()
    results: list[RequestResult] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=load.timeout_s)
    headers = {"Authorization": f"Bearer {load.api_key}"} if load.api_key else None
    completed = 0
    stopped: str | None = None
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t_run = loop.time()

        async def job(reqs: list[BenchRequest]) -> None:
            nonlocal completed, stopped
            for r in reqs:
                if stopped:
                    return
                res = await send_one(session, url, r, load, t_run, headers)
                results.append(res)
                completed += res.ok
                if res.unreachable and not completed and stopped is None:
                    stopped = f"cannot connect to {url}: {res.error}"
                if on_result:
                    on_result(res)

        jobs = _jobs(requests)
        if load.rate is not None:
            rng = random.Random(load.seed)
            tasks = []
            for j in jobs:
                if stopped:
                    break
                tasks.append(asyncio.create_task(job(j)))
                await asyncio.sleep(rng.expovariate(load.rate))
            await asyncio.gather(*tasks)
        else:
            queue: asyncio.Queue[list[BenchRequest]] = asyncio.Queue()
            for j in jobs:
                queue.put_nowait(j)

            async def worker() -> None:
                while not queue.empty() and not stopped:
                    await job(queue.get_nowait())

            assert load.concurrency is not None
            await asyncio.gather(*(worker() for _ in range(min(load.concurrency, len(jobs)))))
        duration = loop.time() - t_run
    results.sort(key=lambda r: r.index)
    return LoadRun(results, duration, stopped, len(requests) - len(results))
