"""Issue 28's "Done when" for the router's data path, with real processes and real signals:

- `kill-decode`: 2 prefills + 3 decodes, each simulated worker in a process of its own, and the router
  started by its own CLI (`python -m infer_ctl router serve`) in another. First a reference pass: every
  prompt of the set streamed once, greedy, 128 tokens, nothing killed. Then the load: `--clients`
  closed-loop clients stream the same prompts for `--seconds`; half way, one decode process gets SIGKILL
  (its kernel resets every socket: what a crashed or OOM-killed SGLang looks like from the router). Counts
  the streams that failed (a non-200, an error event, no `[DONE]`), and compares every completed stream's
  text with the reference pass's for its prompt. `--no-recovery` runs the router with
  `router.stream_recovery: false` (through a profile), for the before.
- `connections`: the router (its CLI; `max_connections` unset, so chosen from RLIMIT_NOFILE, which it raises
  to the hard limit at start) in front of one simulated collocated worker; `--streams` long streams are
  started, then `--conns` idle connections that send half a request header and wait, from `--procs` client
  processes over several loopback source addresses (the ephemeral ports of one address would run out);
  then `--probes` new clients ask GET /health. Reports how the idle connections and the new clients were
  answered (kept open, 503, reset, refused) and whether the streams in flight completed.

Run: `PYTHONPATH=$PWD python scripts/bench_router_attack.py kill-decode [--no-recovery]` or
`... connections [--conns 22000]`. Prints one JSON line with the load average beside the numbers.
"""

from __future__ import annotations

import argparse
import errno
import json
import multiprocessing as mp
import os
import signal
import socket
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


# ---- processes: one simulated worker each, and the router's CLI ---------------------------------------
def _worker(conn: Any, role: str, time_scale: float) -> None:
    from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread

    c = start_cluster_in_thread([WorkerSpec(role, time_scale=time_scale, bootstrap_timeout_s=10.0,  # type: ignore[arg-type]
                                            waiting_timeout_s=10.0)])
    w = c.workers[0]
    conn.send((w.url, w.bootstrap_port, os.getpid()))
    conn.recv()
    c.stop()


class Fleet:
    def __init__(self, roles: list[str], time_scale: float) -> None:
        ctx = mp.get_context("spawn")
        self.procs: list[tuple[Any, Any]] = []
        self.workers: list[tuple[str, str, int | None, int]] = []  # role, url, bootstrap port, pid
        for role in roles:
            a, b = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(b, role, time_scale), daemon=True)
            p.start()
            self.procs.append((p, a))
        for role, (_, a) in zip(roles, self.procs, strict=True):
            if not a.poll(120):
                raise SystemExit(f"a simulated {role} did not start")
            url, bp, pid = a.recv()
            self.workers.append((role, url, bp, pid))

    def stop(self) -> None:
        for p, a in self.procs:
            if p.is_alive():
                try:
                    a.send("stop")
                except (BrokenPipeError, OSError):
                    pass
                p.join(10)
                if p.is_alive():
                    p.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RouterProc:
    """`python -m infer_ctl router serve` in a session of its own."""

    def __init__(self, fleet: Fleet, profile_yaml: str | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "infer_ctl", "router", "serve", "--listen", f"127.0.0.1:{self.port}"]
        for role, url, bp, _ in fleet.workers:
            args += {"prefill": ["--prefill", f"{url}@{bp}"], "decode": ["--decode", url],
                     "mixed": ["--mixed", url]}[role]
        self.tmp = tempfile.TemporaryDirectory()
        if profile_yaml is not None:
            prof = Path(self.tmp.name) / "p.yaml"
            prof.write_text(profile_yaml)
            args += ["-p", str(prof)]
        self.log = Path(self.tmp.name) / "router.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.p = subprocess.Popen(args, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"router did not become healthy:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def metric(self, name: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        r = httpx.get(self.url + "/metrics", timeout=10)
        r.raise_for_status()
        for fam in text_string_to_metric_families(r.text):
            for s in fam.samples:
                if s.name == name:
                    total += s.value
        return total

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(40)
            except subprocess.TimeoutExpired:
                self.p.kill()
        self.tmp.cleanup()


# ---- kill-decode ---------------------------------------------------------------------------------
def _body(i: int, tokens: int) -> dict[str, Any]:
    return {"text": f"stream {i}: tell me about the river and the mill " * 3, "stream": True,
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}


def _stream(url: str, body: dict[str, Any]) -> tuple[str | None, str]:
    """(the streamed text, '') or (None, why it failed)."""
    text, done = "", False
    try:
        with httpx.stream("POST", url + "/generate", json=body, timeout=120) as r:
            if r.status_code != 200:
                return None, f"status {r.status_code}"
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    ev = json.loads(line[6:])
                    if "error" in ev:
                        return None, f"error event: {str(ev['error'])[:120]}"
                    text = ev.get("text", text)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:160]
    return (text, "") if done else (None, "no [DONE]")


