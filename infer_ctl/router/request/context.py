"""What the router knows about one client request while it handles it: parsed once at the entry point
(router/request/proxy.py), then read and filled in by routing (picker.py), the attempts (attempt.py), the relay
(relay.py) and the feedback (feedback.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from infer_ctl.core.routing.coalesce import Flight
from infer_ctl.core.routing.prefixes import PrefixRecord
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.http import h1
from infer_ctl.router.http.upstream import Response
from infer_ctl.router.request.calls import WorkerCalls

#: the upstream calls of one request (calls.WorkerCalls' read, open and done, or the observer's wrapped ones)
Read = Callable[[WorkerState, str, bytes, dict[str, str]], Awaitable[tuple[int, bytes, str]]]
Open = Callable[[WorkerState, str, bytes, dict[str, str]], Awaitable[Response]]
Done = Callable[[WorkerState, Response], None]


class RequestHooks(Protocol):
    """What the request path tells a request's tracing and tenant hooks (observe.RequestObserver; named
    here as a protocol, since observe.py reads this module)."""

    def answered(self, ctx: RequestContext, obj: Any, predicted_tokens: int) -> None: ...
    def stream_chunk(self, events: list[bytes], last: Any, items: dict[int, Any] | None) -> None: ...
    def first_chunk(self, ttft_s: float) -> None: ...
    def streamed(self, ttft_s: float, first: float, last: float) -> None: ...
    def recovery(self, outcome: str, reason: str | None, tokens_sent: int) -> None: ...
    def room(self, room: int | list[int]) -> None: ...
    def calls(self, calls: WorkerCalls) -> tuple[Read, Open, Done]: ...


@dataclass(slots=True)
class RequestContext:
    rid: str
    endpoint: str
    request: h1.Request
    #: the client's body as sent and as parsed (a JSON object)
    raw: bytes
    body: dict[str, Any]
    stream: bool
    #: the routing text (core/routing/prompt.py) and its block hashes (empty unless cache-aware)
    text: str
    hashes: list[int]
    named: PrefixRecord | None
    logprobs: bool
    started: float
    #: headers sent upstream and back to the client (X-Request-Id)
    headers: dict[str, str]
    #: filled in by the last routing decision
    predicted_chars: int = 0
    reason: str = ""
    prefill: str = ""
    decode: str = ""
    attempts: int = 0
    #: the client stream once the relay committed to one (a timeout then ends it with an error event)
    resp: h1.StreamResponse | None = None
    #: KV events (router/kvindex/kv_routing.py): the whole prompt's anchor key, the chosen prefill's cached
    #: prompt units at the decision (None: predicted in characters only) and whether that was exact
    full_key: int | None = None
    #: predicted index: when the chosen worker's deepest matched block was last used (before this
    #: request touched it); feedback drops what is older when the worker turns out to have evicted
    seen: float | None = None
    predicted_tokens: int | None = None
    exact: bool = False
    #: in-flight prefix coalescing (router/request/coalesce.py): the chosen prefill's exact cached prompt units
    #: before the pending overlay, this attempt's flight (core/routing/coalesce.py; landed by attempt.py
    #: on the first byte or the answer), how a hold ended (None: not held) and when the request's
    #: holds must end, all of its attempts together (event-loop time; None: never held)
    held_tokens: int | None = None
    flight: Flight | None = None
    coalesced: str | None = None
    hold_until: float | None = None
    #: a long prompt's prediction (picker.py `_long`), made when the attempt's worker took it (attempt.py
    #: `landed`: its first byte or 2xx answer), never on a rejection; None: predicted at routing time
    on_landed: Callable[[], None] | None = None
    #: tracing and tenant hooks (observe.RequestObserver); None when the router has neither, and every
    #: hook checks this first
    obs: RequestHooks | None = None
