"""Which workers publish KV events, and where: a worker's `/server_info` read into its subscription.

Discovery (health.py hands every worker's `/server_info` to KvRouting.configure; a decode counts only
when it keeps a radix cache, `decode_radix_cache`): `kv_events` (SGLang 0.5.23's
`describe_kv_events_publisher`: endpoint host and port base, replay port base, topic, block size,
dp_size; dialed at the worker URL's host, DP rank r at base + r: `endpoints`), `page_size`, and
`speculative_algorithm` (an EAGLE worker keys its radix tree by bigrams, which its stores also show).
Pure, but for `WorkerKv` holding the worker's streams (router/kvindex/kv_subscriber.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from infer_ctl.router.kvindex.kv_subscriber import KvStream

log = logging.getLogger("infer_ctl.router.kv")

#: SGLang 0.5.23's `SpeculativeAlgorithm.is_eagle()` (speculative/spec_info.py): EAGLE, EAGLE3 and
#: FROZEN_KV_MTP (what a Gemma4 assistant draft's EAGLE/NEXTN becomes, arg_groups/speculative_hook.py);
#: its radix cache keys pages by bigrams (RadixKey.maybe_to_bigram_view). NEXTN is EAGLE's alias.
_BIGRAM_ALGOS = frozenset({"EAGLE", "EAGLE3", "FROZEN_KV_MTP", "NEXTN"})


def bigram_keys(info: dict[str, Any]) -> bool:
    """Whether a worker's /server_info says its radix cache keys pages by bigrams (SGLang upper-cases
    the name it is given: `SpeculativeAlgorithm.from_string`)."""
    algo = info.get("speculative_algorithm")
    return isinstance(algo, str) and algo.upper() in _BIGRAM_ALGOS


@dataclass
class WorkerKv:
    url: str
    streams: list[KvStream]
    page_size: int
    bigram: bool
    #: descriptor that made the streams (a change re-subscribes)
    descriptor: tuple[Any, ...]
    #: per-request accounting for `router workers`: exact and predicted cached tokens of the
    #: requests routed here, and what the worker reported
    requests: int = 0
    exact_tokens: int = 0
    predicted_tokens: int = 0
    reported_tokens: int = 0

    @property
    def state(self) -> str:
        states = {s.state for s in self.streams}
        for s in ("down", "untrusted", "replaying"):
            if s in states:
                return s
        return "exact"

    @property
    def exact(self) -> bool:
        return all(s.state == "exact" for s in self.streams)

    def space(self) -> tuple[int, bool]:
        return self.page_size, self.bigram

    def keyed_as_stored(self, stream: KvStream) -> None:
        """The stores are the truth about the keying: /server_info only guessed it."""
        if stream.block_size and stream.bigram is not None and (stream.block_size, stream.bigram) != self.space():
            log.warning("KV events: the worker's stores disagree with /server_info about its pages",
                        extra={"worker": self.url, "page_size": stream.block_size, "bigram": stream.bigram})
            self.page_size, self.bigram = stream.block_size, stream.bigram

    def doc(self, decode: bool) -> dict[str, Any]:
        """The worker's index for `router workers` (KvRouting.worker_doc): a decode's `index` is its
        streams' state, a prefill's exact, replaying or predicted (routed on the predicted index)."""
        state = self.state
        return {
            "index": state if decode else "exact" if state == "exact" else state if state == "replaying" else "predicted",
            "index_reason": next((s.reason for s in self.streams if s.state != "exact"), "in sync"),
            "kv_blocks": sum(len(s.blocks) for s in self.streams),
            "kv_media": _media(self.streams),
            "page_size": self.page_size, "bigram": self.bigram,
            "cached_tokens": {"requests": self.requests, "exact": self.exact_tokens,
                              "predicted": self.predicted_tokens, "reported": self.reported_tokens},
            "kv_streams": [s.as_dict() for s in self.streams],
        } | ({"cached_tokens": None} if decode else {})


def _media(streams: list[KvStream]) -> dict[str, int]:
    """Blocks per storage medium over a worker's streams (GPU, CPU_PINNED, ...): which tier the
    `router workers` line shows (a page backed up to host counts once per medium)."""
    out: dict[str, int] = {}
    for s in streams:
        for m, n in s.blocks.snapshot().items():
            out[m] = out.get(m, 0) + n
    return out


def decode_radix_cache(info: dict[str, Any]) -> str | None:
    """None when a decode's /server_info says it keeps a radix cache, else why not.

    SGLang 0.5.23 forces `disable_radix_cache=True` on a decode unless it runs with
    `--disaggregation-decode-enable-radix-cache` (python/sglang/srt/arg_groups/pd_disaggregation_hook.py);
    a decode without a radix cache stores nothing, yet still advertises `kv_events` when given
    --kv-events-config (runtime_context.py `describe_kv_events_publisher` looks only at that config), so
    its empty stream would read "exact, 0 blocks" forever."""
    if info.get("disaggregation_decode_enable_radix_cache") is not True:
        return "decode without a radix cache (SGLang: --disaggregation-decode-enable-radix-cache is off)"
    if info.get("disable_radix_cache") is True:
        return "decode with --disable-radix-cache"
    return None


def _host(url: str) -> str:
    host = urlsplit(url).hostname or "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _port_base(v: Any, dp: int) -> int | None:
    """A port base whose dp ranks all are ports (base + r for rank r)."""
    ok = isinstance(v, int) and not isinstance(v, bool) and v > 0 and v + dp - 1 <= 65535
    return v if ok else None


def endpoints(url: str, desc: dict[str, Any]) -> list[tuple[str, str | None]] | None:
    """(PUB endpoint, replay endpoint) per DP rank of a worker's `/server_info.kv_events`.

    Dialed at the worker URL's host whatever `endpoint_host` says: a wildcard means that host anyway,
    and a named one would have the router connect wherever a worker's /server_info points (another
    host, a metadata address, a string that is no host or has a scheme in it: review of issue 19). A
    publisher bound to one address of the worker's host is reached when the URL names that address."""
    dp = desc.get("dp_size") or 1
    dp = dp if isinstance(dp, int) and not isinstance(dp, bool) and 1 <= dp <= 256 else 1
    port = _port_base(desc.get("endpoint_port_base"), dp)
    if port is None:
        return None
    host = _host(url)
    replay = _port_base(desc.get("replay_endpoint_port_base"), dp)
    if replay is not None and abs(replay - port) < dp:
        replay = None  # the same ports as the PUB sockets: no replay socket there
    return [(f"tcp://{host}:{port + r}", f"tcp://{host}:{replay + r}" if replay else None) for r in range(dp)]


@dataclass(frozen=True)
class Subscription:
    """What a worker's `/server_info` says to subscribe to: (PUB, replay) endpoints per DP rank, the
    topic, and the key space of its pages. `key` is what a change of re-subscribes on."""

    endpoints: list[tuple[str, str | None]]
    topic: str
    page_size: int
    bigram: bool

    @property
    def key(self) -> tuple[Any, ...]:
        return (tuple(self.endpoints), self.topic, self.page_size, self.bigram)


def subscription(url: str, info: dict[str, Any]) -> Subscription | None:
    """The subscription a worker's `/server_info` describes (None: no usable `kv_events`)."""
    desc = info.get("kv_events")
    if not isinstance(desc, dict):
        return None
    eps = endpoints(url, desc)
    if not eps:
        return None
    page = desc.get("block_size") or info.get("page_size") or 1
    page = page if isinstance(page, int) and page >= 1 else 1
    topic = desc.get("topic")
    return Subscription(eps, topic if isinstance(topic, str) else "", page, bigram_keys(info))
