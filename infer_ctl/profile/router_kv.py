"""router.kv_events: how the router follows the workers' KV events (docs/router.md, "The exact index").

The launch side (`sglang.kv_events`, SGLang's --kv-events-config) makes workers publish; these keys say
whether and how the router subscribes. Its fields, defaults and bounds are the only declaration of them (router/config.py reads them as settings.kv_events)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from infer_ctl.profile.base import StrictModel


class KvEventsRouting(StrictModel):
    #: subscribe to the workers whose /server_info advertises kv_events (cache_aware policy only)
    enabled: bool = True
    #: the target model's directory (tokenizer.json, tokenizer_config.json) or its tokenizer.json, on
    #: the router's host, to tokenize prompts as the workers do; relative paths resolve against the
    #: profile's directory. None: models.target.tokenizer_path or models.target.path
    tokenizer_path: Annotated[str, Field(min_length=1)] | None = None
    #: distinct blocks kept per worker stream, on any medium (a HiCache page in HBM and host counts
    #: once: core/routing/blocks.py); more make the stream untrusted (router/kvindex/kv_subscriber.py)
    max_blocks: Annotated[int, Field(ge=1024, le=1 << 31)] = 4_000_000
    #: each storage medium's own bound (GPU, CPU_PINNED, DISK, EXTERNAL; None: max_blocks): a batch
    #: passing it is refused (counted in inferctl_router_kv_blocks_refused_total by medium, the stream
    #: untrusted and its blocks freed); ~25 bytes of router memory an entry (16-27: core/routing/blocktable.py)
    max_blocks_per_medium: Annotated[int, Field(ge=1024, le=1 << 31)] | None = None
    #: how long a gap replay (or the start-up replay from seq 0) may take before the stream is untrusted
    #: (finite: NaN passed as "should be less than or equal to 300", NaN failing every comparison)
    replay_timeout_s: Annotated[float, Field(gt=0, le=300, allow_inf_nan=False)] = 2.0
    #: batches a second one publisher may send; more is a flood (the stream is untrusted, paused)
    max_batches_per_s: Annotated[int, Field(ge=1)] = 5000
    #: the largest KV-event message accepted (ZMQ's MAXMSGSIZE): a bigger one drops the connection
    #: undecoded (router/kvindex/kv_subscriber.py StreamSettings says why 8 MiB: a ~595k-token
    #: single store at page size 1); raise it for longer contexts with chunked prefill off
    max_message_bytes: Annotated[int, Field(ge=1 << 16, le=1 << 30)] = 8 << 20
    #: the longest prompt (characters) the exact index tokenizes to anchor it: a longer one is routed on
    #: the predicted index (tokenizing 29 MB took 16 s of CPU; router/kvindex/kv_routing.py)
    anchor_max_chars: Annotated[int, Field(ge=1024, le=1 << 30)] = 256 << 10
