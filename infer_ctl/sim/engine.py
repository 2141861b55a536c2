"""The scheduler of one simulated worker: prefill queue (chunked), continuous-batching decode, cache.

One asyncio task per worker plays the GPU: each iteration runs at most one prefill forward (up to
`chunked_prefill_size` uncached tokens, possibly several requests) and one decode step over the
running batch, sleeping for the modelled duration x time_scale. Sleeps target absolute deadlines so
event-loop overhead does not accumulate into the model. No aiohttp here: the HTTP layer drives it.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import random
from collections import deque
from dataclasses import dataclass, field

from infer_ctl.sim.metrics import WorkerMetrics
from infer_ctl.sim.radix import Node, RadixCache
from infer_ctl.sim.spec_decode import SpecDecoder
from infer_ctl.sim.spec_workload import DEFAULT_DOMAIN, SpecWorkload
from infer_ctl.sim.timing import TimingModel
from infer_ctl.sim.tokenizer import WORDS


def request_seed(
    seed: int, input_ids: list[int], max_new_tokens: int, sampling_seed: int | None, sample: int = 0
) -> int:
    """Same worker seed + same request = same output tokens and acceptance draws, in any process;
    parallel samples (n > 1) of one prompt draw differently."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{seed}:{max_new_tokens}:{sampling_seed}:".encode())
    if sample:
        h.update(f"#{sample}:".encode())
    h.update(",".join(map(str, input_ids)).encode())
    return int.from_bytes(h.digest(), "big")


_MASK64 = (1 << 64) - 1


def fold_context(h: int, ids: list[int]) -> int:
    """A running hash of a token sequence: fold(fold(h, a), b) == fold(h, a + b), so the context of a
    continuation sent as input_ids = prompt + emitted tokens hashes as the uninterrupted sequence did."""
    for t in ids:
        h = ((h ^ (t + 1)) * 0x100000001B3) & _MASK64
    return h


def greedy_token(h: int) -> int:
    """The greedy choice after a context whose fold is `h` (splitmix64's finaliser, then the word list)."""
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (h ^ (h >> 31)) % len(WORDS)


_log = logging.getLogger("infer_ctl.sim")
#: SGLANG_CACHE_HIT_RATE_WINDOW_SECONDS (default 15): the window of the recent cache hit rate
HIT_RATE_WINDOW_S = 15.0


#: SGLang's SGLANG_NUM_RESERVED_DECODE_TOKENS default: the room a newly admitted decode request is given to grow
RESERVED_DECODE_TOKENS = 512


@dataclass(eq=False)
class SimRequest:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    priority: int = 0
    sampling_seed: int | None = None
    sample: int = 0
    #: temperature 0: output tokens are `greedy_token` of the context (the same on every worker, like one
    #: model's weights), not draws of the request's seeded generator
    greedy: bool = False
    #: greedy: the running fold of the context's ids (None until the first token)
    context_hash: int | None = None
    #: SGLang matches at most this many prompt tokens in the radix cache (logprob_start_len: the tokens
    #: whose input logprobs are asked for must be computed); None = no limit
    max_prefix: int | None = None
    #: SGLang's Req.skip_radix_cache_insert (schedule_batch.py): set for the fake bootstrap host 2.2.2.2;
    #: the prompt is computed but never inserted into the radix cache
    skip_cache_insert: bool = False
    #: filled by the engine
    cached_tokens: int = 0
    #: of cached_tokens, those loaded from host memory / storage (HiCache: meta_info cached_tokens_details)
    cached_host: int = 0
    cached_storage: int = 0
    #: model seconds to load them into HBM, charged to the request's first prefill forward
    load_seconds: float = 0.0
    #: a decode with its own radix cache: the prompt tokens it matched locally (device + host + storage;
    #: SGLang's `decode_prefix_len`, sent to the prefill so it transfers only the rest)
    decode_prefix_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    verify_ct: int = 0
    #: times the decode retracted it for KV space (SGLang's meta_info num_retractions)
    retractions: int = 0
    accepted_drafts: int = 0
    #: index k = verify steps that accepted k drafts (SGLang's spec_correct_drafts_histogram)
    spec_histogram: list[int] = field(default_factory=list)
    #: the workload domain its acceptance follows (spec_workload.SpecWorkload.resolve)
    domain: str = DEFAULT_DOMAIN
    arrived: float = 0.0  # loop.time() at submission (uvloop's clock differs from time.monotonic)
    started: float | None = None  # left the waiting queue
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    remaining_prefill: int = 0
    lock_node: Node | None = None
    rng: random.Random = field(default_factory=random.Random)
    #: wakes the HTTP handler: new tokens (list[int]) or None when finished
    updates: asyncio.Queue[list[int] | None] = field(default_factory=asyncio.Queue)
    prefill_done: asyncio.Future[None] | None = None
    text: str = ""  # detokenized output so far (the HTTP layer's cache)
    text_upto: int = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


