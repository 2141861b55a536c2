"""Mid-stream recovery: a stream whose decode fails after its first byte goes on from another pair.

Retries stop at a stream's first byte (retry.py); past it, the client has tokens it cannot un-see. SGLang
can continue exactly what it was doing from those tokens: a new request whose `input_ids` are the prompt's
ids plus the ids already sent (nothing is re-tokenized: text -> ids is not unique, and a model continues
from the ids it produced) and whose budget is what is left of `max_new_tokens` is, for greedy decoding,
the same computation as the uninterrupted one from that token on; SGLang prefills it like any prompt (a
radix-cache hit for the prompt wherever it was cached). Its chunks are rewritten to read as the rest of the
first stream (stream.py): one unbroken stream, no token twice, none missing.

Where the continuation could not be exact the stream ends with the error event as before (`refusal`):
- OpenAI endpoints: SGLang 0.5.23 streams no output token ids on /v1/chat/completions (it refuses
  `return_token_ids` with streaming) and the router does not ask for them on /v1/completions (every chunk
  would have to be rewritten to take them out again); /generate chunks carry `output_ids` anyway;
- batches, n > 1 and beam search (several sequences in one stream, or beams the worker keeps),
  `return_logprob` (logprob continuity: the continuation's input logprobs would cover the emitted
  tokens), multimodal or embedding inputs;
- sampling with a `sampling_seed` (the generator's state at the cut cannot be restored), stop strings
  and `stop_regex` (SGLang matches them against the output only: one spanning the cut would be
  missed), penalties over the output (frequency, presence, repetition: the continuation would not count
  the emitted tokens), constrained decoding (regex, JSON schema, EBNF, structural tags: the grammar
  would restart), custom logit processors; a budget already spent.
Unseeded sampling continues as a valid sample of the same distribution. EAGLE speculative decoding
needs nothing: the draft re-prefills with the target, and greedy verification emits the target's own
greedy tokens.

The prompt's ids: the request's `input_ids`, or for a text prompt the ids the new prefill's tokenizer
gives it (SGLang's /v1/tokenize adds special tokens as /generate does), asked once per stream.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from infer_ctl.core.routing.pd import bootstrap_host, with_bootstrap
from infer_ctl.core.routing.policy import NoWorkerAvailable
from infer_ctl.router.fleet.metrics import RouterMetrics
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.http.jsonio import JSON_TYPE, DecodeError, dumps, loads
from infer_ctl.router.http.upstream import UpstreamError, Upstreams
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.retry import AttemptFailed
from infer_ctl.router.request.stream import StreamTrack

log = logging.getLogger("infer_ctl.router")

#: SGLang's SamplingParams default when a request gives no max_new_tokens
DEFAULT_MAX_NEW_TOKENS = 128
#: how many continuations one stream may take (each after a decode of its own failed)
MAX_RECOVERIES = 3
_PD_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
#: request fields a continuation cannot honour exactly (see the module's docstring)
_BODY_REFUSED = ("return_logprob", "input_embeds", "image_data", "video_data", "audio_data", "return_hidden_states",
                 "custom_logit_processor", "session_params")
_PARAMS_REFUSED = ("regex", "json_schema", "ebnf", "structural_tag", "custom_params", "sampling_seed")
_PENALTIES = (("frequency_penalty", 0), ("presence_penalty", 0), ("repetition_penalty", 1))

Pick = Callable[[RequestContext, set[str]], tuple[WorkerState, WorkerState | None]]
Open = Callable[[RequestContext, WorkerState, WorkerState | None, bytes], Awaitable[Any]]


def refusal(ctx: RequestContext) -> str | None:
    """Why this request's stream cannot be continued exactly (None: it can), from the request alone."""
    if ctx.endpoint != "/generate":
        return "openai_endpoint"
    body = ctx.body
    text, ids = body.get("text"), body.get("input_ids")
    if not (isinstance(text, str) or (isinstance(ids, list) and ids and all(_is_id(t) for t in ids))):
        return "batch_or_input"
    if any(body.get(k) for k in _BODY_REFUSED):
        return "logprobs" if body.get("return_logprob") else "input_kind"
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        return "sampling_params"
    if (sp.get("n") or 1) != 1 or (sp.get("beam_width") or 1) != 1:
        return "parallel_samples"  # (beam search: the beams' state at the cut is the worker's)
    if sp.get("stop") or sp.get("stop_regex"):
        return "stop_strings"
    if any(sp.get(k) is not None for k in _PARAMS_REFUSED):
        return "seeded_sampling" if sp.get("sampling_seed") is not None else "constrained_decoding"
    if any(sp.get(k, neutral) not in (None, neutral) for k, neutral in _PENALTIES):
        return "penalties"
    mnt = sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if not _is_id(mnt):
        return "sampling_params"
    return None


