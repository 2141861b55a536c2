"""The router's pair health (docs/router.md, "Pairs that degrade"): the live KV-transfer floors under
which a prefill x decode pair is avoided, and how it is tried again. Unset floors judge only failed
transfers and the audit's pair tests."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from infer_ctl.profile.base import StrictModel


class PairHealthSettings(StrictModel):
    #: a transfer slower than this (SGLang's kv_transfer_speed_gb_s, GB/s) is a bad sample
    min_kv_speed_gb_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    #: a transfer longer than this (SGLang's kv_transfer_latency_ms) is a bad sample
    max_kv_latency_ms: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    #: this many bad samples in a row degrade the pair
    bad_samples: Annotated[int, Field(ge=1, le=1000)] = 3
    #: this many failed KV transfers in a row degrade the pair
    max_transfer_failures: Annotated[int, Field(ge=1, le=1000)] = 3
    #: a degraded pair gets one probe request after this long (a good transfer returns it)
    probe_after_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 60.0
