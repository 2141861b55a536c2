#!/usr/bin/env python3
"""Router overhead: latency added over calling the decode directly, and max requests/s on tiny PD requests.

Upstreams are fast stand-ins (aiohttp + uvloop, one process each for prefill and decode) that answer
/generate at once with a small JSON body; the load generator is Debian's wrk. Compared in the same run:
the decode stand-in called directly, inferctl's router (`inferctl router serve`, PD mode) and
sglang-router 0.3.2 (`--pd-disaggregation --policy cache_aware`). Everything shares this machine's cores,
so absolute numbers depend on it; the ratios are the result.

    python scripts/bench_router_overhead.py [--duration 5] [--connections 16] [--repeat 3] [--baseline CHECKOUT]
                                            [--processes N]

`--processes N` adds this checkout's router run as N processes (`router serve --processes N`), measured in
the same repetitions as the one-process router (which is always `--processes 1`). The prefill stand-in
then advertises SGLang's KV events in /server_info (a real ZMQ PUB socket that publishes nothing): a
router on `cache_aware` runs several processes only for workers that publish them.

`--baseline` adds the router of another checkout (before/after a change: `git worktree add /tmp/base
<commit>`), measured in the same repetitions as this checkout's, so both see the same machine load.
`--calls N` counts instead of timing: Python function calls per request of both routers (cProfile).
`--floor` adds nginx (Debian's, C, all cores) doing only the PD fan-out's HTTP work: each request proxied to the
decode over kept-alive upstream connections and mirrored to the prefill (`mirror`), the body untouched (no
bootstrap fields, no routing). It is a floor no PD router can beat on this machine: what a compiled data
plane with no routing at all gets out of the same stand-ins, wrk and cores, beside sglang-router's figure.
`--tracing` adds this checkout's router with OpenTelemetry tracing on (every request sampled unless
OTEL_TRACES_SAMPLER[_ARG] say otherwise; OTLP/HTTP to a sink in this process that answers each export with
200), measured in the same repetitions: the cost of tracing.

Each repetition measures every target once (the order rotates between repetitions and is reversed every
other one, so no target always runs first after a quiet or busy spell, or always right after the same
neighbour; use an even --repeat with --baseline); the table shows the median over repetitions, and the load
average of the machine before and after, because on a shared machine it moves every number.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pstats
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from servers import free_port, get_ok, stop_all, wait_ready

BODY = {"text": "Say hi.", "sampling_params": {"max_new_tokens": 1}}


def standin(port: int, kv_port: int | None = None) -> None:
    """A minimal SGLang-shaped worker: enough for both routers' health checks and /generate. `kv_port`: a
    ZMQ PUB socket bound there and advertised as SGLang's `kv_events` in /server_info."""
    import uvloop
    from aiohttp import web

    info: dict[str, Any] = {"status": "ok", "loads": [{"num_waiting_reqs": 0, "num_running_reqs": 0}]}
    if kv_port:
        import zmq

        pub: Any = zmq.Context.instance().socket(zmq.PUB)
        pub.bind(f"tcp://127.0.0.1:{kv_port}")
        info["kv_events"] = {"endpoint_host": "127.0.0.1", "endpoint_port_base": kv_port, "topic": "",
                             "block_size": 1, "dp_size": 1}

    reply = json.dumps({"text": "hi", "output_ids": [1], "meta_info": {
        "id": "x", "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": 3, "completion_tokens": 1,
        "cached_tokens": 0}}).encode()

    async def generate(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=reply, content_type="application/json")

    async def ok(request: web.Request) -> web.Response:
        return web.json_response(info)

    # sglang-router probes workers with HTTP/2 prior-knowledge requests, which aiohttp refuses (400) and logs
    # with a traceback; the probes' outcome does not matter here, the log noise does.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    app = web.Application()
    app.router.add_post("/generate", generate)
    for path in ("/health", "/health_generate", "/server_info", "/get_server_info", "/v1/loads", "/get_model_info",
                 "/model_info", "/v1/models"):
        app.router.add_get(path, ok)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def naive_proxy(port: int, prefill: str, decode: str) -> None:
    """The reference point of the issue: aiohttp server + aiohttp client, PD fan-out, nothing else.
    Same server stack as inferctl's router; the difference is the upstream client and the features."""
    import asyncio
    import random

    import aiohttp
    import uvloop
    from aiohttp import web

    session: dict[str, aiohttp.ClientSession] = {}

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        body.update(bootstrap_host="127.0.0.1", bootstrap_port=1, bootstrap_room=random.randrange(1, 2**62))
        s = session["s"]

        async def call(url: str) -> tuple[int, bytes]:
            async with s.post(url + "/generate", json=body) as r:
                return r.status, await r.read()

        (_, _), (status, data) = await asyncio.gather(call(prefill), call(decode))
        return web.Response(status=status, body=data, content_type="application/json")

    async def on_startup(app: web.Application) -> None:
        session["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def on_cleanup(app: web.Application) -> None:
        await session["s"].close()

    app = web.Application()
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/generate", generate)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0, post: bool = False) -> None:
    """Until `url` answers 200 (a GET, or a POST of BODY), served by `proc` (servers.wait_ready: a foreign
    server that took the port, or one beside it, fails the benchmark instead of being measured)."""

    def answers() -> bool:
        if not post:
            return get_ok(url)
        try:
            return httpx.post(url, json=BODY, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_ready(url, proc, answers, timeout=timeout)


_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk(url: str, connections: int, threads: int, duration: int, script: str) -> dict[str, float]:
    out = subprocess.run(["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency", "-s", script, url],
                         capture_output=True, text=True, check=True).stdout
    res: dict[str, float] = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))}  # type: ignore[union-attr]
    for pct in ("50", "99"):
        m = re.search(rf"\s{pct}%\s+([\d.]+)(us|ms|s)", out)
        res[f"p{pct}_ms"] = float(m.group(1)) * _UNIT[m.group(2)] if m else float("nan")
    total = re.search(r"(\d+) requests in", out)
    res["requests"] = float(total.group(1)) if total else float("nan")
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    res["errors"] = float(errs.group(1)) if errs else 0.0
    return res