def kill_decode(args: argparse.Namespace) -> dict[str, Any]:
    fleet = Fleet(["prefill"] * 2 + ["decode"] * 3, args.time_scale)
    profile = None
    if args.no_recovery:  # the shipped local profile with the one setting changed (its servers are not used)
        import yaml

        from infer_ctl.profile import load_profile

        doc = load_profile("builtin:local").model_dump(mode="json", exclude_none=True)
        doc["router"]["stream_recovery"] = False
        profile = yaml.safe_dump(doc)
    router = RouterProc(fleet, profile)
    try:
        prompts = list(range(args.prompts))
        reference: dict[int, str] = {}
        for i in prompts:  # the reference pass, one at a time, nothing killed
            text, why = _stream(router.url, _body(i, args.tokens))
            if text is None:
                raise SystemExit(f"the reference pass failed on prompt {i}: {why}")
            reference[i] = text
        failed: list[str] = []
        differ = 0
        done = 0
        lock = threading.Lock()
        stop_at = time.monotonic() + args.seconds
        nxt = [0]

        def client() -> None:
            nonlocal differ, done
            while time.monotonic() < stop_at:
                with lock:
                    i = prompts[nxt[0] % len(prompts)]
                    nxt[0] += 1
                text, why = _stream(router.url, _body(i, args.tokens))
                with lock:
                    if text is None:
                        failed.append(why)
                    else:
                        done += 1
                        differ += text != reference[i]

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(args.seconds / 2)
        victim = next(w for w in fleet.workers if w[0] == "decode")
        recov_before = router.metric("inferctl_router_stream_recoveries_total")
        os.kill(victim[3], signal.SIGKILL)
        killed_at = time.monotonic()
        for t in threads:
            t.join()
        return {"scenario": "kill-decode", "recovery": not args.no_recovery, "clients": args.clients,
                "tokens": args.tokens, "killed": victim[1], "killed_after_s": round(args.seconds / 2, 1),
                "streams_completed": done, "streams_failed": len(failed), "failures": sorted(set(failed))[:5],
                "texts_differing_from_reference": differ,
                "recoveries": router.metric("inferctl_router_stream_recoveries_total") - recov_before,
                "ran_s_after_kill": round(time.monotonic() - killed_at, 1), "load": os.getloadavg()}
    finally:
        router.stop()
        fleet.stop()


