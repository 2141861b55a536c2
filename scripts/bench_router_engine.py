#!/usr/bin/env python3
"""The router in front of real SGLang 0.5.23 (CPU backend, tiny random-weight model, PD over Mooncake's
TCP transport) beside smg 1.13.0, SGLang's current gateway, in front of the same two servers, in the same
run: streamed chat requests one at a time (time to first token and to the end), then a closed loop of C
clients on /generate (requests/s). Targets alternate request by request, so both see the same engine
state and machine load.

On CPU the engine's own time dominates (tens of ms per step), so the ratios say whether a router adds
anything noticeable in front of a real engine and whether it serves every request; the router's own cost
is measured against stand-ins in bench_router_overhead.py and bench_router_stream_latency.py.

    python scripts/bench_router_engine.py [--requests 40] [--clients 4] [--seconds 20] [--json]

Needs the engine environment (scripts/install-test-deps.sh builds it; INFERCTL_SGLANG_VENV).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infer_ctl.router.daemon.embed import router_config, start_router_in_thread  # noqa: E402
from tests.engine import engine, tiny_model  # noqa: E402
from tests.ports import free_port  # noqa: E402

CHAT = [{"role": "system", "content": "You are the billing assistant of a bank."},
        {"role": "user", "content": "What is the capital of France?"}]


def streamed(url: str, max_tokens: int, model: str) -> tuple[float, float]:
    """(TTFT, total) in ms of one streamed chat request."""
    t0 = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=120,
                      json={"model": model, "messages": CHAT, "max_tokens": max_tokens, "stream": True}) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"{url}: HTTP {r.status_code} {r.text[:500]}")
        for line in r.iter_lines():
            if line.startswith("data: ") and first is None and '"content"' in line:
                first = time.perf_counter()
    end = time.perf_counter()
    return ((first or end) - t0) * 1e3, (end - t0) * 1e3


def closed_loop(url: str, clients: int, seconds: float) -> dict[str, float]:
    done, errors = [0], [0]
    stop = time.monotonic() + seconds

    def one() -> None:
        with httpx.Client(timeout=120) as c:
            while time.monotonic() < stop:
                try:
                    r = c.post(url + "/generate", json={"text": "The quick brown fox",
                                                        "sampling_params": {"max_new_tokens": 8}})
                    if r.status_code == 200:
                        done[0] += 1
                    else:
                        errors[0] += 1
                except httpx.HTTPError:
                    errors[0] += 1

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"rps": done[0] / seconds, "errors": errors[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=40, help="streamed requests per target, one at a time")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if engine.python() is None or engine.smg() is None:
        raise SystemExit(f"no engine environment at {engine.VENV}: {engine.INSTALL_CMD}")
    tmp = Path(tempfile.mkdtemp())
    model = tiny_model.write(str(tmp / "model"), template_file=True)
    pre = engine.EngineServer("prefill", model, tmp, mode="prefill", kv_events=True)
    dec = engine.EngineServer("decode", model, tmp, mode="decode")
    procs: list[subprocess.Popen[bytes]] = []
    router = None
    try:
        engine.start_all([pre, dec])
        router = start_router_in_thread(router_config(prefill=[(pre.url, pre.bootstrap_port)], decode=[dec.url],
                                                      tokenizer_path=model, policy="cache_aware"))
        sp = free_port()
        smg_log = tmp / "smg.log"
        with open(smg_log, "wb") as fh:
            procs.append(subprocess.Popen(
                [str(engine.smg()), "launch", "--pd-disaggregation", "--prefill", pre.url, str(pre.bootstrap_port),
                 "--decode", dec.url, "--policy", "cache_aware", "--host", "127.0.0.1", "--port", str(sp),
                 "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "warn"],
                stdout=fh, stderr=subprocess.STDOUT))
        targets = {"inferctl router": router.url, "smg 1.13.0": f"http://127.0.0.1:{sp}"}
        # both route only once their first health round found the workers (smg registers them in the
        # background after it listens)
        for url in targets.values():
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                try:
                    if httpx.post(url + "/generate", timeout=30,
                                  json={"text": "hi", "sampling_params": {"max_new_tokens": 1}}).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(1)
        # the served model's name (the model path: no --served-model-name): smg routes by it and answers a
        # request for another model 503 "no prefill workers" (read in its log); the router ignores it
        for url in targets.values():  # warm-up
            streamed(url, 2, model)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
        for i in range(args.requests):
            order = list(targets) if i % 2 == 0 else list(reversed(targets))
            for name in order:
                samples[name].append(streamed(targets[name], args.max_tokens, model))
        loops = {name: closed_loop(url, args.clients, args.seconds) for name, url in targets.items()}
        rows = {name: {"ttft_p50_ms": statistics.median(t for t, _ in s), "total_p50_ms": statistics.median(e for _, e in s),
                       "rps": loops[name]["rps"], "errors": loops[name]["errors"]} for name, s in samples.items()}
        a, b = rows["inferctl router"], rows["smg 1.13.0"]
        peer_log = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in smg_log.read_text(errors="replace").splitlines()]
        doc: dict[str, Any] = {
            "rows": rows, "ttft_ratio_inferctl_vs_smg": a["ttft_p50_ms"] / b["ttft_p50_ms"],
            "rps_ratio_inferctl_vs_smg": a["rps"] / b["rps"] if b["rps"] else None,
            "smg_log_warnings": [ln[:300] for ln in peer_log if re.search(r"WARN|ERROR", ln)][:10],
            "requests": args.requests, "clients": args.clients, "seconds": args.seconds}
        if args.json:
            print(json.dumps(doc, indent=2))
            return
        print(f"{'target':18} {'TTFT p50 ms':>12} {'total p50 ms':>13} {'c' + str(args.clients) + ' req/s':>10} {'errors':>7}")
        for name, r in rows.items():
            print(f"{name:18} {r['ttft_p50_ms']:12.1f} {r['total_p50_ms']:13.1f} {r['rps']:10.2f} {r['errors']:7.0f}")
        print(f"inferctl / smg: TTFT {doc['ttft_ratio_inferctl_vs_smg']:.2f}x, requests/s {doc['rps_ratio_inferctl_vs_smg']:.2f}x")
        print(f"smg log warnings/errors: {doc['smg_log_warnings'] or 'none'}")
    finally:
        if router is not None:
            router.stop()
        for p in procs:
            p.terminate()
            p.wait(10)
        pre.stop()
        dec.stop()


if __name__ == "__main__":
    main()
