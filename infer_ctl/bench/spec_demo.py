"""`inferctl demo --scenario spec-drift`: a workload whose domain shifts mid-run, on the simulated cluster
of a profile behind the inferctl router, with the speculative controller watching.

The story: both decode pools run EAGLE3 at 3 steps with a draft costing c = 0.2 of a target step.
dc-01's draft is a general one; dc-02's was tuned on code. Phase 1 sends code requests: both accept
~0.88. Then the traffic shifts to creative writing: dc-01 still accepts 0.75, dc-02 only 0.30, below
the break-even of 3 steps (speculation is now slower than none there). The router measures it per
decode (router/observe/spec_stats.py), `check spec`'s judgement flags it (FAIL/WARN with the recommended gamma),
and the controller (launch/spec_control.py: the same loop as `inferctl spec control`)
- with `control: act` relaunches ONLY dc-02 with the recommended lookahead: drained from the router
  first (no request in flight is dropped), restarted as a simulated worker with the new steps, put
  back; phase 3 sends the same creative traffic again and the throughput recovers;
- with `advise` prints the profile change and the command instead;
- with `off` only the alert and the recommendation are shown.

Throughput is measured over windows of steady closed-loop, non-streaming traffic (which is also what
"drops no request" is counted on): in model time (tokens the decodes generated / (wall seconds / time
scale)), for the cluster and per decode, and, immune to CPU contention, as tokens per target-step time
per decode (accept length / (1 + steps x c), from the router's counts).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from infer_ctl.core.spec.adaptive import adaptive_config
from infer_ctl.core.spec.controller import PoolChange
from infer_ctl.core.spec.judge import acceptance_finding, assess
from infer_ctl.core.spec.pools import Pool, pools
from infer_ctl.errors import InferctlError
from infer_ctl.launch.spec_control import ActionResult, SpecControlLoop
from infer_ctl.profile import Profile
from infer_ctl.sim.cluster import ThreadedSimCluster, start_cluster_in_thread
from infer_ctl.sim.from_profile import specs_from_profile
from infer_ctl.sim.server import SimWorker
from infer_ctl.sim.spec_workload import SpecWorkload

CONTROLS = ("off", "advise", "act")
#: the draft's cost ratio in the scenario (a heavier draft than EAGLE3's ~0.1 makes the lookahead matter)
COST_RATIO = 0.2
GENERAL_DRAFT = {"creative": 0.75}
CODE_TUNED_DRAFT = {"creative": 0.30}
_WORDS = ["once", "upon", "a", "time", "the", "cluster", "dreamed", "of", "tokens", "flowing", "through", "the", "fabric", "like", "a", "river", "of", "light", "while", "the", "router", "hummed", "an", "old", "song", "about", "caches", "and", "queues"]


@dataclass
class SpecDemoOptions:
    control: str = "act"
    requests: int = 96  # answers per measured window
    #: small enough that the simulated workers never fall behind their modelled time on 2 busy cores
    #: (a starved simulator stretches model time and hides the effect being shown)
    concurrency: int = 8
    max_new_tokens: int = 64
    time_scale: float = 0.25
    seed: int = 0
    #: how the printed `apply with:` command names the profile: the one the demo was given
    profile_ref: str = "builtin:local"


@dataclass
class Phase:
    name: str
    domain: str
    requests: int
    ok: int
    failed: int
    wall_s: float
    #: output tokens of the answers that finished in the window
    output_tokens: int
    #: output tokens the decodes generated per model second in the window
    throughput: float
    #: per decode URL: output tokens per model second of that worker in this phase
    per_decode: dict[str, float] = field(default_factory=dict)
    #: per decode URL: the router's window after the phase (alpha, accept length, rate, steps)
    acceptance: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per decode URL: tokens per target-step time, accept length / (1 + steps x c): the decode's modelled
    #: throughput relative to the target alone, from counts only (no wall clock: CPU contention on a
    #: shared machine cannot move it)
    step_throughput: dict[str, float] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class SpecDemoOutcome:
    control: str
    phases: list[Phase]
    actions: list[dict[str, Any]]
    #: requests that failed while the controller relaunched a pool (must be 0)
    failed_during_change: int
    ok_during_change: int
    decodes: dict[str, str]  # url -> pool
    #: requests that failed in the whole run (must be 0)
    failed_total: int = 0

    @property
    def speedup(self) -> float | None:
        """Throughput of phase 3 (after the change) over phase 2 (drifted, before it)."""
        if len(self.phases) < 3 or not self.phases[1].throughput:
            return None
        return self.phases[2].throughput / self.phases[1].throughput

    def as_dict(self) -> dict[str, Any]:
        return {"control": self.control, "phases": [p.as_dict() for p in self.phases], "actions": self.actions,
                "failed_during_change": self.failed_during_change, "ok_during_change": self.ok_during_change,
                "throughput_after_over_before": self.speedup, "decodes": self.decodes,
                "failed_total": self.failed_total}


def demo_profile(profile: Profile, control: str) -> Profile:
    """The profile with the scenario's controller settings: short windows and timers for a demo run of a
    few seconds (production defaults: 200 requests, 120 s sustain, 900 s cool-down)."""
    spec = profile.speculative.model_copy(update={
        "control": control, "cost_ratio": COST_RATIO, "window_requests": 40, "min_requests": 20,
        "sustain_s": 0.2, "cooldown_s": 600.0, "hysteresis": 0.05, "min_gain": 1.02, "alert_threshold": 0.5})
    return profile.model_copy(update={"speculative": spec}).with_base_dir(profile.base_dir)


class SimRelauncher:
    """The demo's actuator: what `launch --rolling` does on a real cluster, on simulated workers - each
    decode of the pool, one at a time: drained from the router (in-flight requests finish), removed,
    restarted with the new speculative settings (same port; its workload and drift kept), put back
    once healthy."""

    def __init__(self, cluster: ThreadedSimCluster, router_url: str, nodes_to_urls: dict[str, str]) -> None:
        self.cluster = cluster
        self.router_url = router_url
        self.nodes_to_urls = nodes_to_urls

    def apply(self, pool: Pool, change: PoolChange) -> ActionResult:
        restarted = []
        with httpx.Client(timeout=60, trust_env=False) as http:
            for node in pool.nodes:
                url = self.nodes_to_urls[node]
                i = next(k for k, w in enumerate(self.cluster.workers) if w.url == url)
                drained = http.post(self.router_url + "/admin/workers/drain", json={"url": url, "timeout_s": 30}).json()
                http.post(self.router_url + "/admin/workers/remove", json={"url": url}).raise_for_status()
                self.cluster.call(self._restart(i, change))
                http.post(self.router_url + "/admin/workers", json={"url": url, "role": "decode"}).raise_for_status()
                deadline = time.monotonic() + 30
                while not any(w["url"] == url and w["healthy"] for w in
                              http.get(self.router_url + "/admin/workers").json()["workers"]):
                    if time.monotonic() > deadline:
                        return ActionResult(False, f"{url} did not come back healthy")
                    time.sleep(0.05)
                restarted.append(f"{node} ({'drained' if drained.get('drained') else 'drain timed out'})")
        steps = f"{change.num_steps} steps" + (f", adaptive among {list(change.adaptive_steps)}"
                                               if change.adaptive_steps else "")
        return ActionResult(True, f"relaunched {', '.join(restarted)} one at a time with {steps}",
                            {"restarted": restarted})

    async def _restart(self, i: int, change: PoolChange) -> None:
        old = self.cluster.workers[i]
        cands = change.adaptive_steps
        spec = dataclasses.replace(
            old.spec, port=old.port, spec_gamma=change.num_steps, spec_adaptive=bool(cands),
            spec_adaptive_config=adaptive_config(cands) if cands else None)
        await old.stop()
        worker = SimWorker(spec)
        await worker.start()
        self.cluster.workers[i] = worker


class Traffic:
    """Closed-loop non-streaming load in its own thread (`concurrency` clients), labelled with the current
    domain; every answer is recorded with its completion time, so throughput is read over windows of
    steady state (no start-up or tail effects in the comparison)."""

    def __init__(self, url: str, opts: SpecDemoOptions) -> None:
        self.url = url
        self.opts = opts
        self.domain = "code"
        self.done: list[tuple[float, int, bool, str]] = []  # (monotonic time, output tokens, ok, domain)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    def count(self, domain: str | None = None, since: float = 0.0) -> int:
        return sum(1 for t, _, _, d in list(self.done) if t >= since and (domain is None or d == domain))

    def wait_for(self, n: int, domain: str | None = None, since: float = 0.0, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.count(domain, since) < n and time.monotonic() < deadline:
            time.sleep(0.02)

    def window(self, t0: float, t1: float) -> tuple[int, int, int]:
        """(ok, failed, output tokens) of the answers completed in [t0, t1)."""
        rows = [r for r in list(self.done) if t0 <= r[0] < t1]
        return sum(r[2] for r in rows), sum(not r[2] for r in rows), sum(r[1] for r in rows)

    async def _main(self) -> None:
        async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
            await asyncio.gather(*(self._client(client, k) for k in range(self.opts.concurrency)))

    async def _client(self, client: httpx.AsyncClient, k: int) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            domain = self.domain
            words = " ".join(_WORDS[(self.opts.seed + k * 7 + i + j) % len(_WORDS)] for j in range(24))
            body = {"text": f"[{domain} {k}-{i}] {words}", "custom_labels": {"domain": domain},
                    "sampling_params": {"max_new_tokens": self.opts.max_new_tokens, "ignore_eos": True}}
            try:
                r = await client.post(self.url + "/generate", json=body)
                ok = r.status_code == 200
                tokens = int(r.json()["meta_info"]["completion_tokens"]) if ok else 0
            except (httpx.HTTPError, ValueError, KeyError):
                ok, tokens = False, 0
            self.done.append((time.monotonic(), tokens, ok, domain))


def _generated(urls: list[str]) -> dict[str, float]:
    out = {}
    with httpx.Client(timeout=10, trust_env=False) as http:
        for u in urls:
            for line in http.get(u + "/metrics").text.splitlines():
                if line.startswith("sglang:generation_tokens_total"):
                    out[u] = float(line.rsplit(" ", 1)[1])
    return out


def _acceptance(router_url: str) -> dict[str, dict[str, Any]]:
    doc = httpx.get(router_url + "/admin/spec", timeout=10, trust_env=False).json()
    return {d["url"]: {**d["window"], "num_steps": d["num_steps"], "adaptive": d["adaptive"]} for d in doc["decodes"]}


def _judge(profile: Profile, acc: dict[str, dict[str, Any]], url_to_node: dict[str, str]) -> list[dict[str, Any]]:
    """`check spec`'s judgement of each decode (core/spec/judge.py), as the router measured it."""
    by_node = {n: p for p in pools(profile) for n in p.nodes}
    out = []
    for url, w in acc.items():
        node = url_to_node.get(url, url)
        pool = by_node.get(node)
        if pool is None or w.get("alpha") is None or not w.get("num_steps"):
            continue
        f = acceptance_finding(node, f"{node}-decode", assess(w["alpha"], w["num_steps"], pool.limits),
                               requests=int(w["requests"]))
        out.append({"node": node, "status": f.status.value, "message": f.message, "remedy": f.remedy})
    return out