# ---- connections ---------------------------------------------------------------------------------
def _holder(conn: Any, port: int, n: int, first_src: int, settle_s: float) -> None:
    """Open `n` connections that each send half a request header; then classify how each was answered."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks: list[socket.socket] = []
    counts = {"opened": 0, "refused": 0, "connect_error": 0}
    per_src = 20000
    for k in range(n):
        s = socket.socket()
        try:
            s.bind((f"127.0.0.{first_src + k // per_src}", 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            socks.append(s)
            counts["opened"] += 1
        except ConnectionRefusedError:
            counts["refused"] += 1
            s.close()
        except OSError:
            counts["connect_error"] += 1
            s.close()
    conn.send("opened")
    conn.recv()  # the parent's probes are done
    time.sleep(settle_s)
    answers = {"open_no_answer": 0, "503": 0, "other_answer": 0, "reset": 0, "closed_silently": 0}
    for s in socks:
        s.setblocking(False)
        try:
            data = s.recv(4096)
            if not data:
                answers["closed_silently"] += 1
            elif b" 503 " in data.split(b"\r\n", 1)[0]:
                answers["503"] += 1
            else:
                answers["other_answer"] += 1
        except BlockingIOError:
            answers["open_no_answer"] += 1
        except ConnectionResetError:
            answers["reset"] += 1
        except OSError as exc:
            answers["reset" if exc.errno == errno.ECONNRESET else "other_answer"] += 1
    for s in socks:
        s.close()
    conn.send({**counts, **answers})


def _probe(url: str) -> str:
    try:
        r = httpx.get(url + "/health", timeout=10)
        return str(r.status_code) + ("+retry-after" if r.headers.get("retry-after") else "")
    except httpx.RemoteProtocolError:
        return "closed"
    except httpx.ConnectError as exc:
        return "reset" if "reset" in str(exc).lower() else "connect_error"
    except httpx.HTTPError as exc:
        return type(exc).__name__


def connections(args: argparse.Namespace) -> dict[str, Any]:
    fleet = Fleet(["mixed"], args.time_scale)
    router = RouterProc(fleet)
    try:
        body = {"text": "a long story about the sea " * 4, "stream": True,
                "sampling_params": {"max_new_tokens": args.stream_tokens, "temperature": 0}}
        results: list[tuple[str | None, str]] = []
        streams = [threading.Thread(target=lambda: results.append(_stream(router.url, body)))
                   for _ in range(args.streams)]
        for t in streams:
            t.start()
        time.sleep(1.0)
        ctx = mp.get_context("spawn")
        per = args.conns // args.procs
        holders = []
        t0 = time.monotonic()
        for k in range(args.procs):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_holder, args=(b, router.port, per, 2 + 2 * k, 1.0), daemon=True)
            p.start()
            holders.append((p, a))
        for _, a in holders:
            if not a.poll(300):
                raise SystemExit("a connection holder did not finish opening")
            a.recv()
        opened_s = time.monotonic() - t0
        probes = [_probe(router.url) for _ in range(args.probes)]
        health_while = {k: probes.count(k) for k in set(probes)}
        for _, a in holders:
            a.send("go")
        held: dict[str, int] = {}
        for p, a in holders:
            for k, v in a.recv().items():
                held[k] = held.get(k, 0) + v
            p.join(30)
        refused = router.metric("inferctl_router_connections_refused_total")  # the holders' sockets closed
        for t in streams:
            t.join(timeout=max(5.0, args.stream_tokens * 0.1))
        ok = sum(1 for text, _ in results if text is not None)
        return {"scenario": "connections", "conns": args.conns, "procs": args.procs, "opened_in_s": round(opened_s, 1),
                "idle_connections": held, "new_clients_while_full": health_while,
                "refused_counted": refused, "streams_in_flight": args.streams, "streams_completed": ok,
                "stream_failures": [why for text, why in results if text is None][:5],
                "health_after": _probe(router.url), "load": os.getloadavg()}
    finally:
        router.stop()
        fleet.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kill-decode")
    k.add_argument("--clients", type=int, default=16)
    k.add_argument("--prompts", type=int, default=16)
    k.add_argument("--tokens", type=int, default=128)
    k.add_argument("--seconds", type=float, default=20.0)
    k.add_argument("--time-scale", type=float, default=0.5)
    k.add_argument("--no-recovery", action="store_true")
    c = sub.add_parser("connections")
    c.add_argument("--conns", type=int, default=22000)
    c.add_argument("--procs", type=int, default=2)
    c.add_argument("--probes", type=int, default=20)
    c.add_argument("--streams", type=int, default=4)
    c.add_argument("--stream-tokens", type=int, default=400)
    c.add_argument("--time-scale", type=float, default=1.0)
    args = ap.parse_args()
    out = kill_decode(args) if args.cmd == "kill-decode" else connections(args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
