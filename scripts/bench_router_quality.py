#!/usr/bin/env python3
"""Routing quality under cache pressure: inferctl's router vs sglang-router 0.3.2, side by side.

Every part runs in its own process: each simulated worker (`inferctl sim serve`, one worker per
process, KV events on), the router (`inferctl router serve` or `python -m sglang_router.launch_router`)
and the load generator (this script re-run as `_loadgen`). Every variant gets fresh workers (empty
caches) and the same seeded workload. Scenarios (docs/benchmarks.md, "Routing quality"):

- `steady`: collocated workers; sglang-router in regular mode (`--worker-urls ... --policy
  cache_aware`, where its cache_aware works), at 4 and at 8 characters per token (`--cpt`).
- `stale` (cache `--stale-cache-tokens` per worker): worker 1 is killed and restarted a third into the
  run (empty cache), tenant popularity shifts (the Zipf ranking is rotated for the second half of the
  sessions), and half of every tenant's sessions reach the workers another way (`--stale`): `replica`,
  through a second independent instance of the same router; `random`, straight to a random worker;
  `sticky`, to a per-tenant hash of the workers (another frontend with its own affinity). Hit rate and
  TTFT are of the routed requests.
- `two-routers`: two `inferctl router serve` on different ports over the same workers, sessions split
  between them (both subscribe to the workers' KV events); compared with the one-router steady run.
- `pd`: 2 prefill + 2 decode workers, sglang-router with `--pd-disaggregation`.

Workload: tenants with long system prompts (Zipf popularity; their prompts together do not fit on one
worker), multi-turn sessions under them (each turn resends the conversation), text of exactly `cpt`
characters per token for the simulator's tokenizer (words of cpt-1 letters, each with its leading space).
Ceiling: the hit rate of one infinite cache that has seen every earlier request (only each tenant's
first request misses its system prompt), computed with the simulator's own tokenizer.

TTFT: one TCP connection per request (the client closes it after each response), so no kept-alive
connection can hold a streamed chunk (sglang-router 0.3.2 holds the first chunk ~40 ms on a kept-alive
connection: Nagle on its side meeting the client's delayed ACK). `--keep-alive` turns that off, for
showing it. Latencies are modelled seconds: wall / `--time-scale` (default 1.0, so a wall stall is not
magnified).

    python scripts/bench_router_quality.py [--scenario steady,stale,two-routers,pd|all] [--requests 240]
        [--repeat 3] [--cpt 4,8] [--time-scale 1.0] [--stale replica,random] [--logs DIR] [--json]
        [--baseline] [--baseline-args '--miss-placement power_of_two' --baseline-label p2c]

docs/benchmarks.md ("Routing quality under cache pressure") records `--repeat 3 --time-scale 3` and the
steady scenario at `--time-scale 1`, each with the inferctl router at its default process count and at
`--processes 1`. Diagnosis: `--logs DIR` keeps every process's log (the inferctl
router's per-request decisions) and per-request results; BENCH_PROFILE=1 runs the router under cProfile,
BENCH_NO_KV=1 starts the workers without KV events, BENCH_POLICY sets both routers' policy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from servers import foreign_listeners, free_port, routes_ok  # noqa: E402

from infer_ctl.bench.workloads import BenchRequest, zipf_weights  # noqa: E402
from infer_ctl.core.kvevents.sim_tokenizer import BuiltinTokenizer  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


# ---- the workload ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    requests: int = 240
    seed: int = 1
    tenants: int = 24
    prefix_tokens: int = 1200
    turns: int = 3
    question_tokens: int = 48
    answer_tokens: int = 48
    max_new_tokens: int = 16
    zipf_s: float = 1.1
    #: characters per token of the text (each word is one token of the simulator's tokenizer)
    cpt: int = 4
    #: rotate the tenants' popularity ranking for the second half of the sessions
    shift: bool = False


def _vocab(rng: random.Random, cpt: int) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(max(1, cpt - 1))) for _ in range(400)]


def build_workload(w: Workload) -> list[BenchRequest]:
    """Sessions of `turns` requests in session order; request i of session s resends the tenant's system
    prompt and the conversation so far. Deterministic in `w`."""
    rng = random.Random(w.seed)
    vocab = _vocab(rng, w.cpt)

    def words(n: int) -> str:
        return " ".join(rng.choice(vocab) for _ in range(n))

    prefixes = [f"tenant{t} " + words(w.prefix_tokens) for t in range(w.tenants)]
    weights = zipf_weights(w.tenants, w.zipf_s)
    sessions = max(1, -(-w.requests // w.turns))
    out: list[BenchRequest] = []
    for s in range(sessions):
        ranking = list(range(w.tenants))
        if w.shift and s >= sessions // 2:
            ranking = ranking[w.tenants // 2:] + ranking[: w.tenants // 2]
        t = ranking[rng.choices(range(w.tenants), weights)[0]]
        history = prefixes[t]
        for turn in range(w.turns):
            if len(out) >= w.requests:
                break
            history = f"{history}\n\nsession{s} user {words(w.question_tokens)}"
            out.append(BenchRequest(index=len(out), tenant=f"tenant-{t:02d}", text=history,
                                    max_new_tokens=w.max_new_tokens, session=s, turn=turn))
            history = f"{history}\n\nassistant {words(w.answer_tokens)}"
    return out


def _prefix_hashes(text: str, tok: BuiltinTokenizer) -> list[int]:
    out, h = [], 0
    for i in tok.encode(text):
        h = hash((h, i))
        out.append(h)
    return out


def _longest(hs: list[int], seen: set[int]) -> int:
    lo, hi = 0, len(hs)  # `seen` is prefix-closed: binary search
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hs[mid - 1] in seen:
            lo = mid
        else:
            hi = mid - 1
    return min(lo, len(hs) - 1)


def reachable_tokens(reqs: list[BenchRequest], res: list[dict[str, Any]], scale: float) -> dict[int, int]:
    """Per request: what one infinite cache could have given it *as the run went*: the longest prefix
    shared with a request whose first token (its prefill done) came before this one started. Below the
    ceiling by what concurrency hides: requests of one new prefix that overlap each other's prefill."""
    tok = BuiltinTokenizer()
    hs = {r.index: _prefix_hashes(r.text, tok) for r in reqs}
    done = sorted((x["start"] + x["ttft"] * scale, x["index"]) for x in res if x["ok"] and x["ttft"] is not None)
    seen: set[int] = set()
    out: dict[int, int] = {}
    j = 0
    for x in sorted(res, key=lambda x: x["start"]):
        while j < len(done) and done[j][0] <= x["start"]:
            seen.update(hs[done[j][1]])
            j += 1
        out[x["index"]] = _longest(hs[x["index"]], seen)
    return out