def run_spec_demo(profile: Profile, opts: SpecDemoOptions, log: Callable[[str], None] = lambda _m: None
                  ) -> SpecDemoOutcome:
    if opts.control not in CONTROLS:
        raise InferctlError(f"unknown control {opts.control!r}", remedy=f"use one of {', '.join(CONTROLS)}",
                            exit_code=64)
    prof = demo_profile(profile, opts.control)
    specs = specs_from_profile(prof, time_scale=opts.time_scale, seed=opts.seed, spec_cost_ratio=COST_RATIO,
                               spec_gamma=3)
    decodes = [s for s in specs if s.role == "decode"]
    if len(decodes) < 2:
        raise InferctlError(f"profile {profile.name!r} has {len(decodes)} decode(s); the scenario needs two",
                            remedy="use --profile builtin:local", exit_code=64)
    for k, s in enumerate(decodes):  # dc-01: a general draft; the others: drafts tuned on code
        s.spec_workload = SpecWorkload(domains=dict(GENERAL_DRAFT if k == 0 else CODE_TUNED_DRAFT))
    cluster = start_cluster_in_thread(specs, port_fallback=True)
    from infer_ctl.router.daemon.embed import router_config, start_router_in_thread

    try:
        pre = cluster.by_role("prefill")
        dec = cluster.by_role("decode")
        router = start_router_in_thread(router_config(
            prefill=[(w.url, w.bootstrap_port) for w in pre], decode=[w.url for w in dec], profile=prof,
            listen="127.0.0.1:0", health_interval_s=0.2))
        try:
            return _scenario(prof, opts, cluster, router.url, log)
        finally:
            router.stop()
    finally:
        cluster.stop()


