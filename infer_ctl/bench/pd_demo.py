"""`inferctl demo --scenario pd-shift` (and scripts/bench_pd_shift.py): a workload whose mix shifts from long
prompts / short outputs to short prompts / long outputs, on 2 prefill + 2 decode simulated SGLang servers
launched with role switching, behind the inferctl router, with the PD balance controller acting (the same
loop as `inferctl pd control`, launch/pd_control.py).

The story: with long prompts the 2:2 split holds (the prefills keep up, nothing moves); once the outputs
grow, requests wait for a decode slot (the decodes' queues and TTFT grow, ITL barely: a decode's step reads
the weights whatever its batch), the controller sees the decode pool short for its dwell, drains one prefill
through the router, switches it to decode (SGLang's POST /pd_role_switch) and puts it back as a decode; TTFT
falls and goodput (requests meeting both objectives per second) rises. With `control="off"` the static
split runs the same workload, for the comparison.

Closed-loop streaming clients; TTFT and ITL as the client sees them (wall seconds; the simulator runs at
`time_scale` wall seconds per model second).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from infer_ctl.launch.pd_control import PdControlLoop
from infer_ctl.launch.pd_switch import RoleSwitcher
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.router.control.client import AdminClient
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread

_WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho"]


@dataclass
class PdShiftOptions:
    control: str = "act"  # act | off
    phase1_s: float = 3.0
    phase2_s: float = 8.0
    #: with the controller: phase 2 runs on to `after_s` past the switch, up to `phase2_max_s` (a loaded
    #: machine delays the switch: the demo still shows the split after it)
    after_s: float = 3.0
    phase2_max_s: float = 12.0
    concurrency: int = 24
    time_scale: float = 0.1
    #: objectives in wall seconds (the client's view)
    ttft_slo_s: float = 1.5
    itl_slo_s: float = 0.05
    #: (prompt words, output tokens) of each phase
    phase1: tuple[int, int] = (3000, 4)
    phase2: tuple[int, int] = (100, 200)
    #: decode batch slots per server: the long-output phase fills them
    max_running_requests: int = 6
    seed: int = 0
    interval_s: float = 0.5


@dataclass
class Sample:
    phase: int
    start: float
    ttft: float | None
    itl: float | None
    ok: bool


@dataclass
class PdShiftOutcome:
    samples: list[Sample] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    shift_at: float = 0.0
    end_at: float = 0.0
    #: every switch done (seconds from the start, the role it moved to): a prefill-heavy first phase may move
    #: a decode to the prefill pool, which is right there and is not the switch the shift calls for
    switches: list[tuple[float, str]] = field(default_factory=list)
    #: the first switch toward decode done after the shift (the one the shift calls for)
    switch_done_at: float | None = None
    roles_before: dict[str, str] = field(default_factory=dict)
    roles_after: dict[str, str] = field(default_factory=dict)

    def summary(self, opts: PdShiftOptions) -> dict[str, Any]:
        def stats(ss: list[Sample], span: float) -> dict[str, Any]:
            good = [s for s in ss if s.ok and s.ttft is not None and s.ttft <= opts.ttft_slo_s
                    and (s.itl is None or s.itl <= opts.itl_slo_s)]
            ttfts = sorted(s.ttft for s in ss if s.ttft is not None)
            itls = sorted(s.itl for s in ss if s.itl is not None)
            return {"requests": len(ss), "failed": sum(not s.ok for s in ss), "missed": len(ss) - len(good),
                    "goodput_rps": round(len(good) / span, 2) if span > 0 else None,
                    "ttft_median_s": round(ttfts[len(ttfts) // 2], 3) if ttfts else None,
                    "itl_median_s": round(itls[len(itls) // 2], 5) if itls else None}

        p1 = [s for s in self.samples if s.phase == 1]
        p2 = [s for s in self.samples if s.phase == 2]
        out: dict[str, Any] = {"control": opts.control, "phase1": stats(p1, self.shift_at),
                               "phase2": stats(p2, self.end_at - self.shift_at),
                               "failed": sum(not s.ok for s in self.samples),
                               "roles_before": self.roles_before, "roles_after": self.roles_after,
                               "actions": self.actions,
                               "switches": [{"after_shift_s": round(t - self.shift_at, 2), "to_role": to}
                                            for t, to in self.switches]}
        if self.switch_done_at is not None:
            out["switch_after_shift_s"] = round(self.switch_done_at - self.shift_at, 2)
            after = [s for s in p2 if s.start >= self.switch_done_at]
            before = [s for s in p2 if s.start < self.switch_done_at]
            out["phase2_before_switch"] = stats(before, self.switch_done_at - self.shift_at)
            out["phase2_after_switch"] = stats(after, self.end_at - self.switch_done_at)
        return out


def _profile(opts: PdShiftOptions) -> Any:
    return validate_profile_data({
        "name": "pd-shift",
        "nodes": [{"name": "pf-01", "host": "127.0.0.1", "roles": ["prefill"]},
                  {"name": "dc-01", "host": "127.0.0.2", "roles": ["decode"]}],
        "models": {"target": {"path": "/m/llama-3.1-70b", "tp": 8}},
        "router": {"listen": "127.0.0.1:0", "health_interval_s": 0.2},
        "sglang": {"pd_role_switch": True},
        "pd": {"control": "act", "ttft_slo_s": opts.ttft_slo_s, "itl_slo_s": opts.itl_slo_s, "sustain_s": 1.0,
               "cooldown_s": 3.0, "min_requests": 5, "stale_s": 2.0, "drain_timeout_s": 10.0,
               "decode_cuda_graph_memory_gb": 4.0, "cover_failures": False},
    })


def _roles(url: str) -> dict[str, str]:
    return {w["url"]: w["role"] for w in httpx.get(url + "/admin/workers", timeout=5).json()["workers"]}


def run_pd_shift(opts: PdShiftOptions, log: Callable[[str], None] = lambda _m: None) -> PdShiftOutcome:
    base: dict[str, Any] = {"time_scale": opts.time_scale, "speculative": False, "enable_pd_role_switch": True,
                            "preset": "h100-llama-3.1-70b", "bootstrap_timeout_s": 30.0, "waiting_timeout_s": 30.0,
                            "max_running_requests": opts.max_running_requests}
    specs = [WorkerSpec("prefill", seed=opts.seed + i, **base) for i in range(2)]
    specs += [WorkerSpec("decode", seed=opts.seed + 2 + i, **base) for i in range(2)]
    cluster = start_cluster_in_thread(specs)
    out = PdShiftOutcome()
    logging.getLogger("infer_ctl.router").setLevel(logging.ERROR)  # the story is told by `log`, not its lines
    try:
        cfg = router_config(prefill=[(cluster.urls[i], cluster.workers[i].bootstrap_port) for i in range(2)],
                            decode=cluster.urls[2:], health_interval_s=0.2)
        with start_router_in_thread(cfg) as handle:
            out.roles_before = _roles(handle.url)
            log("2 prefill + 2 decode simulated servers (role switching on) behind the router")
            stop = threading.Event()
            ctl: threading.Thread | None = None
            t0 = time.monotonic()
            out.shift_at = opts.phase1_s
            out.end_at = opts.phase1_s + opts.phase2_s
            if opts.control == "act":
                prof = _profile(opts)
                client = AdminClient(handle.url, timeout=30)
                loop = PdControlLoop(prof, router_url=handle.url, mode="act", client=client,
                                     switcher=RoleSwitcher(client, decode_cuda_graph_memory_gb=4.0, drain_timeout_s=10))

                def on_records(recs: list[dict[str, Any]]) -> None:
                    for r in recs:
                        r["t_s"] = round(time.monotonic() - t0, 2)
                        out.actions.append(r)
                        log(f"t={r['t_s']:.1f}s controller {r['action']}: {r.get('reason', '')}")
                        if r["action"] != "switch" or not r.get("result", {}).get("ok"):
                            continue
                        done = time.monotonic() - t0
                        out.switches.append((done, r["to_role"]))
                        if r["to_role"] == "decode" and done >= out.shift_at and out.switch_done_at is None:
                            out.switch_done_at = done
                            out.end_at = max(out.end_at, min(out.switch_done_at + opts.after_s,
                                                             opts.phase1_s + opts.phase2_max_s))

                ctl = threading.Thread(target=loop.run, args=(opts.interval_s,),
                                       kwargs={"stop": stop.is_set, "on_records": on_records}, daemon=True)
                ctl.start()
            asyncio.run(_workload(handle.url, opts, out, t0, log))
            stop.set()
            if ctl is not None:
                ctl.join(30)
            out.roles_after = _roles(handle.url)
    finally:
        cluster.stop()
    return out


async def _workload(url: str, opts: PdShiftOptions, out: PdShiftOutcome, t0: float, log: Callable[[str], None]) -> None:
    rng = random.Random(opts.seed)
    log(f"phase 1: long prompts ({opts.phase1[0]} words), short outputs ({opts.phase1[1]} tokens)")

    async def client(cl: httpx.AsyncClient) -> None:
        shifted = False
        while (now := time.monotonic() - t0) < out.end_at:
            phase = 1 if now < out.shift_at else 2
            if phase == 2 and not shifted:
                shifted = True
            n_in, n_out = opts.phase1 if phase == 1 else opts.phase2
            text = " ".join(rng.choice(_WORDS) for _ in range(n_in))
            start, first, last, gaps, ok = time.monotonic(), None, None, [], False
            try:
                async with cl.stream("POST", url + "/generate", json={
                        "text": text, "stream": True, "sampling_params": {"max_new_tokens": n_out}}) as r:
                    async for _chunk in r.aiter_bytes():
                        t = time.monotonic()
                        if first is None:
                            first = t
                        else:
                            assert last is not None
                            gaps.append(t - last)
                        last = t
                    ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            out.samples.append(Sample(phase, start - t0, None if first is None else first - start,
                                      sum(gaps) / len(gaps) if gaps else None, ok))

    async def announce() -> None:
        await asyncio.sleep(max(0.0, out.shift_at - (time.monotonic() - t0)))
        log(f"t={out.shift_at:.1f}s phase 2: the mix shifts to short prompts ({opts.phase2[0]} words), long outputs "
            f"({opts.phase2[1]} tokens)")

    async with httpx.AsyncClient(timeout=120) as cl:
        await asyncio.gather(announce(), *(client(cl) for _ in range(opts.concurrency)))