def ceiling_tokens(reqs: list[BenchRequest]) -> list[tuple[int, int]]:
    """(prompt tokens, cacheable tokens) per request: the longest token prefix shared with any earlier
    request (an infinite cache that saw everything before it), at most all but the last token."""
    tok = BuiltinTokenizer()
    seen: set[int] = set()  # prefix-closed: hashes of every prefix of every earlier prompt
    out = []
    for r in reqs:
        hs = _prefix_hashes(r.text, tok)
        out.append((len(hs), _longest(hs, seen)))
        seen.update(hs)
    return out


# ---- processes ---------------------------------------------------------------------------------------
def _tree_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    # utime + stime of the process, cutime + cstime of its reaped children
    own = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return own + sum(_tree_cpu_s(int(k)) for k in kids)


class Proc:
    def __init__(self, name: str, cmd: list[str], logs: Path) -> None:
        self.name, self.cmd, self.logs = name, cmd, logs
        self.log = logs / f"{name}.log"
        self.p: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        f = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        self.p = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT, env=ENV, cwd=self.logs,
                                  start_new_session=True)
        f.close()

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the process and every descendant have used so far, reaped ones
        included. The whole tree: `inferctl router serve` with KV events on runs a supervisor and one
        router process per core (router/daemon/procs.py), and the supervisor alone is nearly idle."""
        return _tree_cpu_s(self.p.pid) if self.p is not None else 0.0

    def kill(self) -> None:
        if self.p is not None and self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(10)

    def stop(self) -> None:
        if self.p is not None and self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_ok(url: str, what: str, timeout: float = 60.0, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.p is not None and proc.p.poll() is not None:
            raise RuntimeError(f"{what} exited: see {proc.log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=5).status_code == 200:
                if proc is not None:
                    served_by(url, proc, what)
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready at {url} after {timeout:.0f} s")


def served_by(url: str, proc: Proc, what: str) -> None:
    """The server answering at `url` is `proc` (or its children) alone: another process that took the
    port (or listens beside it, SO_REUSEPORT) would be measured instead (scripts/servers.py). Raised as
    a start-up failure: `fleet` starts again on new ports."""
    assert proc.p is not None
    other = foreign_listeners(urlsplit(url).port or 0, proc.p.pid)
    if other is not None:
        proc.stop()
        raise RuntimeError(f"{url} answers, but not only {what} (pid {proc.p.pid}) listens there: {other}")


@dataclass
class Worker:
    role: str
    port: int
    kv_port: int
    replay_port: int
    seed: int
    bootstrap: int | None = None
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cmd(self, cfg: Config) -> list[str]:
        where = f"{self.role}@127.0.0.1:{self.port}" + (f"/{self.bootstrap}" if self.bootstrap else "")
        kv = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{self.kv_port}",
                         "replay_endpoint": f"tcp://*:{self.replay_port}"})
        out = [sys.executable, "-m", "infer_ctl", "sim", "serve", "--worker", where, "--seed", str(self.seed),
               "--time-scale", str(cfg.time_scale), "--no-spec"]
        if self.role != "decode":
            out += ["--cache-tokens", str(cfg.cache_tokens)]
            if not os.environ.get("BENCH_NO_KV"):  # diagnosis: the router on its predicted index alone
                out += ["--kv-events-config", kv]
        return out


@dataclass(frozen=True)
class Config:
    time_scale: float = 1.0
    cache_tokens: int = 9000
    workers: int = 4
    concurrency: int = 16
    keep_alive: bool = False
    #: how the stale scenario's bypass traffic picks a worker: sticky (per tenant) or random
    bypass: str = "sticky"
    #: the stale scenario's variants (STALE)
    stale_modes: tuple[str, ...] = ("replica", "random")
    #: the stale scenario's cache per worker (tighter: evictions are what make a view stale)
    stale_cache_tokens: int = 6000
    #: `router serve --processes` for the inferctl router (None: its default, the cores, at most 8)
    processes: int | None = None
    #: also run the inferctl router with `--no-coalesce` (the before of in-flight prefix coalescing)
    baseline: bool = False
    #: also run the inferctl router with these `router serve` arguments (`--baseline-args`), labelled
    baseline_args: tuple[str, ...] = ()
    baseline_label: str = "baseline"


@contextlib.contextmanager
def fleet(cfg: Config, logs: Path, pd: bool = False) -> Iterator[list[Worker]]:
    roles = ["prefill", "prefill", "decode", "decode"] if pd else ["mixed"] * cfg.workers
    for attempt in range(3):
        # a free port can be taken by another process before the worker binds it (a shared machine):
        # a worker that exits at start-up gets the whole fleet restarted on new ports, twice at most
        ws = [Worker(r, free_port(), free_port(), free_port(), i, free_port() if r == "prefill" else None)
              for i, r in enumerate(roles)]
        try:
            for i, w in enumerate(ws):
                w.proc = Proc(f"worker{i}-{w.role}", w.cmd(cfg), logs)
            for w in ws:
                wait_ok(w.url + "/health", f"worker {w.url}", proc=w.proc)
        except RuntimeError:
            for w in ws:
                if w.proc:
                    w.proc.stop()
            if attempt == 2:
                raise
            continue
        break
    try:
        yield ws
    finally:
        for w in ws:
            if w.proc:
                w.proc.stop()


def worker_stats(ws: list[Worker]) -> list[dict[str, float]]:
    """Per prefill-like worker, from its /metrics: requests, prompt and cached tokens, mean queue time
    (the load each one took; a restarted worker counts from its restart)."""
    out = []
    for w in ws:
        if w.role == "decode":
            continue
        vals: dict[str, float] = {}
        with contextlib.suppress(httpx.HTTPError):
            for line in httpx.get(w.url + "/metrics", timeout=5).text.splitlines():
                name, _, rest = line.partition("{")
                if name in ("sglang:num_requests_total", "sglang:prompt_tokens_total", "sglang:cached_tokens_total",
                            "sglang:queue_time_seconds_sum", "sglang:queue_time_seconds_count",
                            "sglang:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_count"):
                    vals[name.split(":")[1]] = float(rest.rpartition(" ")[2])
        n = vals.get("queue_time_seconds_count") or 0
        nt = vals.get("time_to_first_token_seconds_count") or 0
        out.append({"requests": vals.get("num_requests_total", 0), "prompt_tokens": vals.get("prompt_tokens_total", 0),
                    "cached_tokens": vals.get("cached_tokens_total", 0),
                    "queue_s_mean": round(vals.get("queue_time_seconds_sum", 0) / n, 4) if n else 0.0,
                    "ttft_s_mean": round(vals.get("time_to_first_token_seconds_sum", 0) / nt, 4) if nt else 0.0})
    return out


def restart(w: Worker, cfg: Config) -> None:
    """Kill a worker and start it again on the same ports: its cache is empty, its KV events restart."""
    assert w.proc is not None
    w.proc.kill()
    w.proc.start()
    wait_ok(w.url + "/health", f"restarted worker {w.url}", proc=w.proc)


def inferctl_router(ws: list[Worker], logs: Path, name: str = "inferctl", processes: int | None = None,
                    extra: list[str] | None = None) -> Proc:
    port = free_port()
    # BENCH_PROFILE=1: the router runs under cProfile (its profile lands next to its log)
    prof = ["-m", "cProfile", "-o", str(logs / f"{name}.prof")] if os.environ.get("BENCH_PROFILE") else []
    cmd = [sys.executable, *prof, "-m", "infer_ctl", "router", "serve", "--listen", f"127.0.0.1:{port}",
           "--policy", os.environ.get("BENCH_POLICY", "cache_aware"), "--log-requests"]
    if processes is not None:
        cmd += ["--processes", str(processes)]
    cmd += extra or []
    for w in ws:
        if w.role == "mixed":
            cmd += ["--mixed", w.url]
        elif w.role == "prefill":
            cmd += ["--prefill", f"{w.url} {w.bootstrap}"]
        else:
            cmd += ["--decode", w.url]
    p = Proc(name, cmd, logs)
    p.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    url = p.url  # type: ignore[attr-defined]
    wait_ok(url + "/health", "inferctl router", proc=p)
    # ready when every prefill-like worker's KV stream is exact (subscribed and in sync)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "cache_aware" in cmd and not os.environ.get("BENCH_NO_KV"):
        doc = httpx.get(url + "/admin/workers", timeout=5).json()
        idx = [w.get("index") for w in doc["workers"] if w.get("role") != "decode"]
        if idx and all(i == "exact" for i in idx):
            break
        time.sleep(0.2)
    if time.monotonic() >= deadline:
        p.stop()
        raise RuntimeError(f"inferctl router: KV streams not exact after 30 s: {idx}")
    # and every process up (the followers start after the leader), so no start-up is in the CPU measured
    while time.monotonic() < deadline + 30:
        seen = router_processes(p)
        if len(seen["answered"]) >= seen["processes"]:
            break
        time.sleep(0.3)
    return p


def router_processes(p: Proc) -> dict[str, Any]:
    """Which of the router's processes answer (`/health` `process`, asked on fresh connections until every
    process answered or 40 tries: SO_REUSEPORT spreads connections over them) and the leader's
    `/admin/status` `kv_events.first_sight` (anchoring of shallow prompts on the request path, within 5 %
    of a process's time): every process relays /admin/ to the leader, so the other processes' counters
    are not visible over HTTP."""
    seen: set[int] = set()
    n = 1
    for _ in range(40):
        with contextlib.suppress(httpx.HTTPError, ValueError):
            proc = httpx.get(p.url + "/health", timeout=5).json().get("process") or {}  # type: ignore[attr-defined]
            n = int(proc.get("processes") or 1)
            seen.add(int(proc.get("index") or 0))
        if len(seen) >= n:
            break
    first_sight = None
    with contextlib.suppress(httpx.HTTPError, ValueError):
        doc = httpx.get(p.url + "/admin/status", timeout=5).json()  # type: ignore[attr-defined]
        first_sight = (doc.get("kv_events") or {}).get("first_sight")
    return {"processes": n, "answered": sorted(seen), "leader_first_sight": first_sight}


def sglang_router(ws: list[Worker], logs: Path, name: str = "sglang-router") -> Proc:
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-port", str(free_port()), "--policy", os.environ.get("BENCH_POLICY", "cache_aware"), "--log-level", "info"]
    if any(w.role == "prefill" for w in ws):
        cmd.append("--pd-disaggregation")
        for w in ws:
            cmd += ["--prefill", w.url, str(w.bootstrap)] if w.role == "prefill" else ["--decode", w.url]
    else:
        cmd += ["--worker-urls", *[w.url for w in ws]]
    p = Proc(name, cmd, logs)
    p.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # ready when it routes (its /health answers before workers are in)
        if p.p is not None and p.p.poll() is not None:
            raise RuntimeError(f"sglang-router exited: see {p.log}")
        if routes_ok(p.url):  # type: ignore[attr-defined]
            served_by(p.url, p, "sglang-router")  # type: ignore[attr-defined]
            return p
        time.sleep(0.3)
    p.stop()
    raise RuntimeError(f"sglang-router not routing after 60 s: see {p.log}")


# ---- the load generator (its own process) ------------------------------------------------------------
async def _loadgen(plan: dict[str, Any]) -> list[dict[str, Any]]:
    import aiohttp

    from infer_ctl.bench.client import LoadSpec, send_one

    reqs = build_workload(Workload(**plan["workload"]))
    targets: list[str] = plan["targets"]
    bypass: list[str] = plan["bypass"]
    load = LoadSpec(time_scale=plan["time_scale"], timeout_s=300)
    rng = random.Random(plan["seed"])
    sessions: dict[int, list[BenchRequest]] = {}
    for r in reqs:
        sessions.setdefault(r.session or 0, []).append(r)
    # who sends each session: the routers in turn; with bypass, every other session of each tenant goes
    # straight to a random worker (sticky for the session), as another frontend would send it
    per_tenant: dict[str, int] = {}
    jobs: list[tuple[str, bool, list[BenchRequest]]] = []
    for _, rs in sorted(sessions.items()):
        tenant = rs[0].tenant
        # every other session of a tenant, starting with the router or with the bypass (a per-tenant phase)
        k = per_tenant[tenant] = per_tenant.get(tenant, zlib.crc32(tenant.encode()) % 2) + 1
        if bypass and k % 2 == 1:
            # sticky: another frontend with its own affinity (a hash of the tenant); random: clients
            # that call a worker directly
            url = (bypass[zlib.crc32(rs[0].tenant.encode()) % len(bypass)] if plan["bypass_mode"] == "sticky"
                   else rng.choice(bypass))
            jobs.append((url, False, rs))
        else:  # several routers (replicas): a tenant's sessions alternate between them too
            jobs.append((targets[(k // (2 if bypass else 1)) % len(targets)], True, rs))
    out: list[dict[str, Any]] = []
    progress = Path(plan["progress"])
    connector = aiohttp.TCPConnector(limit=0, force_close=not plan["keep_alive"])
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        loop = asyncio.get_running_loop()
        t_run = loop.time()
        queue = list(reversed(jobs))

        async def worker() -> None:
            while queue:
                url, routed, rs = queue.pop()
                for r in rs:
                    # the router's `--log-requests` line carries it as its rid: per-request decisions join the results
                    res = await send_one(session, url, r, load, t_run, {"x-request-id": f"bench-{r.index}"})
                    out.append({"index": r.index, "tenant": r.tenant, "session": r.session, "routed": routed,
                                "url": url, "ok": res.ok, "ttft": res.ttft, "prompt_tokens": res.prompt_tokens,
                                "cached_tokens": res.cached_tokens, "error": res.error, "start": res.start})
                    progress.write_text(str(len(out)))

        await asyncio.gather(*(worker() for _ in range(plan["concurrency"])))
    return out


def loadgen_main(plan_path: str, out_path: str) -> None:
    plan = json.loads(Path(plan_path).read_text())
    try:
        import uvloop

        res = uvloop.run(_loadgen(plan))
    except ImportError:  # pragma: no cover
        res = asyncio.run(_loadgen(plan))
    Path(out_path).write_text(json.dumps(res))


def run_load(cfg: Config, logs: Path, name: str, wl: Workload, targets: list[str], bypass: list[str] | None = None,
             midway: Any = None) -> list[dict[str, Any]]:
    plan: dict[str, Any] = {"workload": asdict(wl), "targets": targets, "bypass": bypass or [], "seed": wl.seed,
            "bypass_mode": cfg.bypass,
            "time_scale": cfg.time_scale, "concurrency": cfg.concurrency, "keep_alive": cfg.keep_alive,
            "progress": str(logs / f"{name}.progress")}
    plan_path, out_path = logs / f"{name}.plan.json", logs / f"{name}.results.json"
    plan_path.write_text(json.dumps(plan))
    Path(plan["progress"]).write_text("0")
    p = subprocess.Popen([sys.executable, __file__, "_loadgen", str(plan_path), str(out_path)], env=ENV)
    fired = midway is None
    while p.poll() is None:
        time.sleep(0.1)
        if not fired:
            with contextlib.suppress(ValueError):
                if int(Path(plan["progress"]).read_text() or 0) >= wl.requests // 3:
                    fired = True
                    midway()
    if p.returncode != 0:
        raise RuntimeError(f"load generator failed ({p.returncode})")
    return list(json.loads(out_path.read_text()))


# ---- one variant -------------------------------------------------------------------------------------
def summarize(name: str, res: list[dict[str, Any]], ceil: list[tuple[int, int]], load: tuple[float, float],
              reach: dict[int, int]) -> dict[str, Any]:
    routed = [r for r in res if r["routed"]]
    ok = [r for r in routed if r["ok"]]
    r_cached = sum(reach[r["index"]] for r in ok)
    prompt = sum(r["prompt_tokens"] for r in ok)
    cached = sum(r["cached_tokens"] for r in ok)
    c_prompt = sum(ceil[r["index"]][0] for r in ok)
    c_cached = sum(ceil[r["index"]][1] for r in ok)
    ttfts = sorted(r["ttft"] for r in ok)
    return {"variant": name, "routed": len(routed), "failed": len(routed) - len(ok),
            "hit_rate": cached / prompt if prompt else 0.0, "ceiling": c_cached / c_prompt if c_prompt else 0.0,
            "reachable": r_cached / c_prompt if c_prompt else 0.0,
            "ttft_mean_s": statistics.fmean(ttfts) if ttfts else float("nan"),
            "ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else float("nan"),
            "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else float("nan"),
            "load_avg": [round(load[0], 2), round(load[1], 2)]}


def variant(cfg: Config, logs: Path, name: str, wl: Workload, router: str, *, pd: bool = False,
            stale: str | None = None, routers: int = 1, extra: list[str] | None = None) -> dict[str, Any]:
    """One variant on a fresh fleet. `stale`: restart worker 1 a third into the run, and send half of
    every tenant's sessions past the router ("sticky"/"random": bypass as `Config.bypass`; "replica":
    through a second, independent instance of the same router)."""
    if stale:
        cfg = replace(cfg, cache_tokens=cfg.stale_cache_tokens)
        routers = 2 if stale == "replica" else routers
    d = logs / name.replace(" ", "_").replace("/", "_")
    d.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    reqs = build_workload(wl)
    ceil = ceiling_tokens(reqs)
    with fleet(cfg, d, pd) as ws:
        fronts: list[Proc] = []
        try:
            for i in range(routers):
                fronts.append(inferctl_router(ws, d, f"inferctl{i}", cfg.processes,
                                              ["--no-coalesce"] if router == "inferctl-off" else extra)
                              if router.startswith("inferctl") else sglang_router(ws, d, f"sglang-router{i}"))
            targets = [f.url for f in fronts]  # type: ignore[attr-defined]
            prefill_like = [w for w in ws if w.role != "decode"]
            midway = (lambda: restart(prefill_like[1], cfg)) if stale else None
            cpu0 = sum(f.cpu_s() for f in fronts)
            bypass = [w.url for w in prefill_like] if stale in ("sticky", "random") else None
            res = run_load(replace(cfg, bypass=stale or cfg.bypass), d, "load", wl, targets, bypass, midway)
            cpu = sum(f.cpu_s() for f in fronts) - cpu0
            stats = worker_stats(ws)
            procs = [router_processes(f) for f in fronts] if router.startswith("inferctl") else []
        finally:
            for f in fronts:
                f.stop()
    out = summarize(name, res, ceil, (load0, os.getloadavg()[0]), reachable_tokens(reqs, res, cfg.time_scale))
    out["logs"] = str(d)
    out["workers"] = stats
    if procs:
        out["router_processes"] = procs
    out["router_cpu_ms_per_request"] = round(1000 * cpu / max(1, sum(r["routed"] for r in res)), 2)
    errors = [r["error"] for r in res if r["routed"] and not r["ok"]]
    if errors:
        out["first_error"] = errors[0]
    return out


STALE = {"replica": "restart + popularity shift + half of each tenant's sessions through a second replica",
         "sticky": "restart + popularity shift + half of each tenant's sessions through a per-tenant hash frontend",
         "random": "restart + popularity shift + half of each tenant's sessions straight to a random worker"}


# ---- scenarios ---------------------------------------------------------------------------------------
def scenarios(names: list[str], cfg: Config, logs: Path, wl: Workload, cpts: list[int]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    one_router: dict[str, Any] | None = None
    if "steady" in names:
        for cpt in cpts:
            w = replace(wl, cpt=cpt)
            rows = [variant(cfg, logs, f"inferctl cpt{cpt}", w, "inferctl"),
                    variant(cfg, logs, f"sglang-router cpt{cpt}", w, "sglang")]
            if cfg.baseline:
                rows.append(variant(cfg, logs, f"inferctl no-coalesce cpt{cpt}", w, "inferctl-off"))
            if cfg.baseline_args:
                rows.append(variant(cfg, logs, f"inferctl {cfg.baseline_label} cpt{cpt}", w, "inferctl",
                                    extra=list(cfg.baseline_args)))
            out[f"steady, collocated, {cpt} chars/token"] = rows
            if cpt == cpts[0]:
                one_router = rows[0]
    if "stale" in names:
        w = replace(wl, cpt=cpts[0], shift=True)
        for mode in cfg.stale_modes:
            out[f"stale ({STALE[mode]})"] = [
                variant(cfg, logs, f"inferctl stale-{mode}", w, "inferctl", stale=mode),
                variant(cfg, logs, f"sglang-router stale-{mode}", w, "sglang", stale=mode)]
            if cfg.baseline:
                out[f"stale ({STALE[mode]})"].append(
                    variant(cfg, logs, f"inferctl no-coalesce stale-{mode}", w, "inferctl-off", stale=mode))
            if cfg.baseline_args:
                out[f"stale ({STALE[mode]})"].append(
                    variant(cfg, logs, f"inferctl {cfg.baseline_label} stale-{mode}", w, "inferctl", stale=mode,
                            extra=list(cfg.baseline_args)))
    if "two-routers" in names:
        w = replace(wl, cpt=cpts[0])
        rows = [variant(cfg, logs, "inferctl x2", w, "inferctl", routers=2)]
        rows.insert(0, one_router or variant(cfg, logs, "inferctl x1", w, "inferctl"))
        out["two inferctl routers vs one"] = rows
    if "pd" in names:
        w = replace(wl, cpt=cpts[0])
        out["PD: 2 prefill + 2 decode"] = [variant(cfg, logs, "inferctl pd", w, "inferctl", pd=True),
                                            variant(cfg, logs, "sglang-router pd", w, "sglang", pd=True)]
    return out


def ratios(rows: list[dict[str, Any]], first: int = 0) -> dict[str, float]:
    """Row `first` against the peer (row 1): hit-rate points, share of the peer's headroom closed, TTFT x."""
    a, b = rows[first], rows[1]
    head = b["ceiling"] - b["hit_rate"]
    return {"points": 100 * (a["hit_rate"] - b["hit_rate"]),
            "headroom_closed": (a["hit_rate"] - b["hit_rate"]) / head if head > 1e-9 else float("nan"),
            "ttft_mean_x": a["ttft_mean_s"] / b["ttft_mean_s"], "ttft_p99_x": a["ttft_p99_s"] / b["ttft_p99_s"]}


