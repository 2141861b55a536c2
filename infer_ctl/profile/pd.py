"""`pd:` the prefill:decode balance in operation (docs/pd-control.md): the controller that moves one server
between the pools with SGLang's runtime role switch (`sglang.pd_role_switch`), and its limits.

The controller judges each pool by the objective it serves: the prefill pool by TTFT, the decode pool by
ITL, both as the router measures them, against `ttft_slo_s` / `itl_slo_s` (a pressure of 1.0 is the
objective met exactly). The cross-field rules (`act` needs the role switch and a router) are in
profile.py with the other rules spanning sections.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from infer_ctl.profile.base import StrictModel

#: finite: an infinite dwell or cool-down silently disables the controller
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class PdControlSettings(StrictModel):
    #: off: `inferctl pd control` refuses to run; advise: say which server would move and why; act: move it
    control: Literal["off", "advise", "act"] = "off"
    #: the objectives the pools are judged by (router-measured, streamed requests)
    ttft_slo_s: Positive = 2.0
    itl_slo_s: Positive = 0.05
    #: a server moves only while the short pool's pressure is at least this (1.0: it misses its objective)
    trigger: Positive = 1.0
    #: the short pool's pressure must exceed the donor's, as it would be with one server less, by this factor
    #: (1 + hysteresis): a split that is about right is left alone, and a move is not undone by the next round
    hysteresis: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)] = 0.25
    #: the shifted mix must hold this long (the minimum dwell) before a server moves
    sustain_s: Seconds = 10.0
    #: after a switch (done or failed) no other for this long
    cooldown_s: Seconds = 30.0
    #: streamed requests a round's window must hold before the pressures are believed
    min_requests: Annotated[int, Field(ge=1)] = 10
    #: the router's view is stale when a worker's load was last polled longer ago than this: nothing moves
    stale_s: Positive = 10.0
    #: every pool keeps at least this many available servers
    min_servers: Annotated[int, Field(ge=1)] = 1
    #: SGLang needs it for a first switch to decode (the decode CUDA graphs' memory); None: not sent
    decode_cuda_graph_memory_gb: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    #: how long the drain through the router may take before the switch is given up (the server put back)
    drain_timeout_s: Positive = 60.0
    #: requests waiting per server (as the workers report them) that count as a pressure of 1.0
    queue_target: Positive = 4.0
    #: a dead server's pool may borrow a server of the other pool while it relaunches (issue 30 item 4)
    cover_failures: bool = True
