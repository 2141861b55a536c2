"""SGLang's OpenAI-compatible API: `/v1/completions` and `/v1/chat/completions`, whole or streamed.

Shapes follow SGLang 0.5.23 `entrypoints/openai/serving_{chat,completions}.py`: n choices (prompt
counted once in `usage`), `usage.prompt_tokens_details.cached_tokens` when cache reporting is on,
`stream_options.include_usage` as a last chunk with empty `choices`; `logprobs` is always null.
`return_spec_tokens_details: true` adds the speculative fields as SGLang does (`sglext.spec_tokens_details`:
one object, a list when n > 1; entrypoints/openai/utils.py spec_tokens_details_from_meta_info): on the
whole answer, and on a stream as its own chunk with empty `choices` before the usage chunk
(serving_chat.py; no chunk when no choice speculated).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from typing import Any

from aiohttp import web

from infer_ctl.sim import protocol as proto
from infer_ctl.sim.protocol import GenRequest, RequestError
from infer_ctl.sim.runner import RequestRunner, Result
from infer_ctl.sim.spec_workload import CUSTOM_LABELS_HEADER, labels_from_header
from infer_ctl.sim.state import WorkerState
from infer_ctl.sim.wire import SSE_DONE, SSE_HEADERS, read_openai_body, sse


class OpenAIApi:
    def __init__(self, state: WorkerState, runner: RequestRunner) -> None:
        self.state = state
        self.runner = runner

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        runner = self.runner
        try:
            req = proto.parse_openai(await read_openai_body(request), self.state.tokenizer, chat)
            # SGLang's OpenAI endpoints take per-request labels from this header (serving_base.py)
            req.custom_labels = req.custom_labels or labels_from_header(request.headers.get(CUSTOM_LABELS_HEADER))
            runner.validate(req)
        except RequestError as exc:
            return web.json_response(proto.openai_error(exc), status=exc.status)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        model = req.model or self.state.spec.model
        created = proto.now_s()
        if req.stream:
            return await self._stream(request, req, rid, model, created, chat)
        try:
            await runner.parallel_warmup(req)
            results = await asyncio.gather(*(runner.run_item(it, req) for it in req.items))
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
                # SGLang leaves tool_calls out of the message when there are none
                choice["message"] = {"role": "assistant", "content": res["text"], "reasoning_content": None}
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
                **self._sglext(req, [r["meta_info"] for r in results]),
            }
        )

    @staticmethod
    def _sglext(req: GenRequest, metas: list[dict[str, Any]]) -> dict[str, Any]:
        """`{"sglext": {"spec_tokens_details": ...}}` when asked and some choice speculated, else nothing."""
        if not req.spec_details:
            return {}
        details = [_spec_details(m) for m in metas if "spec_verify_ct" in m]
        if not details:
            return {}
        return {"sglext": {"spec_tokens_details": details if req.parallel > 1 else details[0]}}

    def _usage(self, metas: list[dict[str, Any]], stream: bool = False) -> dict[str, Any]:
        """SGLang's UsageInfo for n choices: the prompt counted once, completions summed. The usage chunk of
        a completions stream has no completion_tokens_details (SGLang builds that one without it)."""
        usage = proto.usage(
            metas[0]["prompt_tokens"],
            sum(m["completion_tokens"] for m in metas),
            metas[0]["cached_tokens"],
            self.state.spec.enable_cache_report,
        )
        if stream:
            del usage["completion_tokens_details"]
        return usage

    async def _stream(
        self,
        request: web.Request,
        req: GenRequest,
        rid: str,
        model: str,
        created: int,
        chat: bool,
    ) -> web.StreamResponse:
        runner = self.runner
        obj = "chat.completion.chunk" if chat else "text_completion"
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        def chunk(index: int, delta_text: str, finish: str | None, first: bool = False) -> dict[str, Any]:
            # the shapes SGLang 0.5.23 streams (measured: tests/engine/test_sim_differential.py): a chat
            # delta always carries reasoning_content, the finishing one no content; a completions chunk
            # carries "usage": null until the usage chunk
            choice: dict[str, Any] = {"index": index, "finish_reason": finish, "logprobs": None, "matched_stop": None}
            if chat:
                delta: dict[str, Any] = {"reasoning_content": None}
                if first:
                    delta["role"] = "assistant"
                if delta_text or finish is None:
                    delta["content"] = delta_text
                choice["delta"] = delta
                return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
            choice["text"] = delta_text
            return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": None}

        sent = [{"len": 0, "first": True} for _ in req.items]

        def on_chunk(index: int, res: Result) -> None:
            text, state = res["text"], sent[index]
            delta = text[int(state["len"]) :]
            queue.put_nowait(chunk(index, delta, None, first=bool(state["first"])))
            state["len"], state["first"] = len(text), False

        try:
            await runner.parallel_warmup(req)
        except RequestError as warm_exc:
            return web.json_response(proto.openai_error(warm_exc), status=warm_exc.status)
        tasks = [
            asyncio.create_task(runner.run_item(it, req, functools.partial(on_chunk, i)))
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
            resp = web.StreamResponse(headers=SSE_HEADERS)
            await resp.prepare(request)
            c: dict[str, Any] | None = first
            while c is not None:
                await resp.write(sse(c))
                c = await queue.get()
            metas = []
            for i, t in enumerate(tasks):
                exc = t.exception()
                if isinstance(exc, RequestError):
                    await resp.write(sse({"error": proto.openai_error(exc)}))
                elif exc is None:
                    meta = t.result()["meta_info"]
                    metas.append(meta)
                    await resp.write(sse(chunk(i, "", "length" if meta["completion_tokens"] else "stop")))
            ext = self._sglext(req, metas)
            if ext:
                await resp.write(sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [], **ext}))
            if req.include_usage and metas:
                await resp.write(
                    sse(
                        {
                            "id": rid,
                            "object": obj,
                            "created": created,
                            "model": model,
                            "choices": [],
                            "usage": self._usage(metas, stream=not chat),
                        }
                    )
                )
            await resp.write(SSE_DONE)
        finally:
            for t in tasks:
                t.cancel()
        return resp


def _spec_details(meta: dict[str, Any]) -> dict[str, Any]:
    """SGLang's SpecTokensDetails of one choice (absent fields as its defaults: 0 / [])."""
    return {
        "spec_accept_rate": meta.get("spec_accept_rate") or 0.0,
        "spec_accept_length": meta.get("spec_accept_length") or 0.0,
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_num_correct_drafts": meta.get("spec_num_correct_drafts") or 0,
        "spec_num_proposed_drafts": meta.get("spec_num_proposed_drafts") or 0,
        "spec_verify_ct": meta.get("spec_verify_ct") or 0,
        "spec_correct_drafts_histogram": meta.get("spec_correct_drafts_histogram") or [],
        "spec_cap_lens_histogram": [],
    }