def _is_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def continuation(body: dict[str, Any], prompt_ids: list[int], track: StreamTrack) -> dict[str, Any]:
    """The /generate body that goes on from the tokens `track` saw sent: same fields and sampling, the
    prompt plus those tokens as ids, the rest of the budget (`rid` dropped: SGLang refuses a live one)."""
    out = {k: v for k, v in body.items() if k not in ("text", "input_ids", "rid", *_PD_KEYS)}
    sp = dict(body.get("sampling_params") or {})
    k = len(track.ids)
    sp["max_new_tokens"] = int(sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)) - k
    if _is_id(sp.get("min_new_tokens")):
        sp["min_new_tokens"] = max(0, int(sp["min_new_tokens"]) - k)
    out["sampling_params"] = sp
    out["input_ids"] = prompt_ids + track.ids
    out["stream"] = True
    return out


class StreamRecovery:
    """Opens a stream's continuation on a new pair (`resume`); counts how recoveries end."""

    def __init__(self, *, enabled: bool, pick: Pick, open_stream: Open, upstreams: Upstreams, rng: Any,
                 metrics: RouterMetrics, max_tries: int, linger: Callable[[Any], None]) -> None:
        self.enabled = enabled
        self.linger = linger
        self.pick = pick
        self.open_stream = open_stream
        self.upstreams = upstreams
        self.rng = rng
        self.metrics = metrics
        self.max_tries = max(1, max_tries)
        #: the stream modes (StreamTrack.shape) the last stream that showed them had: what a stream cut
        #: after its first event is taken to have (StreamTrack.assume)
        self.shape: tuple[bool, bool] | None = None

    def learn(self, track: StreamTrack) -> None:
        """A stream ended: keep its modes, when it showed them."""
        shape = track.shape()
        if shape is not None:
            self.shape = shape

    def watch(self, ctx: RequestContext) -> StreamTrack | None:
        """A tracker for a stream that could be continued (the relay feeds it what it sends); None when
        recovery is off or the request cannot be continued exactly (counted when its stream breaks)."""
        if not self.enabled:
            return None
        why = refusal(ctx)
        return StreamTrack(refused=why)

    async def resume(self, ctx: RequestContext, track: StreamTrack, failed: WorkerState, error: str) -> Any:
        """The continuation's open stream (attempt.OpenStream) with `track` switched to rewriting its
        chunks, or None: the stream then ends with its error event."""
        if track.refused is None and self.shape is not None:
            track.assume(self.shape)
        why = track.refused or track.not_resumable(DEFAULT_MAX_NEW_TOKENS, ctx.body.get("sampling_params"))
        if why is None and track.recoveries >= MAX_RECOVERIES:
            why = "too_many_recoveries"
        if why is not None:
            self._outcome(ctx, "not_continuable", why, track)
            return None
        excluded = {failed.url, *track.failed}
        track.failed.add(failed.url)
        for _ in range(self.max_tries):
            try:
                pre, dec = self.pick(ctx, excluded)
            except NoWorkerAvailable:
                break
            if (dec or pre).url in excluded:  # the picker's last resort is a worker that failed this stream
                break
            try:
                prompt = track.prompt_ids if track.prompt_ids is not None else await self._prompt_ids(ctx, pre)
                track.prompt_ids = prompt
                body = continuation(ctx.body, prompt, track)
                payload = body if dec is None else with_bootstrap(body, ctx.endpoint, bootstrap_host(pre.url),
                                                                   pre.spec.bootstrap_port, self.rng)
                opened = await self.open_stream(ctx, pre, dec, dumps(payload))
            except AttemptFailed as exc:
                excluded.add(exc.worker)
                track.failed.add(exc.worker)
                continue
            if not hasattr(opened, "upstream"):  # a worker's own refusal (4xx): nothing to continue with
                break
            if opened.prefill is not None:
                self.linger(opened.prefill)  # the prefill's own answer: left to finish (attempt.finish_later)
            track.resumed()
            self._outcome(ctx, "resumed", None, track, after=error)
            return opened
        self._outcome(ctx, "failed", "no_pair", track)
        return None

    async def _prompt_ids(self, ctx: RequestContext, worker: WorkerState) -> list[int]:
        ids = ctx.body.get("input_ids")
        if isinstance(ids, list):
            return list(ids)
        try:
            status, data = await self.upstreams.fetch(worker.url, "POST", "/v1/tokenize",
                                                      dumps({"prompt": ctx.body.get("text")}),
                                                      {"Content-Type": JSON_TYPE})
            tokens = loads(data).get("tokens") if status == 200 else None
        except (UpstreamError, DecodeError, ValueError, AttributeError) as exc:
            raise AttemptFailed("recovery_tokenize", worker.url, f"tokenize failed: {exc}") from None
        if not (isinstance(tokens, list) and all(_is_id(t) for t in tokens)):
            raise AttemptFailed("recovery_tokenize", worker.url, f"tokenize answered HTTP {status}")
        return tokens

    def _outcome(self, ctx: RequestContext, outcome: str, reason: str | None, track: StreamTrack,
                 after: str | None = None) -> None:
        self.metrics.recoveries.labels(outcome).inc()
        extra = {"rid": ctx.rid, "outcome": outcome, "reason": reason, "tokens_sent": len(track.ids),
                 "decode": ctx.decode or ctx.prefill, "error": after}
        log.log(logging.INFO if outcome == "resumed" else logging.WARNING, "stream recovery", extra=extra)
        if ctx.obs is not None:
            ctx.obs.recovery(outcome, reason, len(track.ids))
