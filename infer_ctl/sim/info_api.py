"""The server's status and control endpoints: `/health`, `/health_generate`, `/ready`, `/server_info`,
`/model_info`, `/v1/models`, `/v1/loads`, `/metrics` and `/flush_cache` (SGLang 0.5.23 `http_server.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from infer_ctl.sim.config import DEFAULT_BOOTSTRAP_PORT, SGLANG_VERSION
from infer_ctl.sim.kv_config import describe
from infer_ctl.sim.state import WorkerState
from infer_ctl.sim.telemetry import load_snapshot, metrics_text


def server_args(state: WorkerState) -> dict[str, Any]:
    """The ServerArgs fields `/server_info` reports, as the simulated worker would have been launched."""
    t, s = state.timing, state.spec
    spec_on = t.spec_alpha is not None
    return {
        "model_path": s.model,
        "served_model_name": s.model,
        "tokenizer_path": s.tokenizer_path or s.model,
        "host": s.host,
        "port": state.port,
        "disaggregation_mode": state.launch_mode,  # ServerArgs: a role switch changes the scheduler's only
        "enable_pd_role_switch": s.enable_pd_role_switch,
        "disaggregation_bootstrap_port": state.bootstrap_port or DEFAULT_BOOTSTRAP_PORT,
        "disaggregation_transfer_backend": "mooncake",
        "max_running_requests": t.max_running_requests,
        "max_total_tokens": t.kv_capacity_tokens,
        "chunked_prefill_size": t.chunked_prefill_size,
        "context_length": s.context_length,
        "page_size": s.page_size,
        "tp_size": 8,
        "dp_size": 1,
        "radix_eviction_policy": s.eviction_policy,
        "disaggregation_decode_enable_radix_cache": s.decode_radix_cache,
        "enable_hierarchical_cache": s.hicache,
        "enable_cache_report": s.enable_cache_report,
        "speculative_algorithm": s.spec_algorithm if spec_on else None,
        # ServerArgs' --speculative-draft-model-path: the router names it on its spans and in `router spec`
        "speculative_draft_model_path": (s.draft_model or f"{s.model}-eagle3-draft") if spec_on else None,
        "speculative_num_steps": t.spec_gamma if spec_on else None,
        "speculative_eagle_topk": 1 if spec_on else None,
        "speculative_num_draft_tokens": t.spec_gamma + 1 if spec_on else None,
        "speculative_adaptive": bool(spec_on and s.spec_adaptive),
        "speculative_adaptive_config": s.spec_adaptive_config if isinstance(s.spec_adaptive_config, str) else None,
        "random_seed": s.seed,
        "kv_events_config": s.kv_events_config,
    }


def internal_state(state: WorkerState) -> dict[str, Any]:
    """`/server_info` internal_states[0]: the scheduler's view (SGLang's internal_state.py). Its
    speculative_num_steps / _num_draft_tokens are live (the adaptive controller overrides them on each
    switch); avg_spec_accept_length is absent until the first decode log interval completed."""
    e = state.running_engine()
    st: dict[str, Any] = {
        "last_gen_throughput": e.last_gen_throughput,
        "memory_usage": {"token_capacity": state.timing.kv_capacity_tokens},
        "effective_max_running_requests_per_dp": state.timing.max_running_requests,
        "disaggregation_mode": state.mode,
    }
    if e.spec is not None:
        st["speculative_num_steps"] = e.spec.current_steps
        st["speculative_num_draft_tokens"] = e.spec.current_draft_tokens
        st["speculative_adaptive"] = e.spec.adaptive is not None
        if (avg := e.metrics.spec_avg_accept_length) is not None:
            st["avg_spec_accept_length"] = avg
    return st


class InfoApi:
    def __init__(self, state: WorkerState, server_args: Callable[[], dict[str, Any]]) -> None:
        self.state = state
        #: the ServerArgs to report (SimWorker._server_args, which a subclass may extend)
        self.server_args = server_args
        self._flush_pending = False

    async def health(self, request: web.Request) -> web.Response:
        engine = self.state.engine
        return web.Response(status=200 if self.state.ready and (engine is None or engine.failed is None) else 503)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.state.ready else 503)  # SGLang: an empty body either way

    async def server_info(self, request: web.Request) -> web.Response:
        st = self.state
        spec = st.spec
        info = {
            **self.server_args(),
            "launch_command": f"inferctl sim serve --role {spec.role} --port {st.port}",
            "version": SGLANG_VERSION,
            "startup_time": st.start_time,
            "frontend": "inferctl-sim",
            # SGLang: describe_kv_events_publisher (block_size = page_size x dcp_size, 1 here)
            "kv_events": describe(st.kv_events, block_size=spec.page_size),
            "internal_states": [internal_state(st)],
            "sim": {
                "role": spec.role,
                "preset": spec.preset,
                "time_scale": spec.time_scale,
                "seed": spec.seed,
                "start_time": st.start_time,
                "tokenizer": st.tokenizer.name,
            },
        }
        return web.json_response(info)

    async def model_info(self, request: web.Request) -> web.Response:
        spec = self.state.spec
        return web.json_response(
            {
                "model_path": spec.model,
                "served_model_name": spec.model,
                "tokenizer_path": spec.tokenizer_path or spec.model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": self.state.mode,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
            }
        )

    def _model_card(self) -> dict[str, Any]:
        spec = self.state.spec
        # SGLang's ModelCard: `created` is the time of the request (a default factory), not of the launch
        return {"id": spec.model, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                "root": spec.model, "parent": None, "max_model_len": spec.context_length}

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        """`GET /v1/models/{model:path}` (SGLang 0.5.23 `retrieve_model`): the card, or its 404 body."""
        name = request.match_info["model"]
        if name != self.state.spec.model:
            return web.json_response({"error": {"message": f"The model '{name}' does not exist",
                                                "type": "invalid_request_error", "param": "model",
                                                "code": "model_not_found"}}, status=404)
        return web.json_response(self._model_card())

    async def tokenize(self, request: web.Request) -> web.Response:
        """SGLang's /v1/tokenize for `prompt` (a string or a list of them): the ids /generate would give
        that text (the router's mid-stream recovery asks for them). Chat `messages` are not rendered here."""
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"object": "error", "message": "malformed JSON", "type": "BadRequestError",
                                      "code": 400}, status=400)
        prompt = body.get("prompt") if isinstance(body, dict) else None
        tok = self.state.tokenizer
        if isinstance(prompt, str):
            ids: Any = tok.encode(prompt)
            count: Any = len(ids)
        elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            ids = [tok.encode(p) for p in prompt]
            count = [len(i) for i in ids]
        else:
            return web.json_response({"object": "error", "message": "Exactly one of 'prompt' or 'messages' must be "
                                      "provided (the simulator tokenizes prompts only).", "type": "BadRequestError",
                                      "code": 400}, status=400)
        return web.json_response({"tokens": ids, "count": count, "max_model_len": self.state.spec.context_length})

    async def loads(self, request: web.Request) -> web.Response:
        raw = request.query.get("include")
        include = {p.strip() for p in raw.split(",")} if raw else None
        try:
            load = load_snapshot(self.state, include)
        except ValueError as exc:  # SGLang: HTTPException(400, detail=...)
            return web.json_response({"detail": str(exc)}, status=400)
        if request.query.get("format") == "prometheus":
            return web.Response(text=metrics_text(self.state), content_type="text/plain")
        return web.json_response({"timestamp": time.time(), "dp_rank_count": 1, "loads": [load]})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=metrics_text(self.state), content_type="text/plain", charset="utf-8")

    async def flush_cache(self, request: web.Request) -> web.Response:
        e = self.state.running_engine()
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
            # SGLang logs "Cache not flushed because there are pending requests..." on the scheduler; the
            # client gets the empty result message's fallback (http_server.flush_cache)
            return web.Response(status=400, text="Flush cache failed.\n")
        self.state.cache.reset()
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            "waiting requests, the operation will not be performed.)\n"
        )
