"""The request runner of one worker: one parsed prompt (`GenItem`) through the engine on this worker's
role, to SGLang's result dict (`text`, `output_ids`, `meta_info`). No aiohttp here: the APIs frame the
results, the decode's KV fetch is injected (`bootstrap.KvReceiver.fetch`).

- mixed: prefill then decode on this worker;
- prefill: register the room, wait for the decode, prefill, "transfer" the KV, answer length 0;
- decode: fetch the KV (the prefill's cached_tokens), then decode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from infer_ctl.sim import protocol as proto
from infer_ctl.sim.config import FAKE_BOOTSTRAP_HOST
from infer_ctl.sim.engine import SimRequest
from infer_ctl.sim.logprobs import meta_logprobs
from infer_ctl.sim.protocol import GenItem, GenRequest, RequestError
from infer_ctl.sim.rooms import RoomError
from infer_ctl.sim.spec_workload import DEFAULT_DOMAIN, domain_of
from infer_ctl.sim.state import WorkerState
from infer_ctl.sim.tiers import cached_details

Result = dict[str, Any]
#: receives every stream chunk of one prompt (a cumulative result dict)
OnChunk = Callable[[Result], None]
#: the decode's KV fetch: returns the prefill's cached_tokens, raises RequestError
FetchKv = Callable[[GenItem], Awaitable[int]]


class RequestRunner:
    def __init__(self, state: WorkerState, fetch_kv: FetchKv) -> None:
        self.state = state
        self.fetch_kv = fetch_kv

    def validate(self, req: GenRequest) -> None:
        """SGLang's context-length checks (tokenizer_manager), then its sampling-parameter checks, before
        anything is queued."""
        ctx = self.state.spec.context_length
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
        if req.sampling_error is not None:
            raise RequestError(400, req.sampling_error)

    async def parallel_warmup(self, req: GenRequest) -> None:
        """SGLang's n > 1 path (`tokenizer_manager._handle_batch_request`): before any sample, each prompt
        is sent once more with max_new_tokens=0 ("cache the common prefix") carrying the same bootstrap
        fields as its samples, and awaited, prompt after prompt. On PD this warm-up pairs like any
        request; the n samples then share one room (see `rooms.RoomTable.register`)."""
        if req.parallel <= 1:
            return
        for item in req.items[: len(req.items) // req.parallel]:
            warm = dataclasses.replace(item, rid=uuid.uuid4().hex, max_new_tokens=0, sample=0)
            await self.run_item(warm, req)

    @staticmethod
    def abort_chunk(item: GenItem, exc: RequestError) -> Result:
        """The chunk a stream carries for a prompt that failed (finish_reason type "abort")."""
        finish = proto.finish_reason(0, aborted=exc.message, status=exc.status)
        return {
            "text": "",
            "output_ids": [],
            "meta_info": proto.meta_info(item.rid, len(item.input_ids), 0, 0, finish),
        }

    async def run_item(self, item: GenItem, req: GenRequest, on_chunk: OnChunk | None = None) -> Result:
        """Run one prompt to completion; `on_chunk` receives stream chunks. Raises RequestError."""
        e = self.state.running_engine()
        if self.state.role != "mixed" and item.pd.room is None:  # scheduler.py: an abort with status 400
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
            greedy=item.greedy,
            max_prefix=(n if item.logprob_start_len < 0 else item.logprob_start_len)
            if item.return_logprob
            else None,
            skip_cache_insert=item.pd.host == FAKE_BOOTSTRAP_HOST,
            domain=e.spec.domain_of(domain_of(req.custom_labels)) if e.spec is not None else DEFAULT_DOMAIN,
        )
        try:
            if self.state.role == "prefill":
                return await self._run_prefill(item, sreq, on_chunk)
            if self.state.role == "decode":
                # a request waiting for its KV keeps the decode busy (SGLang's prealloc / transfer queues)
                self.state.kv_fetching += 1
                try:
                    cached = await self.fetch_kv(item)
                finally:
                    self.state.kv_fetching -= 1
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

    async def _run_prefill(self, item: GenItem, sreq: SimRequest, on_chunk: OnChunk | None) -> Result:
        st, room = self.state, item.pd.room
        e, rooms = st.running_engine(), st.rooms
        assert room is not None
        if item.pd.host == FAKE_BOOTSTRAP_HOST:
            return await self._run_fake_prefill(item, sreq, on_chunk)
        try:
            entry = rooms.register(room, item.input_ids)
        except RoomError as exc:
            raise RequestError(exc.status, exc.message) from None
        try:
            try:
                await rooms.wait_for_decode(entry, st.spec.bootstrap_timeout_s)
            except RoomError as exc:
                raise RequestError(exc.status, exc.message) from None
            e.submit_prefill(sreq)
            assert sreq.prefill_done is not None
            await sreq.prefill_done
            transfer_s = st.timing.transfer_seconds(sreq.prompt_tokens)
            fault = st.kv_faults.get(entry.decode or "")  # sim/kv_faults.py
            if fault:
                transfer_s *= float(fault.get("slowdown", 1.0))
            await asyncio.sleep(transfer_s * st.spec.time_scale)
            if fault and fault.get("fail"):
                rooms.transfer_failed += 1
                rooms.fail(entry, f"KV transfer failed for bootstrap_room={room}: injected (sim kv faults)")
                raise RequestError(500, entry.failure or "")
            if entry.decode_alive is not None and not entry.decode_alive():
                rooms.transfer_failed += 1
                rooms.fail(entry, f"KV transfer failed for bootstrap_room={room}: the decode went away")
                raise RequestError(500, entry.failure or "")
            if entry.failure:  # another request took the same room meanwhile (rooms.RoomTable.register)
                raise RequestError(500, entry.failure)
            # SGLang's last-transfer values (disaggregation/prefill.py; speed as req_time_stats.py: MiB / 1024 / s)
            nbytes = sreq.prompt_tokens * st.timing.kv_bytes_per_token
            e.metrics.observe_transfer(transfer_s * 1000, nbytes / 2**30 / transfer_s if transfer_s > 0 else 0.0)
            rooms.land(entry, sreq.cached_tokens, transfer_s * 1000)
            sreq.finished_at = asyncio.get_running_loop().time()
        except BaseException:
            rooms.fail(
                entry, f"KV transfer failed for bootstrap_room={room}: the prefill request was aborted"
            )
            raise
        finally:
            rooms.release(entry)
        e.metrics.e2e.observe(e.model_seconds(sreq.finished_at - sreq.arrived))
        # SGLang's prefill forces max_new_tokens=1 and reports finish_reason length 0 after the transfer.
        return self._prefill_result(item, sreq, on_chunk)

    async def _run_fake_prefill(self, item: GenItem, sreq: SimRequest, on_chunk: OnChunk | None) -> Result:
        """SGLang's FakeKVSender: a prefill-only request (health checks) runs the forward with no decode
        to wait for and no transfer. As in SGLang 0.5.23 (Req.skip_radix_cache_insert), the prompt is
        not inserted into the radix cache: a 2.2.2.2 "warm-up" warms nothing."""
        e = self.state.running_engine()
        e.submit_prefill(sreq)
        assert sreq.prefill_done is not None
        await sreq.prefill_done
        sreq.finished_at = asyncio.get_running_loop().time()
        return self._prefill_result(item, sreq, on_chunk)

    def _prefill_result(self, item: GenItem, sreq: SimRequest, on_chunk: OnChunk | None) -> Result:
        """A prefill worker's answer: no output tokens, finish_reason length 0, the input logprobs."""
        e = self.state.running_engine()
        assert sreq.finished_at is not None
        meta = proto.meta_info(
            sreq.rid,
            sreq.prompt_tokens,
            0,
            sreq.cached_tokens,
            {"type": "length", "length": 0},
            e2e_latency=e.model_seconds(sreq.finished_at - sreq.arrived),
            cached_details=cached_details(self.state.cache, sreq.cached_tokens, sreq.cached_host, sreq.cached_storage),
        )
        meta.update(self._logprobs(item, []))
        result: Result = {"text": "", "output_ids": [], "meta_info": meta}
        if on_chunk is not None:
            on_chunk(result)
        return result

    def _logprobs(self, item: GenItem, output_ids: list[int]) -> dict[str, Any]:
        """SGLang's logprob keys for `item` on this worker's role ({} unless return_logprob)."""
        if not item.return_logprob:
            return {}
        n, role, tok = len(item.input_ids), self.state.role, self.state.tokenizer
        start = n if item.logprob_start_len < 0 else item.logprob_start_len
        text_fn = (lambda t: tok.decode([t])) if item.return_text_in_logprobs else None
        return meta_logprobs(
            item.input_ids,
            output_ids,
            start=start,
            top_n=item.top_logprobs_num,
            text_fn=text_fn,
            with_input=role != "decode",  # the decode never sees the prompt's logits
            with_output=role != "prefill",
        )

    def _result(self, sreq: SimRequest, new_ids: list[int], final: bool, item: GenItem) -> Result:
        st = self.state
        e = st.running_engine()
        finish = proto.finish_reason(len(sreq.output_ids)) if final else None
        # SGLang adds the speculative fields to the finishing chunk only
        spec = e.spec.request_fields(sreq) if final and e.spec is not None else None
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
            cached_details=cached_details(st.cache, sreq.cached_tokens, sreq.cached_host, sreq.cached_storage),
            retractions=sreq.retractions,
        )
        meta.update(self._logprobs(item, sreq.output_ids))
        if len(sreq.output_ids) > sreq.text_upto:  # decode only the new tokens: text is cumulative
            sreq.text += st.tokenizer.decode(sreq.output_ids[sreq.text_upto :])
            sreq.text_upto = len(sreq.output_ids)
        return {"text": sreq.text, "output_ids": new_ids, "meta_info": meta}
