"""`inferctl demo`: the simulated cluster of a profile, a router in front, a short bench, clean shutdown.

The front is the inferctl router (`infer_ctl.router.daemon.embed`); `router="sglang"` puts SGLang's own Rust
router (PyPI sglang-router) there instead, and `router="none"` benchmarks one extra mixed worker directly.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from infer_ctl.bench.client import LoadSpec
from infer_ctl.bench.run import run_bench
from infer_ctl.bench.stats import Slo
from infer_ctl.bench.workloads import WorkloadSpec
from infer_ctl.errors import InferctlError, UsageError
from infer_ctl.profile import Profile
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from infer_ctl.sim.from_profile import specs_from_profile

ROUTERS = ("auto", "inferctl", "sglang", "none")


@dataclass
class DemoOptions:
    requests: int = 160
    concurrency: int = 16
    max_new_tokens: int = 64
    #: wall seconds per model second; 1.0 = the modelled H100/H200 speed
    time_scale: float = 1.0
    workload: str = "shared-prefix"
    num_prefixes: int = 8
    prefix_tokens: int = 1024
    seed: int = 0
    router: str = "auto"
    router_timeout_s: float = 90.0


@dataclass
class Front:
    name: str
    url: str
    stop: Callable[[], None]


@dataclass
class DemoOutcome:
    summary: dict[str, Any]
    router: str
    router_url: str
    workers: list[dict[str, Any]] = field(default_factory=list)


class DemoError(InferctlError):
    pass


def _inferctl_router(profile: Profile, cluster: ThreadedSimCluster,
                     log: Callable[[str], None] = lambda _m: None) -> Front:
    from infer_ctl.router.daemon.embed import router_config, start_router_in_thread

    host = profile.router.listen_host
    port = profile.router.listen_port
    prefill = [(w.url, w.bootstrap_port) for w in cluster.by_role("prefill")]
    decode = [w.url for w in cluster.by_role("decode")]
    mixed = [w.url for w in cluster.by_role("mixed")]

    def start(listen: str) -> Any:
        return start_router_in_thread(router_config(prefill=prefill, decode=decode, workers=mixed,
                                                    profile=profile, listen=listen))

    try:
        handle = start(f"{host}:{port}")
    except (OSError, UsageError) as exc:
        # the profile's router port is busy (the router says so as a UsageError naming `router serve`'s
        # --listen, which demo does not have, and exit 64): any free port will do for a demo
        log(f"{host}:{port} (the profile's router.listen) is taken ({exc}); the demo's router takes a free port")
        try:
            handle = start(f"{host}:0")
        except (OSError, UsageError) as again:
            raise DemoError(f"the demo's router cannot listen on {host}: {again}",
                            remedy="set router.listen to a free HOST:PORT in the profile given with -p") from None
    return Front("inferctl router", handle.url, handle.stop)


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _sglang_router(cluster: ThreadedSimCluster, timeout_s: float) -> Front:
    port = _free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    for w in cluster.by_role("prefill"):
        cmd += ["--prefill", w.url, str(w.bootstrap_port)]
    for w in cluster.by_role("decode"):
        cmd += ["--decode", w.url]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(_free_port()), "--log-level", "error", "--shutdown-grace-period-secs", "1",
            "--worker-startup-check-interval", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(httpx.TransportError):
            probe = {"text": "ready?", "sampling_params": {"max_new_tokens": 1}}
            if httpx.post(url + "/generate", json=probe, timeout=10).status_code == 200:
                return Front("sglang-router (Rust)", url, stop)
        time.sleep(0.3)
    stop()
    raise DemoError("sglang-router did not become ready", remedy="run with --front inferctl or check `pip show sglang-router`")


def _direct(cluster: ThreadedSimCluster, spec: WorkerSpec) -> Front:
    """No router: one extra mixed worker serves the bench directly (PD workers need a router)."""
    cluster.call(cluster.cluster.add_worker(spec))
    return Front("direct (mixed worker, no router)", cluster.workers[-1].url, lambda: None)


def _front(kind: str, profile: Profile, cluster: ThreadedSimCluster, opts: DemoOptions,
           log: Callable[[str], None] = lambda _m: None) -> Front:
    if kind in ("auto", "inferctl"):
        try:
            return _inferctl_router(profile, cluster, log)
        except ImportError:
            if kind == "inferctl":
                raise
    if kind in ("auto", "sglang"):
        try:
            import sglang_router  # noqa: F401
        except ImportError:
            if kind == "sglang":
                raise DemoError("sglang-router is not installed", remedy="pip install sglang-router==0.3.2") from None
        else:
            return _sglang_router(cluster, opts.router_timeout_s)
    spec = WorkerSpec("mixed", time_scale=opts.time_scale, seed=opts.seed + 100, preset=cluster.workers[0].spec.preset)
    return _direct(cluster, spec)


@contextlib.contextmanager
def demo_cluster(profile: Profile, opts: DemoOptions) -> Iterator[ThreadedSimCluster]:
    specs = specs_from_profile(profile, time_scale=opts.time_scale, seed=opts.seed)
    if not specs:
        raise DemoError(f"profile {profile.name!r} describes no prefill/decode servers",
                        remedy="use --profile builtin:local")
    cluster = start_cluster_in_thread(specs, port_fallback=True)
    try:
        yield cluster
    finally:
        cluster.stop()


def run_demo(profile: Profile, opts: DemoOptions, log: Callable[[str], None] = lambda _m: None) -> DemoOutcome:
    if opts.router not in ROUTERS:
        raise UsageError(f"unknown router {opts.router!r}", remedy=f"use one of {', '.join(ROUTERS)}")
    with demo_cluster(profile, opts) as cluster:
        log(f"started {len(cluster.workers)} simulated workers: "
            + ", ".join(f"{w.spec.role} {w.url}" for w in cluster.workers))
        front = _front(opts.router, profile, cluster, opts, log)
        try:
            log(f"{front.name} listening on {front.url}; running {opts.requests} {opts.workload} requests")
            wl = WorkloadSpec(name=opts.workload, requests=opts.requests, seed=opts.seed,
                              max_new_tokens=opts.max_new_tokens, num_prefixes=opts.num_prefixes,
                              prefix_tokens=opts.prefix_tokens)
            load = LoadSpec(concurrency=opts.concurrency, seed=opts.seed, timeout_s=120)
            outcome = run_bench(front.url, wl, load, Slo(), time_scale=opts.time_scale)
            workers = [{"role": w.spec.role, "url": w.url,
                        "bootstrap_port": w.bootstrap_port if w.spec.role == "prefill" else None}
                       for w in cluster.workers]
            return DemoOutcome(outcome.summary, front.name, front.url, workers)
        finally:
            front.stop()
            log("router and workers stopped")
