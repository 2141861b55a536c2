"""SGLang's native generation API: `/generate` (POST/PUT), single or batch, whole or streamed (SSE).

Error layers as in SGLang 0.5.23 `http_server.py` (see docs/simulator.md "Errors"): a refused request
is a JSON error (`protocol.native_error`), except a ValueError on `stream: true`, which SGLang sends as
one error chunk on a 200 stream; a prompt that fails after its stream started carries an abort chunk.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from infer_ctl.sim import protocol as proto
from infer_ctl.sim.protocol import GenItem, GenRequest, RequestError
from infer_ctl.sim.runner import RequestRunner, Result
from infer_ctl.sim.state import WorkerState
from infer_ctl.sim.wire import SSE_DONE, SSE_HEADERS, read_generate_body, sse


class NativeApi:
    def __init__(self, state: WorkerState, runner: RequestRunner) -> None:
        self.state = state
        self.runner = runner

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body: Any = None
        try:
            body = await read_generate_body(request)
            req = proto.parse_generate(body, self.state.tokenizer)
            self.runner.validate(req)
        except RequestError as exc:
            if exc.kind == "value" and isinstance(body, dict) and body.get("stream") is True:
                return await self._stream_error(request, exc)
            return self._error(exc)
        if req.stream:
            return await self._stream(request, req)
        try:
            await self.runner.parallel_warmup(req)
            results = await asyncio.gather(*(self.runner.run_item(it, req) for it in req.items))
        except RequestError as exc:
            return self._error(exc)
        return web.json_response(results if req.batched else results[0])

    @staticmethod
    def _error(exc: RequestError) -> web.Response:
        status, body = proto.native_error(exc)
        return web.json_response(body, status=status)

    async def _stream_error(self, request: web.Request, exc: RequestError) -> web.StreamResponse:
        """SGLang streams a ValueError from generate_request as one error chunk on a 200 stream."""
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        await resp.write(sse(proto.stream_value_error(exc)))
        await resp.write(SSE_DONE)
        return resp

    async def _stream(self, request: web.Request, req: GenRequest) -> web.StreamResponse:
        runner = self.runner
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        queue: asyncio.Queue[Result | None] = asyncio.Queue()

        async def one(index: int, item: GenItem) -> None:
            try:
                await runner.run_item(item, req, lambda chunk: queue.put_nowait(_index(chunk, index, req)))
            except RequestError as exc:
                queue.put_nowait(_index(runner.abort_chunk(item, exc), index, req))

        async def warm_then(index: int, item: GenItem) -> None:
            await warmed
            await one(index, item)

        async def warm() -> None:
            try:
                await runner.parallel_warmup(req)
            except RequestError as exc:  # no sample is sent: each reports the warm-up's abort
                for i, it in enumerate(req.items):
                    queue.put_nowait(_index(runner.abort_chunk(it, exc), i, req))
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
                await resp.write(sse(chunk))
            await resp.write(SSE_DONE)
        finally:
            warmed.cancel()
            for t in tasks:
                t.cancel()
        return resp


def _index(chunk: Result, index: int, req: GenRequest) -> Result:
    """A batch's stream chunks say which prompt they belong to (SGLang's `index`)."""
    if req.batched:
        chunk["index"] = index
    return chunk