_TICK = os.sysconf("SC_CLK_TCK")


def proc_stats(pid: int) -> tuple[float, int]:
    """User + system CPU seconds and context switches (voluntary and not) of a process (all its threads)
    and its descendants, from /proc. Context switches per request say how often a router slept and woke
    for a request instead of finding several ready at once: each costs a wake-up and a cache refilled."""
    cpu, switches = 0.0, 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / _TICK
            for t in Path(f"/proc/{p}/task").iterdir():
                for line in (t / "status").read_text().splitlines():
                    if "ctxt_switches:" in line:
                        switches += int(line.split()[1])
                todo += [int(c) for c in (t / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return cpu, switches


def cpu_seconds(pid: int) -> float:
    return proc_stats(pid)[0]


INFERCTL = "inferctl router"
TRACED = "inferctl router (tracing on)"
#: the peer (--peer): SGLang's current gateway by default; sglang-router 0.3.2 for the figures measured before it
PEERS = {"smg": "smg 1.13.0", "sglang-router": "sglang-router 0.3.2"}
SGLANG = PEERS["smg"]
BASELINE = "inferctl router (baseline)"
MULTI = "inferctl router, N processes"
FLOOR = "nginx PD fan-out (floor)"

NGINX_CONF = """daemon off;
worker_processes {workers};
pid {tmp}/nginx.pid;
error_log {tmp}/error.log error;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream decode {{ server 127.0.0.1:{dp}; keepalive 64; }}
    upstream prefill {{ server 127.0.0.1:{pp}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        keepalive_requests 1000000;
        location /generate {{
            mirror /prefill;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://decode;
        }}
        location = /prefill {{
            internal;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://prefill/generate;
        }}
    }}
}}
"""


def otlp_sink() -> str:
    """An OTLP/HTTP endpoint that accepts every export (200, empty ExportTraceServiceResponse) without
    decoding it: the exporter's work is the router's cost, the sink's is not measured."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/v1/traces"


def router_source(checkout: Path) -> str:
    """Where `python -m infer_ctl` started in `checkout` imports the router from (checked, not assumed)."""
    out = subprocess.run([sys.executable, "-c", "import infer_ctl.router as p; print(p.__file__)"],
                         cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)}, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def python_calls_per_request(checkout: Path, pre: str, dec: str, bootstrap: int, n: int) -> float:
    """Python function calls per routed non-streaming PD request of the router in `checkout`, counted by
    cProfile: the router is run twice, answering n and 2n requests, and the difference is divided by n
    (start-up, shutdown and health polls cancel out). A count, not a time: it does not move with the load
    of a shared machine, so it shows a change in the work done per request that timings here cannot."""
    totals = []
    for count in (n, 2 * n):
        with tempfile.TemporaryDirectory() as tmp:
            prof, port = Path(tmp) / "router.prof", free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "infer_ctl", "router", "serve",
                 "--listen", f"127.0.0.1:{port}", "--prefill", f"{pre}@{bootstrap}", "--decode", dec,
                 "--log-level", "warning"],
                cwd=checkout, env={**os.environ, "INFERCTL_ROUTER_TOKEN": "", "PYTHONPATH": str(checkout)})
            try:
                url = f"http://127.0.0.1:{port}"
                wait_http(url + "/health", proc)
                with httpx.Client(timeout=10) as client:
                    for _ in range(count):
                        if client.post(url + "/generate", json=BODY).status_code != 200:
                            raise SystemExit(f"{checkout}: a request failed while counting calls")
            finally:
                proc.send_signal(signal.SIGTERM)  # the router drains and exits; cProfile writes its file
                proc.wait(60)
            totals.append(pstats.Stats(str(prof)).total_calls)  # type: ignore[attr-defined]  # set by Stats, not in typeshed
    return (totals[1] - totals[0]) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--standin", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--kv-pub", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--processes", type=int, metavar="N",
                    help="also measure this checkout's router as N processes (router serve --processes N)")
    ap.add_argument("--naive", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3, help="repetitions; the table shows medians")
    ap.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                    help="also measure the router of another checkout of this repository (e.g. a `git worktree` "
                         "of the commit before a change), interleaved with this one in every repetition")
    ap.add_argument("--calls", type=int, metavar="N",
                    help="instead of timing: count Python function calls per request (cProfile, N and 2N requests) "
                         "of this checkout's router and the --baseline one")
    ap.add_argument("--tracing", action="store_true",
                    help="also measure this checkout's router with tracing on (OTLP/HTTP to a local sink)")
    ap.add_argument("--floor", action="store_true",
                    help="also measure nginx doing only the PD fan-out (proxy to the decode, mirror to the prefill)")
    ap.add_argument("--peer", choices=sorted(PEERS), default="smg",
                    help="the peer router: smg 1.13.0 (SGLang's current gateway, default) or sglang-router 0.3.2")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    global SGLANG
    SGLANG = PEERS[args.peer]
    if args.floor and not shutil.which("nginx"):
        raise SystemExit("--floor needs nginx (Debian: apt-get install nginx-light)")
    if args.standin:
        standin(args.standin, args.kv_pub)
        return
    if args.naive:
        naive_proxy(int(args.naive[0]), args.naive[1], args.naive[2])
        return
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    here = Path(__file__).resolve().parent.parent
    sources = {INFERCTL: router_source(here)}
    if args.baseline is not None:
        sources[BASELINE] = router_source(args.baseline.resolve())
        if sources[BASELINE] == sources[INFERCTL]:
            raise SystemExit(f"--baseline {args.baseline} imports the same router as this checkout: {sources[INFERCTL]}")
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp())
    script = tmp / "post.lua"
    script.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                      f"wrk.body = '{json.dumps(BODY)}'\n")

    def start(cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen(cmd, **kw))
        return procs[-1]

    try:
        pp, dp, bp = free_port(), free_port(), free_port()
        start([sys.executable, __file__, "--standin", str(pp)] + (["--kv-pub", str(free_port())] if args.processes else []))
        start([sys.executable, __file__, "--standin", str(dp)])
        pre, dec = f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{dp}"
        wait_http(pre + "/health", procs[0])
        wait_http(dec + "/health", procs[1])
        if args.calls:
            counted = {name: python_calls_per_request(here if name == INFERCTL else args.baseline.resolve(), pre, dec,
                                                      bp, args.calls) for name in sources}
            if args.json:
                print(json.dumps({"python_calls_per_request": counted, "requests": args.calls,
                                  "router_sources": sources}, indent=2))
                return
            for name, calls in counted.items():
                print(f"{name:28} {calls:8.1f} Python function calls per request ({sources[name]})")
            if BASELINE in counted:
                print(f"this checkout / baseline: {counted[INFERCTL] / counted[BASELINE]:.3f}x")
            return
        # name -> (url, the process whose CPU is counted)
        targets: dict[str, tuple[str, subprocess.Popen[bytes]]] = {"direct (decode stand-in)": (dec, procs[1])}
        for name in sources:
            # `python -m` puts the working directory first on sys.path: each router runs in its own checkout
            checkout = here if name == INFERCTL else args.baseline.resolve()
            port = free_port()
            targets[name] = (f"http://127.0.0.1:{port}", start(
                [sys.executable, "-m", "infer_ctl", "router", "serve", "--listen", f"127.0.0.1:{port}",
                 "--prefill", f"{pre}@{bp}", "--decode", dec, "--log-level", "warning"]
                + (["--processes", "1"] if name == INFERCTL else []),
                cwd=checkout, env={**os.environ, "INFERCTL_ROUTER_TOKEN": "", "PYTHONPATH": str(checkout)}))
        if args.processes:
            port = free_port()
            # CPU counted over the supervisor and its router processes (proc_stats follows the children)
            targets[MULTI] = (f"http://127.0.0.1:{port}", start(
                [sys.executable, "-m", "infer_ctl", "router", "serve", "--listen", f"127.0.0.1:{port}",
                 "--prefill", f"{pre}@{bp}", "--decode", dec, "--log-level", "warning",
                 "--processes", str(args.processes)],
                cwd=here, env={**os.environ, "INFERCTL_ROUTER_TOKEN": "", "PYTHONPATH": str(here)}))
        if args.tracing:
            port, endpoint = free_port(), otlp_sink()
            # the OTLP settings are the bench's; a sampler given in the environment is kept (OTEL_TRACES_SAMPLER=
            # parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01: the cost at 1 % sampling)
            env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") or k.startswith("OTEL_TRACES_SAMPLER")}
            targets[TRACED] = (f"http://127.0.0.1:{port}", start(
                [sys.executable, "-m", "infer_ctl", "router", "serve", "--listen", f"127.0.0.1:{port}",
                 "--prefill", f"{pre}@{bp}", "--decode", dec, "--log-level", "warning"],
                cwd=here, env={**env, "INFERCTL_ROUTER_TOKEN": "", "PYTHONPATH": str(here),
                               "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
                               "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}))
        sp = free_port()
        # the peer in its default (best) mode, its log kept and read after the run: a peer that misbehaves
        # (workers it refuses, retries, HTTP/2 probes) is found out before its ratio is reported
        peer_log = open(tmp / "peer.log", "wb")  # noqa: SIM115 - closed by stop_all's process exit
        peer_cmd = ([shutil.which("smg") or "smg", "launch"] if args.peer == "smg"
                    else [sys.executable, "-m", "sglang_router.launch_router"])
        targets[SGLANG] = (f"http://127.0.0.1:{sp}", start(
            [*peer_cmd, "--pd-disaggregation", "--prefill", pre, str(bp),
             "--decode", dec, "--policy", "cache_aware", "--host", "127.0.0.1", "--port", str(sp),
             "--prometheus-port", str(free_port()), "--log-level", "warn" if args.peer == "smg" else "warning"],
            stdout=peer_log, stderr=subprocess.STDOUT))
        if args.floor:
            port = free_port()
            conf = tmp / "nginx.conf"
            conf.write_text(NGINX_CONF.format(workers=os.cpu_count() or 1, tmp=tmp, dp=dp, pp=pp, port=port))
            # CPU counted over the master and its workers (proc_stats follows the children)
            targets[FLOOR] = (f"http://127.0.0.1:{port}", start(["nginx", "-c", str(conf), "-p", str(tmp), "-e", str(tmp / "error.log")]))
        np_ = free_port()
        targets["naive aiohttp proxy"] = (f"http://127.0.0.1:{np_}",
                                          start([sys.executable, __file__, "--naive", str(np_), pre, dec]))
        for url, proc in targets.values():
            wait_http(url + "/generate", proc, post=True)
        # CPU per request of the target's own process(es) under the c16 load: unlike requests/s, it hardly
        # depends on how busy the rest of the machine is, so it compares the implementations' efficiency.
        load_before = os.getloadavg()
        ck = f"c{args.connections}"
        names = list(targets)
        runs: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in names}
        for url, _ in targets.values():
            wrk(url + "/generate", 4, 1, 1, str(script))  # warm-up
        for rep in range(args.repeat):
            order = names[rep % len(names):] + names[:rep % len(names)]
            if rep % 2:
                # rotation alone keeps neighbours in the same order (this checkout's router always right before
                # the baseline's); reversing every other repetition measures each pair both ways round
                order.reverse()
            for name in order:
                url, proc = targets[name]
                c1 = wrk(url + "/generate", 1, 1, args.duration, str(script))
                cpu0, cs0 = proc_stats(proc.pid)
                many = wrk(url + "/generate", args.connections, 2, args.duration, str(script))
                cpu1, cs1 = proc_stats(proc.pid)
                many["cpu_us_per_req"] = (cpu1 - cpu0) / many["requests"] * 1e6
                many["switches_per_req"] = (cs1 - cs0) / many["requests"]
                runs[name].append({"c1": c1, ck: many})
        load_after = os.getloadavg()

        def med(name: str, kind: str, key: str) -> float:
            return statistics.median(r[kind][key] for r in runs[name])

        def per_rep(a: str, b: str, kind: str, key: str) -> list[float]:
            return [x[kind][key] / y[kind][key] for x, y in zip(runs[a], runs[b], strict=True)]

        direct_name = names[0]
        rows = []
        for name in names:
            rows.append({"target": name, "p50_ms": med(name, "c1", "p50_ms"), "p99_ms": med(name, "c1", "p99_ms"),
                         "added_p50_ms": med(name, "c1", "p50_ms") - med(direct_name, "c1", "p50_ms"),
                         "added_p99_ms": med(name, "c1", "p99_ms") - med(direct_name, "c1", "p99_ms"),
                         "rps": med(name, ck, "rps"), "cpu_us_per_req": med(name, ck, "cpu_us_per_req"),
                         "switches_per_req": med(name, ck, "switches_per_req"),
                         "errors": sum(r["c1"]["errors"] + r[ck]["errors"] for r in runs[name])})
        ratio = med(INFERCTL, ck, "rps") / med(SGLANG, ck, "rps")
        cpu_ratio = med(SGLANG, ck, "cpu_us_per_req") / med(INFERCTL, ck, "cpu_us_per_req")
        sg_reps = per_rep(INFERCTL, SGLANG, ck, "rps")
        loads = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]}
        doc: dict[str, object] = {"rows": rows, "rps_ratio_inferctl_vs_sglang": ratio, "cpu_ratio_sglang_vs_inferctl": cpu_ratio,
                                  "per_repetition_ratios": sg_reps, "load_average": loads, "repeat": args.repeat,
                                  "duration_s": args.duration, "router_sources": sources}
        if args.processes:
            doc["processes"] = args.processes
            doc["rps_ratio_processes_vs_sglang"] = med(MULTI, ck, "rps") / med(SGLANG, ck, "rps")
            doc["per_repetition_ratios_processes"] = per_rep(MULTI, SGLANG, ck, "rps")
            # issue 27's bar: CPU per request at N processes within 1.15x of one process
            doc["cpu_ratio_processes_vs_one"] = {
                "per_repetition": (reps := per_rep(MULTI, INFERCTL, ck, "cpu_us_per_req")),
                "median_of_ratios": statistics.median(reps),
                "ratio_of_medians": med(MULTI, ck, "cpu_us_per_req") / med(INFERCTL, ck, "cpu_us_per_req")}
        if args.floor:
            doc["rps_ratio_floor_vs_sglang"] = med(FLOOR, ck, "rps") / med(SGLANG, ck, "rps")
            doc["per_repetition_ratios_floor"] = per_rep(FLOOR, SGLANG, ck, "rps")
        if args.tracing:
            doc["tracing_on_vs_off"] = {
                key: {"per_repetition": (reps := per_rep(TRACED, INFERCTL, kind, key)),
                      "median_of_ratios": statistics.median(reps)}
                for kind, key in ((ck, "rps"), (ck, "cpu_us_per_req"), ("c1", "p50_ms"))}
        if args.baseline is not None:
            # this checkout / the baseline: per repetition (the two measured within seconds of each other, under
            # the same load), the median of those, and the ratio of the two medians
            doc["vs_baseline"] = {
                key: {"per_repetition": (reps := per_rep(INFERCTL, BASELINE, kind, key)),
                      "median_of_ratios": statistics.median(reps),
                      "ratio_of_medians": med(INFERCTL, kind, key) / med(BASELINE, kind, key)}
                for kind, key in ((ck, "rps"), (ck, "cpu_us_per_req"), ("c1", "p50_ms"))}
        peer_lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln)  # smg colours its log even into a file
                      for ln in (tmp / "peer.log").read_text(errors="replace").splitlines()]
        doc["peer_log"] = {"lines": len(peer_lines),
                           "warnings_or_errors": [ln[:300] for ln in peer_lines
                                                  if re.search(r"WARN|ERROR", ln)][:10]}
        if args.json:
            print(json.dumps(doc, indent=2))
            return
        print(f"{SGLANG} log: {len(peer_lines)} lines, warnings/errors: {doc['peer_log']['warnings_or_errors'] or 'none'}")
        print(f"medians of {args.repeat} repetitions x {args.duration} s; load average (1/5/15 min) "
              f"before {loads['before']}, after {loads['after']} on {os.cpu_count()} CPUs")
        for name, src in sources.items():
            print(f"{name}: {src}")
        print(f"{'target':28} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'+p99 ms':>8} {ck + ' req/s':>11} "
              f"{'CPU us/req':>10} {'cs/req':>6} {'errors':>7}")
        for r in rows:
            print(f"{r['target']:28} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['added_p50_ms']:8.3f} {r['added_p99_ms']:8.3f} "
                  f"{r['rps']:11.0f} {r['cpu_us_per_req']:10.0f} {r['switches_per_req']:6.2f} {r['errors']:7.0f}")
        print(f"inferctl / {SGLANG} requests/s: {ratio:.2f}x (per repetition: "
              + ", ".join(f"{x:.2f}" for x in sg_reps) + ")")
        print(f"{SGLANG} CPU per request / inferctl CPU per request: {cpu_ratio:.2f}x "
              "(the requests/s ratio both would reach with a core each)")
        if args.processes:
            print(f"inferctl with {args.processes} processes / {SGLANG} requests/s: "
                  f"{doc['rps_ratio_processes_vs_sglang']:.2f}x (per repetition: "
                  + ", ".join(f"{x:.2f}" for x in doc["per_repetition_ratios_processes"]) + ")")  # type: ignore[attr-defined]
            cr = doc["cpu_ratio_processes_vs_one"]
            assert isinstance(cr, dict)
            print(f"CPU per request, {args.processes} processes / one: ratio of medians {cr['ratio_of_medians']:.2f}x "
                  "(per repetition: " + ", ".join(f"{x:.2f}" for x in cr["per_repetition"]) + ")")
        if args.floor:
            print(f"nginx PD fan-out (no routing) / {SGLANG} requests/s: {doc['rps_ratio_floor_vs_sglang']:.2f}x "
                  "(per repetition: " + ", ".join(f"{x:.2f}" for x in doc["per_repetition_ratios_floor"]) + ")")  # type: ignore[attr-defined]
        if args.tracing:
            tr = doc["tracing_on_vs_off"]
            assert isinstance(tr, dict)
            for key, label in (("rps", "requests/s"), ("cpu_us_per_req", "CPU per request"), ("p50_ms", "c1 p50")):
                print(f"tracing on / off, {label}: median of per-repetition ratios {tr[key]['median_of_ratios']:.3f}x "
                      "(per repetition: " + ", ".join(f"{x:.3f}" for x in tr[key]["per_repetition"]) + ")")
        if args.baseline is not None:
            vs = doc["vs_baseline"]
            assert isinstance(vs, dict)
            for key, label in (("rps", "requests/s"), ("cpu_us_per_req", "CPU per request"), ("p50_ms", "c1 p50")):
                print(f"this checkout / baseline, {label}: median of per-repetition ratios "
                      f"{vs[key]['median_of_ratios']:.3f}x, ratio of medians {vs[key]['ratio_of_medians']:.3f}x "
                      "(per repetition: " + ", ".join(f"{x:.3f}" for x in vs[key]["per_repetition"]) + ")")
    finally:
        stop_all(procs)  # proxies before the stand-ins they talk to
        shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    main()