def _median(values: list[float]) -> float:
    """The median of the runs that have a value: a headroom is undefined (nan) in a run where the peer
    reached the ceiling, and statistics.median would sort a nan among the numbers."""
    known = [v for v in values if not math.isnan(v)]
    return statistics.median(known) if known else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default="all", help="comma list of steady, stale, two-routers, pd; or all")
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cpt", default="4,8", help="characters per token of the text, comma list")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--cache-tokens", type=int, default=9000)
    ap.add_argument("--stale-cache-tokens", type=int, default=6000)
    ap.add_argument("--stale", default="replica,random",
                    help="stale scenario's other frontends, comma list of replica, sticky, random")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--processes", type=int, default=None,
                    help="inferctl `router serve --processes N` (default: not passed, the router's own default)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--baseline", action="store_true",
                    help="also run the inferctl router with --no-coalesce (steady and stale)")
    ap.add_argument("--baseline-args", default="",
                    help="also run the inferctl router with these extra `router serve` arguments (one string, "
                         "e.g. '--miss-placement power_of_two'; steady and stale)")
    ap.add_argument("--baseline-label", default="baseline", help="the --baseline-args variant's name in the tables")
    ap.add_argument("--keep-alive", action="store_true", help="reuse client connections (shows the peer's stall)")
    ap.add_argument("--logs", help="keep every process's log and per-request results here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    names = ["steady", "stale", "two-routers", "pd"] if args.scenario == "all" else args.scenario.split(",")
    for n in names:
        if n not in ("steady", "stale", "two-routers", "pd"):
            ap.error(f"unknown scenario {n!r}")
    cfg = Config(time_scale=args.time_scale, cache_tokens=args.cache_tokens, concurrency=args.concurrency,
                 keep_alive=args.keep_alive, stale_cache_tokens=args.stale_cache_tokens,
                 stale_modes=tuple(args.stale.split(",")), processes=args.processes,
                 baseline=args.baseline, baseline_args=tuple(shlex.split(args.baseline_args)),
                 baseline_label=args.baseline_label)
    for m in cfg.stale_modes:
        if m not in STALE:
            ap.error(f"unknown --stale mode {m!r}")
    cpts = [int(c) for c in args.cpt.split(",")]
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="bench_rq_"))
    runs = []
    for rep in range(args.repeat):
        wl = Workload(requests=args.requests, seed=args.seed + rep)
        runs.append(scenarios(names, cfg, logs / f"run{rep + 1}", wl, cpts))
        (logs / "runs.json").write_text(json.dumps(runs, indent=1))  # what is measured so far survives a crash
    if args.json:
        print(json.dumps(runs, indent=2))
        return
    for i, run in enumerate(runs):
        print(f"\n=== run {i + 1} (seed {args.seed + i}) ===")
        for scen, rows in run.items():
            print(f"\n{scen}")
            print(f"{'variant':28} {'hit rate':>9} {'ceiling':>8} {'reachable':>9} {'TTFT mean':>10} {'p50':>7} "
                  f"{'p99':>7} {'failed':>6} {'load':>10}")
            for r in rows:
                print(f"{r['variant']:28} {r['hit_rate']:9.1%} {r['ceiling']:8.1%} {r['reachable']:9.1%} "
                      f"{r['ttft_mean_s']:10.3f} "
                      f"{r['ttft_p50_s']:7.3f} {r['ttft_p99_s']:7.3f} {r['failed']:6d} "
                      f"{r['load_avg'][0]:4.1f}-{r['load_avg'][1]:4.1f}")
                ws = r.get("workers") or []
                print(f"{'':24}   router CPU {r['router_cpu_ms_per_request']} ms/request; per worker: requests {'/'.join(str(int(w['requests'])) for w in ws)}, mean queue ms "
                      f"{'/'.join(str(round(1000 * w['queue_s_mean'])) for w in ws)}, worker-side mean TTFT ms "
                      f"{'/'.join(str(round(1000 * w['ttft_s_mean'])) for w in ws)}")
                for j, procs in enumerate(r.get("router_processes") or []):
                    print(f"{'':24}   router {j}: processes {procs['answered']} of {procs['processes']} answered; "
                          f"the leader's first_sight {procs['leader_first_sight']}")
            for k in [0, *range(2, len(rows))]:
                q = ratios(rows, k)
                print(f"  {rows[k]['variant']} vs {rows[1]['variant']}: {q['points']:+.1f} points, headroom closed "
                      f"{q['headroom_closed']:.2f}, mean TTFT {q['ttft_mean_x']:.2f}x, p99 {q['ttft_p99_x']:.2f}x")
    if len(runs) > 1:
        print("\n=== medians ===")
        for scen in runs[0]:
            hits = [[r["hit_rate"] for r in run[scen]] for run in runs]
            print(f"{scen}: hit rates {' / '.join('/'.join(f'{h:.1%}' for h in hs) for hs in hits)}")
            for k in [0, *range(2, len(runs[0][scen]))]:
                qs = [ratios(run[scen], k) for run in runs]
                med = {x: _median([q[x] for q in qs]) for x in qs[0]}
                print(f"  {runs[0][scen][k]['variant']}: median {med['points']:+.1f} points, headroom closed "
                      f"{med['headroom_closed']:.2f}, mean TTFT {med['ttft_mean_x']:.2f}x, p99 {med['ttft_p99_x']:.2f}x")
    print(f"\nlogs: {logs}")


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl-C, so the workers and routers (own sessions) are stopped, not orphaned
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if len(sys.argv) == 4 and sys.argv[1] == "_loadgen":
        loadgen_main(sys.argv[2], sys.argv[3])
    else:
        main()
