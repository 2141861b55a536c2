"""One simulated SGLang worker over HTTP (aiohttp): the server API and, on a prefill, the bootstrap server.

Routes follow `sglang/srt/entrypoints/http_server.py` (0.5.23); see docs/simulator.md for what each
returns and where it departs from SGLang.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from infer_ctl.errors import InferctlError
from infer_ctl.sim import contract
from infer_ctl.sim import protocol as proto
from infer_ctl.sim.config import SGLANG_VERSION, WorkerSpec
from infer_ctl.sim.engine import Engine, SimRequest
from infer_ctl.sim.logprobs import meta_logprobs
from infer_ctl.sim.metrics import render as render_metrics
from infer_ctl.sim.protocol import GenItem, GenRequest, RequestError
from infer_ctl.sim.radix import RadixCache
from infer_ctl.sim.rooms import RoomError, RoomTable, prompt_digest
from infer_ctl.sim.tokenizer import make_tokenizer

DEFAULT_BOOTSTRAP_PORT = 8998
#: SGLang's FAKE_BOOTSTRAP_HOST: requests carrying it use the fake KV sender/receiver (no pairing)
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
#: aiohttp logs every malformed request with a traceback; sglang-router probes each worker with an
#: HTTP/2 preface (gRPC detection) that aiohttp answers with 400, so those logs are noise: keep errors only
#: at CRITICAL on the simulator's own logger (the request still gets its 400).
_HTTP_LOG = logging.getLogger("infer_ctl.sim.http")
_HTTP_LOG.setLevel(logging.CRITICAL)
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _sse(obj: Any) -> bytes:
    return b"data: " + _dumps(obj).encode() + b"\n\n"


class SimBindError(InferctlError):
    def __init__(self, host: str, port: int, exc: OSError) -> None:
        super().__init__(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            remedy="pick another port (or 0 for a free one), or stop whatever listens there",
        )


class SimWorker:
    def __init__(self, spec: WorkerSpec, *, port_fallback: bool = False) -> None:
        self.spec = spec
        #: when the spec's fixed port is busy, listen on a free one instead of failing
        self.port_fallback = port_fallback
        self.timing = spec.timing()
        self.tokenizer = make_tokenizer(spec.tokenizer_path)
        self.cache = RadixCache(self.timing.kv_capacity_tokens, spec.eviction_policy)
        self.rooms = RoomTable()
        self.engine: Engine | None = None
        self.port = spec.port
        self.bootstrap_port: int | None = None
        self.start_time = 0.0
        self.ready = False
        self._runners: list[web.AppRunner] = []
        self._client: aiohttp.ClientSession | None = None
        self._flush_pending = False
        #: connections with a request in flight (both apps): stop() aborts them as a killed process would
        self._inflight: set[asyncio.Transport] = set()

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        self.cache.reset()
        self.rooms = RoomTable()
        self.engine = Engine(
            self.spec.role, self.timing, self.cache, time_scale=self.spec.time_scale, seed=self.spec.seed
        )
        self.engine.start()
        self._client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.port = await self._serve(self._app(), self.port)
        if self.spec.role == "prefill":
            self.bootstrap_port = await self._serve(self._bootstrap_app(), self.spec.bootstrap_port or 0)
        else:
            self.bootstrap_port = self.spec.bootstrap_port
        self.start_time = time.time()
        self.ready = True

    async def _serve(self, app: web.Application, port: int) -> int:
        # handler_cancellation: a client that disconnects cancels its request, as SGLang aborts it
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, logger=_HTTP_LOG)
        await runner.setup()
        site = web.TCPSite(runner, self.spec.host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            if not (self.port_fallback and port):
                await runner.cleanup()
                raise SimBindError(self.spec.host, port, exc) from exc
            # the demo's fixed ports are taken (another demo, a real server): any free port will do, and
            # where extra loopback addresses (127.0.0.11) do not exist (macOS), 127.0.0.1 will do
            try:
                site = web.TCPSite(runner, self.spec.host, 0, reuse_address=True)
                await site.start()
            except OSError:
                self.spec.host = "127.0.0.1"
                site = web.TCPSite(runner, self.spec.host, 0, reuse_address=True)
                await site.start()
        self._runners.append(runner)
        server: Any = site._server  # aiohttp exposes the bound port only through the asyncio server
        return int(server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        self.ready = False
        # A killed SGLang process drops every connection at once: abort the sockets of in-flight requests
        # (handler_cancellation then cancels their handlers, including a decode's wait in _fetch_kv, whose
        # claim on the prefill closes with it) instead of answering them or waiting for their timeouts.
        for transport in list(self._inflight):
            transport.abort()
        self._inflight.clear()
        if self.engine:
            await self.engine.stop()
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        if self._client:
            await self._client.close()
            self._client = None

    # -- apps -------------------------------------------------------------------------------------
    @web.middleware
    async def _track(self, request: web.Request, handler: Any) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            self._inflight.add(transport)
        try:
            response: web.StreamResponse = await handler(request)
            return response
        finally:
            if transport is not None:
                self._inflight.discard(transport)

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=512 * 1024**2, middlewares=[self._track])
        r = app.router
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        r.add_get("/ready", self.ready_handler)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/loads", self.loads)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_get("/metrics", self.metrics)
        r.add_post("/generate", self.generate)
        r.add_put("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        return app

    def _bootstrap_app(self) -> web.Application:
        app = web.Application(middlewares=[self._track])
        app.router.add_get("/health", self.bootstrap_health)
        app.router.add_route("*", "/route", self.bootstrap_route)
        app.router.add_post("/register_dp_rank", self.bootstrap_register_dp_rank)
        app.router.add_post("/query_dp_ranks", self.bootstrap_query_dp_ranks)
        app.router.add_post("/sim/kv/{room}", self.bootstrap_claim)
        return app

    # -- info endpoints -----------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def ready_handler(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)  # SGLang: an empty body either way

    def _mode(self) -> str:
        return "null" if self.spec.role == "mixed" else self.spec.role

    def _server_args(self) -> dict[str, Any]:
        t, s = self.timing, self.spec
        spec_on = t.spec_alpha is not None
        return {
            "model_path": s.model,
            "served_model_name": s.model,
            "tokenizer_path": s.tokenizer_path or s.model,
            "host": s.host,
            "port": self.port,
            "disaggregation_mode": self._mode(),
            "disaggregation_bootstrap_port": self.bootstrap_port or DEFAULT_BOOTSTRAP_PORT,
            "disaggregation_transfer_backend": "mooncake",
            "max_running_requests": t.max_running_requests,
            "max_total_tokens": t.kv_capacity_tokens,
            "chunked_prefill_size": t.chunked_prefill_size,
            "context_length": s.context_length,
            "page_size": 1,
            "tp_size": 8,
            "dp_size": 1,
            "radix_eviction_policy": s.eviction_policy,
            "enable_cache_report": s.enable_cache_report,
            "speculative_algorithm": "EAGLE3" if spec_on else None,
            "speculative_num_steps": t.spec_gamma if spec_on else None,
            "speculative_eagle_topk": 1 if spec_on else None,
            "speculative_num_draft_tokens": t.spec_gamma + 1 if spec_on else None,
            "random_seed": s.seed,
        }

    async def server_info(self, request: web.Request) -> web.Response:
        e = self._engine()
        info = {
            **self._server_args(),
            "launch_command": f"inferctl sim serve --role {self.spec.role} --port {self.port}",
            "version": SGLANG_VERSION,
            "startup_time": self.start_time,
            "frontend": "inferctl-sim",
            "kv_events": None,
            "internal_states": [
                {
                    "last_gen_throughput": e.last_gen_throughput,
                    "avg_spec_accept_length": e.metrics.spec_accept_length,
                    "memory_usage": {"token_capacity": self.timing.kv_capacity_tokens},
                    "effective_max_running_requests_per_dp": self.timing.max_running_requests,
                    "disaggregation_mode": self._mode(),
                }
            ],
            "sim": {
                "role": self.spec.role,
                "preset": self.spec.preset,
                "time_scale": self.spec.time_scale,
                "seed": self.spec.seed,
                "start_time": self.start_time,
                "tokenizer": self.tokenizer.name,
            },
        }
        return web.json_response(info)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.spec.model,
                "served_model_name": self.spec.model,
                "tokenizer_path": self.spec.tokenizer_path or self.spec.model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": self._mode(),
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        model = {
            "id": self.spec.model,
            "object": "model",
            "created": int(self.start_time),
            "owned_by": "sglang",
            "root": self.spec.model,
            "parent": None,
            "max_model_len": self.spec.context_length,
        }
        return web.json_response({"object": "list", "data": [model]})

    def _load(self) -> dict[str, Any]:
        e, t = self._engine(), self.timing
        used = self.cache.size + sum(r.prompt_tokens + len(r.output_ids) for r in e.running)
        waiting = [*e.prefill_queue, *e.decode_waiting]
        return {
            "dp_rank": 0,
            "num_running_reqs": len(e.running),
            "num_waiting_reqs": len(waiting),
            "num_waiting_uncached_tokens": sum(r.remaining_prefill for r in e.prefill_queue),
            "num_used_tokens": used,
            "num_total_tokens": t.kv_capacity_tokens,
            "max_total_num_tokens": t.kv_capacity_tokens,
            "token_usage": min(1.0, used / t.kv_capacity_tokens),
            "gen_throughput": e.last_gen_throughput,
            "cache_hit_rate": e.metrics.cache_hit_rate,
            "utilization": len(e.running) / t.max_running_requests,
            "speculative": {
                "accept_length": e.metrics.spec_accept_length,
                "accept_rate": e.metrics.spec_accept_rate,
            },
            "disaggregation": {
                "prefill_bootstrap_queue_reqs": self.rooms.waiting_for_decode,
                "prefill_inflight_queue_reqs": self.rooms.inflight,
                "decode_prealloc_queue_reqs": len(e.decode_waiting) if self.spec.role == "decode" else 0,
                "decode_transfer_queue_reqs": 0,
                "kv_transfer_speed_gb_s": t.nic_gbps * t.nic_links / 8,
                "kv_transfer_latency_ms": e.metrics.kv_transfer_latency_ms,
            },
        }

    async def loads(self, request: web.Request) -> web.Response:
        load = self._load()
        if request.query.get("format") == "prometheus":
            return web.Response(text=self._metrics_text(), content_type="text/plain")
        return web.json_response({"timestamp": time.time(), "dp_rank_count": 1, "loads": [load]})

    def _metrics_text(self) -> str:
        e, load = self._engine(), self._load()
        labels = {
            "model_name": self.spec.model,
            "engine_type": {"mixed": "unified"}.get(self.spec.role, self.spec.role),
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        gauges = {
            "num_running_reqs": load["num_running_reqs"],
            "num_queue_reqs": load["num_waiting_reqs"],
            "num_used_tokens": load["num_used_tokens"],
            "token_usage": load["token_usage"],
            "kv_available_tokens": max(0, self.timing.kv_capacity_tokens - load["num_used_tokens"]),
            "gen_throughput": load["gen_throughput"],
            "utilization": load["utilization"],
            "evicted_tokens_total": self.cache.evicted_total,
            "num_prefill_bootstrap_queue_reqs": self.rooms.waiting_for_decode,
            "num_prefill_inflight_queue_reqs": self.rooms.inflight,
            "num_decode_prealloc_queue_reqs": load["disaggregation"]["decode_prealloc_queue_reqs"],
            "num_decode_transfer_queue_reqs": 0,
        }
        e.metrics.bootstrap_failed = self.rooms.bootstrap_failed
        e.metrics.transfer_failed = max(e.metrics.transfer_failed, self.rooms.transfer_failed)
        return render_metrics(e.metrics, labels, gauges)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self._metrics_text(), content_type="text/plain", charset="utf-8")

    async def flush_cache(self, request: web.Request) -> web.Response:
        e = self._engine()
        timeout = float(request.query.get("timeout", "0") or 0)
        if self._flush_pending:
            return web.Response(status=400, text="Another flush_cache is already in progress.")
        if not e.idle and timeout > 0:
            self._flush_pending = True
            try:
                deadline = time.monotonic() + timeout
                while not e.idle and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            finally:
                self._flush_pending = False
            if not e.idle:
                return web.Response(status=400, text="Timed out waiting for idle state.")
        if not e.idle:
            return web.Response(
                status=400,
                text=f"Cache not flushed because there are pending requests. #queue-req: "
                f"{len(e.prefill_queue) + len(e.decode_waiting)}, #running-req: {len(e.running)}",
            )
        self.cache.reset()
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            "waiting requests, the operation will not be performed.)\n"
        )

    def _engine(self) -> Engine:
        assert self.engine is not None, "worker not started"
        return self.engine

    # -- the PD bootstrap server (prefill only) ----------------------------------------------------------
    async def bootstrap_health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def bootstrap_register_dp_rank(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def bootstrap_query_dp_ranks(self, request: web.Request) -> web.Response:
        return web.json_response({"dp_ranks": [0]})

    async def bootstrap_route(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            return web.Response(text="OK")
        return web.json_response(
            {
                "prefill_attn_tp_size": 1,
                "prefill_dp_size": 1,
                "prefill_pp_size": 1,
                "prefill_page_size": 1,
                "rank_ip": self.spec.host,
                "rank_port": self.bootstrap_port,
            }
        )

    async def bootstrap_claim(self, request: web.Request) -> web.Response:
        try:
            room = int(request.match_info["room"])
            body = await request.json()
            timeout = float(body.get("timeout", self.spec.waiting_timeout_s))
            transport = request.transport
            result = await self.rooms.claim(
                room,
                str(body.get("digest")),
                timeout,
                decode_alive=lambda: transport is not None and not transport.is_closing(),
            )
        except RoomError as exc:
            return web.json_response({"error": exc.message}, status=exc.status)
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": f"bad claim: {exc}"}, status=400)
        return web.json_response(result)

    # -- generation ---------------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        body: Any = None
        try:
            body = await self._json(request)
            req = proto.parse_generate(body, self.tokenizer)
            self._validate(req)
        except RequestError as exc:
            if exc.kind == "value" and isinstance(body, dict) and body.get("stream") is True:
                return await self._stream_error(request, exc)
            return self._native_error(exc)
        if req.stream:
            return await self._stream_native(request, req)
        try:
            await self._parallel_warmup(req)
            results = await asyncio.gather(*(self._run_item(it, req) for it in req.items))
        except RequestError as exc:
            return self._native_error(exc)
        return web.json_response(results if req.batched else results[0])

    async def _json(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(400, contract.json_error(exc), "body") from None

    async def _stream_error(self, request: web.Request, exc: RequestError) -> web.StreamResponse:
        """SGLang streams a ValueError from generate_request as one error chunk on a 200 stream."""
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        await resp.write(_sse(proto.stream_value_error(exc)))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def _validate(self, req: GenRequest) -> None:
        ctx = self.spec.context_length
        for it in req.items:
            n = len(it.input_ids)
            if n >= ctx:
                raise RequestError(
                    400, f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens)."
                )
            if n + it.max_new_tokens > ctx:
                raise RequestError(
                    400,
                    f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                    f"You requested a total of {n + it.max_new_tokens} tokens: {n} tokens from the input "
                    f"messages and {it.max_new_tokens} tokens for the completion. Please reduce the number "
                    "of tokens in the input messages or the completion to fit within the limit.",
                )

    @staticmethod
    def _native_error(exc: RequestError) -> web.Response:
        status, body = proto.native_error(exc)
        return web.json_response(body, status=status)

    async def _stream_native(self, request: web.Request, req: GenRequest) -> web.StreamResponse:
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        async def one(index: int, item: GenItem) -> None:
            try:
                await self._run_item(
                    item, req, lambda chunk: queue.put_nowait(self._index(chunk, index, req))
                )
            except RequestError as exc:
                queue.put_nowait(self._index(self._abort_chunk(item, exc), index, req))

        async def warm_then(index: int, item: GenItem) -> None:
            await warmed
            await one(index, item)

        async def warm() -> None:
            try:
                await self._parallel_warmup(req)
            except RequestError as exc:  # no sample is sent: each reports the warm-up's abort
                for i, it in enumerate(req.items):
                    queue.put_nowait(self._index(self._abort_chunk(it, exc), i, req))
                raise

        warmed = asyncio.ensure_future(warm())
        tasks = [asyncio.create_task(warm_then(i, it)) for i, it in enumerate(req.items)]
        done = asyncio.gather(*tasks)
        def _finished(f: asyncio.Future[Any]) -> None:
            if not f.cancelled():
                f.exception()  # retrieved: each item's errors were already turned into abort chunks
            queue.put_nowait(None)

        done.add_done_callback(_finished)
        try:
            while (chunk := await queue.get()) is not None:
                await resp.write(_sse(chunk))
            await resp.write(b"data: [DONE]\n\n")
        finally:
            warmed.cancel()
            for t in tasks:
                t.cancel()
        return resp

    async def _parallel_warmup(self, req: GenRequest) -> None:
        """SGLang's n > 1 path (`tokenizer_manager._handle_batch_request`): before any sample, each prompt
        is sent once more with max_new_tokens=0 ("cache the common prefix") carrying the same bootstrap
        fields as its samples, and awaited, prompt after prompt. On PD this warm-up pairs like any
        request; the n samples then share one room (see `rooms.RoomTable.register`)."""
        if req.parallel <= 1:
            return
        for item in req.items[: len(req.items) // req.parallel]:
            warm = dataclasses.replace(item, rid=uuid.uuid4().hex, max_new_tokens=0, sample=0)
            await self._run_item(warm, req)

    @staticmethod
    def _index(chunk: dict[str, Any], index: int, req: GenRequest) -> dict[str, Any]:
        if req.batched:
            chunk["index"] = index
        return chunk

    def _abort_chunk(self, item: GenItem, exc: RequestError) -> dict[str, Any]:
        finish = proto.finish_reason(0, item.max_new_tokens, aborted=exc.message, status=exc.status)
        return {
            "text": "",
            "output_ids": [],
            "meta_info": proto.meta_info(item.rid, len(item.input_ids), 0, 0, finish),
        }

    def _logprobs(self, item: GenItem, output_ids: list[int]) -> dict[str, Any]:
        """SGLang's logprob keys for `item` on this worker's role ({} unless return_logprob)."""
        if not item.return_logprob:
            return {}
        n = len(item.input_ids)
        start = n if item.logprob_start_len < 0 else item.logprob_start_len
        text_fn = (lambda t: self.tokenizer.decode([t])) if item.return_text_in_logprobs else None
        return meta_logprobs(
            item.input_ids,
            output_ids,
            start=start,
            top_n=item.top_logprobs_num,
            text_fn=text_fn,
            with_input=self.spec.role != "decode",  # the decode never sees the prompt's logits
            with_output=self.spec.role != "prefill",
        )

    def _result(self, sreq: SimRequest, new_ids: list[int], final: bool, item: GenItem) -> dict[str, Any]:
        e = self._engine()
        finish = proto.finish_reason(len(sreq.output_ids), sreq.max_new_tokens) if final else None
        spec = None
        if final and self.timing.spec_alpha is not None and sreq.verify_ct:
            g = self.timing.spec_gamma
            spec = {
                "spec_verify_ct": sreq.verify_ct,
                "spec_accept_length": len(sreq.output_ids) / sreq.verify_ct,
                "spec_accept_rate": sreq.accepted_drafts / (sreq.verify_ct * g),
                "spec_num_correct_drafts": sreq.accepted_drafts,
                "spec_num_proposed_drafts": sreq.verify_ct * g,
            }
        e2e = None
        if final and sreq.finished_at is not None:
            e2e = e.model_seconds(sreq.finished_at - sreq.arrived)
        meta = proto.meta_info(
            sreq.rid,
            sreq.prompt_tokens,
            len(sreq.output_ids),
            sreq.cached_tokens,
            finish,
            e2e_latency=e2e,
            spec=spec,
        )
        meta.update(self._logprobs(item, sreq.output_ids))
        if len(sreq.output_ids) > sreq.text_upto:  # decode only the new tokens: text is cumulative
            sreq.text += self.tokenizer.decode(sreq.output_ids[sreq.text_upto :])
            sreq.text_upto = len(sreq.output_ids)
        return {"text": sreq.text, "output_ids": new_ids, "meta_info": meta}

    async def _run_item(self, item: GenItem, req: GenRequest, on_chunk: Any = None) -> dict[str, Any]:
        """Run one prompt to completion; `on_chunk` receives stream chunks. Raises RequestError."""
        e = self._engine()
        if self.spec.role != "mixed" and item.pd.room is None:  # scheduler.py: an abort with status 400
            raise RequestError(
                400,
                "Invalid request: Disaggregated request received without bootstrap room id. "
                f"req.rid='{item.rid}' (send requests through a PD router that injects "
                "bootstrap_host/port/room)",
            )
        n = len(item.input_ids)
        if item.return_logprob and item.logprob_start_len > n:
            raise RequestError(
                400,
                f"req.logprob_start_len={item.logprob_start_len} is higher than the number of input tokens "
                f"len(req.origin_input_ids)={n}. Please use a smaller logprob_start_len.",
            )
        sreq = e.new_request(
            item.rid,
            item.input_ids,
            item.max_new_tokens,
            priority=item.priority,
            sampling_seed=item.sampling_seed,
            sample=item.sample,
            max_prefix=(n if item.logprob_start_len < 0 else item.logprob_start_len)
            if item.return_logprob
            else None,
            skip_cache_insert=item.pd.host == FAKE_BOOTSTRAP_HOST,
        )
        try:
            if self.spec.role == "prefill":
                return await self._run_prefill(item, sreq, on_chunk)
            if self.spec.role == "decode":
                cached = await self._fetch_kv(item)
                e.submit_decode(sreq, cached)
            else:
                e.submit_prefill(sreq)
            while (tokens := await sreq.updates.get()) is not None:
                if on_chunk is not None:
                    on_chunk(self._result(sreq, tokens, final=sreq.finished, item=item))
            if not sreq.finished:
                raise RequestError(503, "The server is shutting down; the request was aborted.")
            if on_chunk is not None and sreq.max_new_tokens == 0:
                on_chunk(self._result(sreq, [], final=True, item=item))
            return self._result(sreq, sreq.output_ids, final=True, item=item)
        finally:
            if not sreq.finished:
                e.abort(sreq)

    async def _run_prefill(self, item: GenItem, sreq: SimRequest, on_chunk: Any) -> dict[str, Any]:
        e, room = self._engine(), item.pd.room
        assert room is not None
        if item.pd.host == FAKE_BOOTSTRAP_HOST:
            return await self._run_fake_prefill(item, sreq, on_chunk)
        try:
            entry = self.rooms.register(room, item.input_ids)
        except RoomError as exc:
            raise RequestError(exc.status, exc.message) from None
        try:
            try:
                await self.rooms.wait_for_decode(entry, self.spec.bootstrap_timeout_s)
            except RoomError as exc:
                raise RequestError(exc.status, exc.message) from None
            e.submit_prefill(sreq)
            assert sreq.prefill_done is not None
            await sreq.prefill_done
            transfer_s = self.timing.transfer_seconds(sreq.prompt_tokens)
            await asyncio.sleep(transfer_s * self.spec.time_scale)
            if entry.decode_alive is not None and not entry.decode_alive():
                self.rooms.transfer_failed += 1
                self.rooms.fail(entry, f"KV transfer failed for bootstrap_room={room}: the decode went away")
                raise RequestError(500, entry.failure or "")
            if entry.failure:  # another request took the same room meanwhile (rooms.RoomTable.register)
                raise RequestError(500, entry.failure)
            e.metrics.kv_transfer_latency_ms = transfer_s * 1000
            self.rooms.land(entry, sreq.cached_tokens, transfer_s * 1000)
            sreq.finished_at = asyncio.get_running_loop().time()
        except BaseException:
            self.rooms.fail(
                entry, f"KV transfer failed for bootstrap_room={room}: the prefill request was aborted"
            )
            raise
        finally:
            self.rooms.release(entry)
        e.metrics.e2e.observe(e.model_seconds(sreq.finished_at - sreq.arrived))
        # SGLang's prefill forces max_new_tokens=1 and reports finish_reason length 0 after the transfer.
        finish = {"type": "length", "length": 0}
        meta = proto.meta_info(
            sreq.rid,
            sreq.prompt_tokens,
            0,
            sreq.cached_tokens,
            finish,
            e2e_latency=e.model_seconds(sreq.finished_at - sreq.arrived),
        )
        meta.update(self._logprobs(item, []))
        result = {"text": "", "output_ids": [], "meta_info": meta}
        if on_chunk is not None:
            on_chunk(result)
        return result

    async def _run_fake_prefill(self, item: GenItem, sreq: SimRequest, on_chunk: Any) -> dict[str, Any]:
        """SGLang's FakeKVSender: a prefill-only request (health checks) runs the forward with no decode
        to wait for and no transfer. As in SGLang 0.5.23 (Req.skip_radix_cache_insert), the prompt is
        not inserted into the radix cache: a 2.2.2.2 "warm-up" warms nothing."""
        e = self._engine()
        e.submit_prefill(sreq)
        assert sreq.prefill_done is not None
        await sreq.prefill_done
        sreq.finished_at = asyncio.get_running_loop().time()
        meta = proto.meta_info(
            sreq.rid,
            sreq.prompt_tokens,
            0,
            sreq.cached_tokens,
            {"type": "length", "length": 0},
            e2e_latency=e.model_seconds(sreq.finished_at - sreq.arrived),
        )
        meta.update(self._logprobs(item, []))
        result = {"text": "", "output_ids": [], "meta_info": meta}
        if on_chunk is not None:
            on_chunk(result)
        return result

    async def _fetch_kv(self, item: GenItem) -> int:
        """Decode side: find the prefill's bootstrap server, claim the room, wait for the KV to land."""
        pd, timeout = item.pd, self.spec.waiting_timeout_s
        assert pd.room is not None
        if pd.host == FAKE_BOOTSTRAP_HOST:  # SGLang's FakeKVReceiver: decode without any KV transfer
            return 0
        if pd.room == 0:  # SGLang's decode never sees room 0's metadata land: it stalls to the timeout
            await asyncio.sleep(timeout)
            raise RequestError(
                500,
                f"KV transfer failed for bootstrap_room=0: timed out after {timeout:g}s "
                "waiting for KV (room 0 is never valid; draw rooms from [1, 2**63))",
            )
        host = pd.host or "127.0.0.1"
        port = pd.port if pd.port is not None else (self.spec.bootstrap_port or DEFAULT_BOOTSTRAP_PORT)
        base = f"http://{host}:{port}"
        assert self._client is not None
        try:
            async with self._client.get(
                f"{base}/route",
                params={"engine_rank": "-1", "target_dp_group": "-1"},
                timeout=aiohttp.ClientTimeout(total=5),
            ) as r:
                if r.status != 200:
                    raise RequestError(
                        500, f"KV transfer failed: prefill bootstrap server {base} answered {r.status}"
                    )
            async with self._client.post(
                f"{base}/sim/kv/{pd.room}",
                json={"digest": prompt_digest(item.input_ids), "timeout": timeout},
                timeout=aiohttp.ClientTimeout(total=timeout + 5),
            ) as r:
                body = await r.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._engine().metrics.transfer_failed += 1
            raise RequestError(
                500,
                f"KV transfer failed for bootstrap_room={pd.room}: cannot reach the "
                f"prefill bootstrap server {base} ({type(exc).__name__}: {exc})",
            ) from None
        if r.status != 200:
            why = str(body.get("error") or f"bootstrap server answered {r.status}")
            if not why.startswith("KV transfer failed"):
                why = f"KV transfer failed for bootstrap_room={pd.room}: {why}"
            raise RequestError(500, why)
        return int(body["cached_tokens"])

    # -- OpenAI endpoints -----------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            req = proto.parse_openai(await self._json(request), self.tokenizer, chat)
            self._validate(req)
        except RequestError as exc:
            return web.json_response(proto.openai_error(exc), status=exc.status)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        model = req.model or self.spec.model
        created = proto.now_s()
        if req.stream:
            return await self._openai_stream(request, req, rid, model, created, chat)
        try:
            await self._parallel_warmup(req)
            results = await asyncio.gather(*(self._run_item(it, req) for it in req.items))
        except RequestError as exc:
            return web.json_response(proto.openai_error(exc), status=exc.status)
        choices = []
        for index, res in enumerate(results):
            meta = res["meta_info"]
            choice: dict[str, Any] = {
                "index": index,
                "finish_reason": "length" if meta["completion_tokens"] else "stop",
                "logprobs": None,
                "matched_stop": None,
            }
            if chat:
                choice["message"] = {
                    "role": "assistant",
                    "content": res["text"],
                    "reasoning_content": None,
                    "tool_calls": None,
                }
            else:
                choice["text"] = res["text"]
            choices.append(choice)
        return web.json_response(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": model,
                "choices": choices,
                "usage": self._usage([r["meta_info"] for r in results]),
                "metadata": {"weight_version": "default"},
            }
        )

    def _usage(self, metas: list[dict[str, Any]]) -> dict[str, Any]:
        """SGLang's UsageInfo for n choices: the prompt counted once, completions summed."""
        return proto.usage(
            metas[0]["prompt_tokens"],
            sum(m["completion_tokens"] for m in metas),
            metas[0]["cached_tokens"],
            self.spec.enable_cache_report,
        )

    async def _openai_stream(
        self,
        request: web.Request,
        req: GenRequest,
        rid: str,
        model: str,
        created: int,
        chat: bool,
    ) -> web.StreamResponse:
        obj = "chat.completion.chunk" if chat else "text_completion"
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        def chunk(index: int, delta_text: str, finish: str | None, first: bool = False) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": index, "finish_reason": finish, "logprobs": None}
            if chat:
                delta: dict[str, Any] = {"content": delta_text}
                if first:
                    delta["role"] = "assistant"
                choice["delta"] = delta
            else:
                choice["text"] = delta_text
            return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}

        sent = [{"len": 0, "first": True} for _ in req.items]

        def on_chunk(index: int, res: dict[str, Any]) -> None:
            text, state = res["text"], sent[index]
            delta = text[int(state["len"]) :]
            queue.put_nowait(chunk(index, delta, None, first=bool(state["first"])))
            state["len"], state["first"] = len(text), False

        try:
            await self._parallel_warmup(req)
        except RequestError as warm_exc:
            return web.json_response(proto.openai_error(warm_exc), status=warm_exc.status)
        tasks = [
            asyncio.create_task(self._run_item(it, req, lambda res, i=i: on_chunk(i, res)))
            for i, it in enumerate(req.items)
        ]
        done = asyncio.gather(*tasks, return_exceptions=True)
        done.add_done_callback(lambda _f: queue.put_nowait(None))
        resp: web.StreamResponse | None = None
        try:
            first = await queue.get()
            if first is None:  # every choice failed before its first token: SGLang answers a 400/5xx JSON
                exc = next((t.exception() for t in tasks if isinstance(t.exception(), RequestError)), None)
                if isinstance(exc, RequestError):
                    return web.json_response(proto.openai_error(exc), status=exc.status)
            resp = web.StreamResponse(headers=_SSE_HEADERS)
            await resp.prepare(request)
            c: dict[str, Any] | None = first
            while c is not None:
                await resp.write(_sse(c))
                c = await queue.get()
            metas = []
            for i, t in enumerate(tasks):
                exc = t.exception()
                if isinstance(exc, RequestError):
                    await resp.write(_sse({"error": proto.openai_error(exc)}))
                elif exc is None:
                    meta = t.result()["meta_info"]
                    metas.append(meta)
                    await resp.write(_sse(chunk(i, "", "length" if meta["completion_tokens"] else "stop")))
            if req.include_usage and metas:
                await resp.write(
                    _sse(
                        {
                            "id": rid,
                            "object": obj,
                            "created": created,
                            "model": model,
                            "choices": [],
                            "usage": self._usage(metas),
                        }
                    )
                )
            await resp.write(b"data: [DONE]\n\n")
        finally:
            for t in tasks:
                t.cancel()
        return resp


async def iter_sse(lines: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    """Parse an SSE byte stream into JSON objects (stops at `data: [DONE]`). Used by clients and tests."""
    async for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)