def _scenario(prof: Profile, opts: SpecDemoOptions, cluster: ThreadedSimCluster, router_url: str,
              log: Callable[[str], None]) -> SpecDemoOutcome:
    decode_nodes = [n.name for n in prof.nodes if n.has_role("decode")]
    dec_urls = [w.url for w in cluster.by_role("decode")]
    url_to_node = dict(zip(dec_urls, decode_nodes, strict=False))
    pool_names = {n: p.name for p in pools(prof) for n in p.nodes}
    url_to_pool = {u: pool_names[n] for u, n in url_to_node.items()}
    loop = SpecControlLoop(prof, router_url=router_url, mode="act" if opts.control == "act" else "advise",
                           url_to_pool=url_to_pool, profile_ref=opts.profile_ref,
                           actuator=SimRelauncher(cluster, router_url, {n: u for u, n in url_to_node.items()}))
    phases: list[Phase] = []
    actions: list[dict[str, Any]] = []
    traffic = Traffic(router_url, opts)
    n = opts.requests

    def measure(name: str, domain: str) -> Phase:
        """A window of `n` answers of steady closed-loop traffic."""
        t0, g0 = time.monotonic(), _generated(dec_urls)
        traffic.wait_for(n, since=t0)
        t1, g1 = time.monotonic(), _generated(dec_urls)
        ok, failed, tokens = traffic.window(t0, t1)
        model_s = (t1 - t0) / opts.time_scale
        acc = _acceptance(router_url)
        per = {u: (g1.get(u, 0.0) - g0.get(u, 0.0)) / model_s for u in dec_urls}
        # tokens the decodes generated in the window (smoother than the answers that happened to finish)
        c = prof.speculative.cost_ratio or COST_RATIO
        steps_tp = {u: w["accept_length"] / (1 + w["num_steps"] * c) for u, w in acc.items()
                    if w.get("accept_length") and w.get("num_steps")}
        p = Phase(name, domain, ok + failed, ok, failed, t1 - t0, tokens, sum(per.values()), per_decode=per,
                  acceptance=acc, step_throughput=steps_tp, findings=_judge(prof, acc, url_to_node))
        log(f"{name}: {ok} ok, {failed} failed, {p.throughput:,.0f} output tok/s (model); "
            + "; ".join(f"{url_to_node.get(u, u)}: alpha {w.get('alpha')} at {w.get('num_steps')} steps, "
                        f"{p.per_decode.get(u, 0):,.0f} tok/s, {steps_tp.get(u, 0):.2f} tok/target step"
                        for u, w in acc.items()))
        for f in p.findings:
            if f["status"] != "ok":
                log(f"check spec {f['status'].upper()} {f['node']}: {f['message']}; {f['remedy']}")
        return p

    def tick_until(kinds: tuple[str, ...], timeout_s: float = 20.0) -> None:
        """Rounds of the controller (every 0.1 s) until it did one of `kinds`: its sustain timer runs."""
        deadline = time.monotonic() + timeout_s
        while not any(a["action"] in kinds for a in actions) and time.monotonic() < deadline:
            for r in loop.tick():
                log(f"controller {r['action']} {r['pool']}: {r.get('message', '')}")
                if r.get("profile_change") and r["action"] == "advise":
                    log("profile change:\n" + r["profile_change"].rstrip() + f"\napply with: {r['command']}")
                actions.append(r)
            time.sleep(0.1)

    failed_during = ok_during = 0
    traffic.start()
    try:
        traffic.wait_for(opts.concurrency)  # warm-up: every client has had an answer
        phases.append(measure("1 code", "code"))
        traffic.domain = "creative"  # the workload's domain shifts
        shifted = time.monotonic()
        # every decode's window fills with the new domain's answers before it is measured
        traffic.wait_for(2 * prof.speculative.window_requests, "creative", shifted)
        phases.append(measure("2 creative, before the change", "creative"))
        if opts.control == "act":
            t0 = time.monotonic()
            tick_until(("relaunch", "failed"))  # alert, then the relaunch, while the traffic goes on
            ok_during, failed_during, _ = traffic.window(t0, time.monotonic())
            t1 = time.monotonic()
            traffic.wait_for(opts.concurrency, since=t1)  # the changed pool takes traffic again
            phases.append(measure("3 creative, after the change", "creative"))
        elif opts.control == "advise":
            tick_until(("advise",))
    finally:
        traffic.stop()
    failed_total = sum(1 for r in traffic.done if not r[2])
    return SpecDemoOutcome(opts.control, phases, actions, failed_during, ok_during, url_to_pool, failed_total)
