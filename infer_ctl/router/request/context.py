"""What the router knows about one client request while it handles it: parsed once at the entry point
(router/request/proxy.py), then read and filled in by routing (picker.py), the attempts (attempt.py), the relay
(relay.py) and the feedback (feedback.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infer_ctl.core.routing.prefixes import PrefixRecord
from infer_ctl.router.http import h1


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
    flight: Any = None
    coalesced: str | None = None
    hold_until: float | None = None
    #: tracing and tenant hooks (observe.RequestObserver; not imported: observe.py reads this module);
    #: None when the router has neither, and every hook checks this first
    obs: Any = None