class Engine:
    def __init__(
        self,
        role: str,
        timing: TimingModel,
        cache: RadixCache,
        *,
        time_scale: float,
        seed: int,
        spec: SpecDecoder | None = None,
        decode_radix: bool = False,
        retraction: bool = False,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.role = role
        self.timing = timing
        self.cache = cache
        self.time_scale = time_scale
        self.seed = seed
        #: a decode running its own radix cache (SGLang's --disaggregation-decode-enable-radix-cache)
        self.decode_radix = decode_radix and role == "decode"
        #: SGLang's decode admission (WorkerSpec.decode_retraction): a request is admitted when its tokens so
        #: far plus RESERVED_DECODE_TOKENS fit, and one is retracted when the pool runs out mid-decode
        self.retraction = retraction
        #: requests retracted so far (SGLang exports the last interval's as sglang:num_retracted_reqs)
        self.retracted_total = 0
        self.metrics = spec.metrics if spec is not None else WorkerMetrics()
        #: speculative decoding (None = off); by default every request at the preset's alpha
        self.spec = spec
        if spec is None and timing.spec_alpha is not None:
            self.spec = SpecDecoder(timing, SpecWorkload(), self.metrics, time_scale=time_scale)
        self.prefill_queue: deque[SimRequest] = deque()
        self.decode_waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: why the scheduler loop died (None while it runs): /health answers 503 from then on, as SGLang's
        #: does once its scheduler is gone, instead of a worker that accepts requests and never answers
        self.failed: str | None = None
        self._next_free = 0.0  # wall time the simulated GPU is busy until
        self._refresh_calls = 0  # scheduling passes that saw waiting prompts (_refresh_waiting_prefixes)
        #: SGLang's recent_cache_hit_rate (metrics_reporter.py `_CacheHitRateWindow`): hit / (hit + computed)
        #: tokens of the prefill forwards of the last HIT_RATE_WINDOW_S model seconds, updated at each forward
        self.recent_cache_hit_rate = 0.0
        self._hit_window: deque[tuple[float, int, int]] = deque()
        self._hit_sums = [0, 0]
        self.last_gen_throughput = 0.0

    def waiting_uncached_tokens(self) -> int:
        """`/v1/loads` `num_waiting_uncached_tokens` as SGLang 0.5.23 estimates it under fcfs, where the
        waiting queue is not prefix-matched (`SchedulerLoadInquirer.get_num_waiting_uncached_tokens`):
        a waiting prompt counts `int(seqlen x (1 - recent cache hit rate))`, the chunked one exactly what
        it has left; a decode counts none."""
        if self.role == "decode":
            return 0
        miss = 1.0 - self.recent_cache_hit_rate
        return sum(r.remaining_prefill if r.started is not None else int(r.prompt_tokens * miss)
                   for r in self.prefill_queue)  # fmt: skip

    def _observe_hit_rate(self, at: float, hit: int, total: int) -> None:
        """One prefill forward's hit and total tokens into the window (SGLang's `_CacheHitRateWindow.add`:
        samples at or before `at - window` leave as a new one comes)."""
        if total > 0:
            self._hit_window.append((at, hit, total))
            self._hit_sums[0] += hit
            self._hit_sums[1] += total
        while self._hit_window and self._hit_window[0][0] <= at - HIT_RATE_WINDOW_S:
            _, h, t = self._hit_window.popleft()
            self._hit_sums[0] -= h
            self._hit_sums[1] -= t
        self.recent_cache_hit_rate = self._hit_sums[0] / self._hit_sums[1] if self._hit_sums[1] else 0.0

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        self.failed = f"{type(exc).__name__}: {exc}"
        _log.error("simulated scheduler loop died: %s", self.failed, exc_info=exc)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for req in [*self.prefill_queue, *self.decode_waiting, *self.running]:
            self._release(req)
            req.updates.put_nowait(None)

    @property
    def idle(self) -> bool:
        return not (self.prefill_queue or self.decode_waiting or self.running)

    def model_seconds(self, wall: float) -> float:
        return wall / self.time_scale

    # -- submission ---------------------------------------------------------------------------------
    def new_request(self, rid: str, input_ids: list[int], max_new_tokens: int, **kw: object) -> SimRequest:
        req = SimRequest(rid=rid, input_ids=input_ids, max_new_tokens=max_new_tokens, **kw)  # type: ignore[arg-type]
        req.rng = random.Random(
            request_seed(self.seed, input_ids, max_new_tokens, req.sampling_seed, req.sample)
        )
        req.arrived = asyncio.get_running_loop().time()
        return req

    def submit_prefill(self, req: SimRequest) -> None:
        """Queue a prompt for prefill; on a prefill worker `req.prefill_done` resolves afterwards. The
        prompt is matched against the radix cache when it enters a prefill batch (`_match`), not here."""
        req.remaining_prefill = req.prompt_tokens  # nothing matched yet (what /v1/loads counts meanwhile)
        req.prefill_done = asyncio.get_running_loop().create_future()
        self._count_prompt(req)
        self.prefill_queue.append(req)
        self._wake.set()

    def _match(self, req: SimRequest) -> None:
        """Match a waiting prompt as it enters a prefill batch and lock the matched path until its prefill
        is done. SGLang matches at batch formation, not at arrival: `Scheduler.get_new_batch_prefill`
        calls `req.init_next_round_input(tree_cache)` (a fresh `match_prefix`) for each waiting request
        just before `PrefillAdder.add_one_req` admits it, and stops at the batch's token budget, so a
        request still queued when an earlier prefill of its prefix went into the tree hits it, while two
        requests of a new prefix in one batch both compute it (fcfs does no in-batch de-duplication). The
        host / storage part of the match (HiCache) is loaded back here too: SGLang loads host hits in
        `add_one_req` (`init_load_back`); the storage prefetch it starts at arrival is modelled, as
        before, by `load_back` at this point, its time charged to the request's first forward."""
        # SGLang matches at most input_len - 1 tokens (one is computed), fewer when input logprobs are
        # asked for (Req._compute_max_prefix_len), and the tree then cuts that to whole pages / bigrams
        limit = max(0, req.prompt_tokens - 1)
        if req.max_prefix is not None:
            limit = max(0, min(limit, req.max_prefix))
        match = self.cache.match_prefix(req.input_ids[:limit], req.priority)
        if match.host or match.storage:  # HiCache: load them back into HBM (sim/tiers.py)
            match = self.cache.load_back(match, self.timing.prefill_seconds(match.host + match.storage))
        req.cached_tokens = match.length
        req.cached_host, req.cached_storage, req.load_seconds = match.host, match.storage, match.load_seconds
        req.remaining_prefill = req.prompt_tokens - req.cached_tokens
        self.cache.lock(match.node)
        req.lock_node = match.node
        self.metrics.cached_tokens += req.cached_tokens  # once: a request is matched once, as it starts

    def submit_decode(self, req: SimRequest, cached_tokens: int) -> None:
        """A request whose KV arrived from a prefill worker: it joins the decode queue. A decode with its
        own radix cache first matches the prompt there (SGLang's `_match_prefix_and_lock`,
        disaggregation/decode.py) and restores the host / storage part of the match into HBM before the
        request's first decode step (the local restore, decode_hicache_mixin.py); what it holds beyond
        the prefill's hit is added to cached_tokens, as device tokens."""
        req.cached_tokens = cached_tokens
        if self.decode_radix:
            match = self.cache.match_prefix(req.input_ids[: max(0, req.prompt_tokens - 1)], req.priority)
            if match.host or match.storage:
                match = self.cache.load_back(match, self.timing.prefill_seconds(match.host + match.storage))
            req.decode_prefix_tokens = match.length
            req.load_seconds = match.load_seconds
            # prepare_for_prebuilt (disaggregation/decode_schedule_batch_mixin.py): the decode's own reuse
            # beyond the prefill's reported hit adds to cached_tokens, counted as device tokens
            req.cached_tokens += max(0, match.length - cached_tokens)
            self.cache.lock(match.node)
            req.lock_node = match.node
        self._count_prompt(req)
        self.metrics.cached_tokens += req.cached_tokens
        self.decode_waiting.append(req)
        self._wake.set()

    def _count_prompt(self, req: SimRequest) -> None:
        self.metrics.num_requests += 1
        self.metrics.prompt_tokens += req.prompt_tokens

    def abort(self, req: SimRequest) -> None:
        """The client went away: drop the request wherever it is."""
        for q in (self.prefill_queue, self.decode_waiting):
            if req in q:
                q.remove(req)
        if req in self.running:
            self.running.remove(req)
        if not req.finished:
            self.metrics.num_aborted += 1
        self._release(req)

    def _release(self, req: SimRequest) -> None:
        if req.lock_node is not None:
            self.cache.unlock(req.lock_node)
            req.lock_node = None
        if req.prefill_done is not None and not req.prefill_done.done():
            req.prefill_done.cancel()

    # -- the GPU loop -------------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.idle:
                self._wake.clear()
                await self._wake.wait()
                self._next_free = max(self._next_free, loop.time())
            if self.prefill_queue:
                await self._prefill_step(loop)
            self._admit()
            if self.running:
                await self._decode_step(loop)

    async def _busy(self, loop: asyncio.AbstractEventLoop, model_s: float) -> float:
        """Occupy the simulated GPU for `model_s`; returns the wall time the work ends."""
        start = max(self._next_free, loop.time())
        if loop.time() - start > 0.05:  # far behind (CPU starved): do not try to catch up in a burst
            start = loop.time()
        self._next_free = start + model_s * self.time_scale
        delay = self._next_free - loop.time()
        await asyncio.sleep(delay if delay > 0 else 0)
        return self._next_free

    def _refresh_waiting_prefixes(self) -> None:
        """SGLang 0.5.23's `SchedulePolicy._touch_waiting_prefixes` (in `calc_priority`, once per
        `get_new_batch_prefill`; SGLANG_ENABLE_WAITING_PREFIX_REFRESH, on by default): under `lru`
        eviction, on a worker that prefills, every 32nd pass with waiting requests touches the cached
        prefixes of the first 128 of them (`touch_prefix`, head last), so a prefix whose request waits to
        be matched (fcfs matches it only as it enters a batch) is not the first evicted meanwhile. The
        chunked request is not in SGLang's waiting queue: it holds its lock."""
        if self.cache.policy != "lru" or self.role == "decode":
            return
        if not any(r.started is None for r in itertools.islice(self.prefill_queue, 129)):
            return  # a pass without waiting requests does not count
        refresh = self._refresh_calls % 32 == 0
        self._refresh_calls += 1
        if refresh:  # the list only when it is used: one pass in 32
            waiting = [r for r in itertools.islice(self.prefill_queue, 129) if r.started is None][:128]
            for req in reversed(waiting):
                self.cache.touch_prefix(req.input_ids)

    async def _prefill_step(self, loop: asyncio.AbstractEventLoop) -> None:
        self._refresh_waiting_prefixes()
        budget = self.timing.chunked_prefill_size
        batch: list[tuple[SimRequest, int]] = []
        for req in self.prefill_queue:
            if budget <= 0:
                break  # PrefillAdder's budget is spent: the requests behind are neither matched nor admitted
            if req.started is None:
                self._match(req)  # a chunked request (started) keeps its match and lock
            take = min(budget, req.remaining_prefill)
            batch.append((req, take))
            budget -= take
        now = loop.time()
        hit = 0  # the prefixes of the requests this forward admits (a chunk continuing counts none)
        for req, _ in batch:
            if req.started is None:
                req.started = now
                hit += req.cached_tokens
                self.metrics.queue_time.observe(self.model_seconds(now - req.arrived))
        tokens = sum(t for _, t in batch)
        self._observe_hit_rate(self.model_seconds(now), hit, hit + tokens)
        model_s = self.timing.prefill_seconds(tokens)
        # HiCache: the host/storage loads of the batch run next to its compute (SGLang loads layer by
        # layer ahead of the forward), so the forward takes the longer; blocking write-backs add to it
        load = sum(req.load_seconds for req, _ in batch)
        for req, _ in batch:
            req.load_seconds = 0.0
        if load:
            model_s = max(model_s, self.timing.step_overhead_s + load)
        end = await self._busy(loop, model_s + self.cache.take_stall_seconds())
        for req, take in batch:
            if req not in self.prefill_queue:
                continue  # aborted while the step ran (its client went away): abort() dropped it
            req.remaining_prefill -= take
            if req.remaining_prefill > 0:
                if not req.skip_cache_insert and req.lock_node is not None:
                    # SGLang's cache_unfinished_req: a chunk's KV enters the tree as soon as it is computed,
                    # where a request matched later finds it; the request's lock moves to its end
                    done = req.input_ids[: req.prompt_tokens - req.remaining_prefill]
                    req.lock_node = self.cache.insert_locked(done, req.priority, req.lock_node)
                continue
            self.prefill_queue.remove(req)
            if not req.skip_cache_insert:  # mem_cache/common.py honours skip_radix_cache_insert
                self.cache.insert(req.input_ids, req.priority)
            self._release_lock_only(req)
            if self.role == "prefill":
                assert req.prefill_done is not None
                if not req.prefill_done.done():
                    req.prefill_done.set_result(None)
            else:
                self._first_token(req, end)
                if not req.finished:
                    self.decode_waiting.append(req)
        self.cache.end_step()  # SGLang publishes a step's KV events as one batch once the step is done

    def _release_lock_only(self, req: SimRequest) -> None:
        if req.lock_node is not None:
            self.cache.unlock(req.lock_node)
            req.lock_node = None

    def _first_token(self, req: SimRequest, at: float) -> None:
        """The prefill forward samples the first output token (on PD, it travels with the KV)."""
        if req.started is None:
            req.started = at
            self.metrics.queue_time.observe(self.model_seconds(at - req.arrived))
        req.first_token_at = at
        self.metrics.ttft.observe(self.model_seconds(at - req.arrived))
        if req.max_new_tokens > 0:
            self._emit(req, [self._next_token(req)], at)
        else:
            self._finish(req, at)

    def _held(self, r: SimRequest) -> int:
        """KV a running request counts against the pool: all it may grow to, or (retraction) what it holds."""
        return r.prompt_tokens + (len(r.output_ids) if self.retraction else r.max_new_tokens)

    def _admit(self) -> None:
        t = self.timing
        used = sum(self._held(r) for r in self.running)
        while self.decode_waiting and len(self.running) < t.max_running_requests:
            req = self.decode_waiting[0]
            need = (req.prompt_tokens + len(req.output_ids) + RESERVED_DECODE_TOKENS if self.retraction
                    else req.prompt_tokens + req.max_new_tokens)
            if self.running and used + need > t.kv_capacity_tokens:
                break  # KV pool full: wait for running requests to finish (SGLang's waiting queue)
            self.decode_waiting.popleft()
            if req.first_token_at is None:  # decode worker: the first token came with the KV
                self._first_token(req, asyncio.get_running_loop().time())
            if not req.finished:
                self.running.append(req)
                used += need

    def _retract(self) -> None:
        """SGLang's retract_decode: while the next step's tokens do not fit, the running request with the
        fewest output tokens goes back to the waiting queue (its KV kept on the host: it resumes where it
        was, SGLang's --disaggregation-decode-retraction-backup cpu_tensor)."""
        cap = self.timing.kv_capacity_tokens
        while len(self.running) > 1 and sum(self._held(r) + 1 for r in self.running) > cap:
            victim = min(self.running, key=lambda r: (len(r.output_ids), -r.prompt_tokens))
            self.running.remove(victim)
            victim.retractions += 1
            self.retracted_total += 1
            self.decode_waiting.appendleft(victim)

    async def _decode_step(self, loop: asyncio.AbstractEventLoop) -> None:
        t, spec = self.timing, self.spec
        if self.retraction:
            self._retract()
        batch = list(self.running)
        context = sum(r.prompt_tokens + len(r.output_ids) for r in batch)
        steps = spec.steps_for_batch(len(batch)) if spec is not None else None
        model_s = t.decode_step_seconds(len(batch), context, steps)
        # a decode radix cache: local restores of newly admitted requests, and blocking write-backs
        load = sum(r.load_seconds for r in batch)
        for r in batch:
            r.load_seconds = 0.0
        end = await self._busy(loop, model_s + load + self.cache.take_stall_seconds())
        produced = 0
        correct: list[int] = []
        for req in batch:
            if req.finished or req not in self.running:
                continue
            left = req.max_new_tokens - len(req.output_ids)
            n = 1
            if spec is not None and steps is not None:
                accepted = spec.draw(req, steps)
                correct.append(accepted)
                n = min(accepted + 1, left)  # tokens past max_new_tokens are verified, not emitted
            produced += n
            self._emit(req, [self._next_token(req) for _ in range(n)], end)
        if spec is not None and correct:
            spec.verify_done(correct)
        self.last_gen_throughput = produced / model_s if model_s else 0.0
        self.running = [r for r in self.running if not r.finished]
        if self.decode_radix:
            self.cache.end_step()

    @staticmethod
    def _next_token(req: SimRequest) -> int:
        drawn = req.rng.randrange(len(WORDS))  # drawn for greedy requests too: the acceptance draws stay put
        if not req.greedy:
            return drawn
        if req.context_hash is None:
            req.context_hash = fold_context(0xCBF29CE484222325, req.input_ids + req.output_ids)
        token = greedy_token(req.context_hash)
        req.context_hash = fold_context(req.context_hash, [token])
        return token

    def _emit(self, req: SimRequest, tokens: list[int], at: float) -> None:
        if req.last_token_at is not None:
            itl = self.model_seconds(at - req.last_token_at) / len(tokens)
            for _ in tokens:
                self.metrics.itl.observe(itl)
        req.last_token_at = at
        req.output_ids.extend(tokens)
        self.metrics.generation_tokens += len(tokens)
        req.updates.put_nowait(tokens)
        if len(req.output_ids) >= req.max_new_tokens:
            self._finish(req, at)

    def _finish(self, req: SimRequest, at: float) -> None:
        req.finished_at = at
        if self.decode_radix and not req.skip_cache_insert:
            # cache_finished_req: the sequence's KV stays in the decode's tree (the last token's is not computed)
            self.cache.insert(req.input_ids + req.output_ids[:-1], req.priority)
            self._release_lock_only(req)
        self.metrics.spec_verify_calls += req.verify_ct  # SGLang counts them as a request finishes
        self.metrics.e2e.observe(self.model_seconds(at - req.arrived))
        req.updates.put_nowait(None)
