"""Several `router serve` replica processes under store and replica faults (the fleet of
tests/router/scaleout/test_replicas.py): a store that stops answering for 3 s (SIGSTOP) must not stall the data
plane; the store's password appears nowhere (process arguments, logs, status); a replica killed with
SIGKILL in the middle of admin changes leaves the store and the other replica agreeing; a flood of unique
prompts keeps first-sight anchoring within its budget. Numbers are printed (`pytest -s`)."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.router.redis_server import RedisServer
from tests.router.scaleout.test_replicas import (  # noqa: F401
    ROOT,
    Fleet,
    Replica,
    cluster,
    fleet,
    generate,
    prompt,
    wait_for,
)
from tests.sim.kv_client import free_port


def latencies(url: str, texts: list[str], stop: threading.Event, out: list[tuple[float, float, int]]) -> None:
    with httpx.Client(timeout=30) as c:
        i = 0
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                code = generate(url, texts[i % len(texts)], f"lat-{url[-5:]}-{i}", client=c).status_code
            except httpx.HTTPError:
                code = -1
            out.append((t0, time.monotonic() - t0, code))
            i += 1


def test_a_frozen_store_does_not_stall_the_data_plane(fleet: Fleet) -> None:  # noqa: F811
    """SIGSTOP redis-server for 3 s while both replicas serve: every request answers, none waits on the
    store; an admin change in the stall answers 503 within the store timeout; after SIGCONT both reconnect."""
    import random

    a, b = fleet.a, fleet.b
    rng = random.Random(3)
    texts = [prompt(rng, 60) for _ in range(4)]
    base: list[tuple[float, float, int]] = []
    stop = threading.Event()
    t = threading.Thread(target=latencies, args=(a.url, texts, stop, base))
    t.start()
    time.sleep(2.0)
    stop.set()
    t.join(30)
    proc = fleet.redis.proc
    assert proc is not None
    during: dict[str, list[tuple[float, float, int]]] = {a.url: [], b.url: []}
    stop = threading.Event()
    threads = [threading.Thread(target=latencies, args=(u, texts, stop, during[u])) for u in (a.url, b.url)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    proc.send_signal(signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        t0 = time.monotonic()
        r = httpx.post(b.url + "/admin/prefixes", json={"name": "in-the-stall", "text": "x " * 10}, timeout=30)
        admin_s = time.monotonic() - t0
        time.sleep(max(0.0, 3.0 - (time.monotonic() - frozen)))
    finally:
        proc.send_signal(signal.SIGCONT)
    thawed = time.monotonic()
    stop.set()
    for t in threads:
        t.join(30)
    assert r.status_code == 503, r.text
    assert admin_s < 6.0, admin_s
    in_stall = [(lat, code) for u in during for t0, lat, code in during[u] if frozen <= t0 < thawed]
    assert in_stall and all(code == 200 for _, code in in_stall), in_stall
    b50, bmax = statistics.median(x[1] for x in base), max(x[1] for x in base)
    s50, smax = statistics.median(x for x, _ in in_stall), max(x for x, _ in in_stall)
    print(f"SIGSTOP 3 s: {len(in_stall)} requests in the stall, p50 {s50 * 1000:.0f} ms max {smax * 1000:.0f} ms; "
          f"before (one client): p50 {b50 * 1000:.0f} ms max {bmax * 1000:.0f} ms; admin change answered "
          f"{r.status_code} in {admin_s:.2f} s: {r.json()['error']['message'][:120]}")
    assert smax < bmax + 1.0, (smax, bmax)  # nothing waited for the store (its timeout is 1 s)
    assert wait_for(lambda: a.status()["state_store"]["connected"] and b.status()["state_store"]["connected"],
                    timeout=10)
    # if the change reached the store before it froze, it is in force on both now; if not, on neither
    assert wait_for(lambda: ("in-the-stall@1" in a.prefixes()) == ("in-the-stall@1" in b.prefixes()), timeout=7)


def test_the_store_password_appears_nowhere(fleet: Fleet, tmp_path: Path) -> None:  # noqa: F811
    """A password-protected redis-server, the password in the variable the profile names: the replica
    connects; the password is in no process argument, no log line, no status document. A wrong one: the
    store shown unreachable with the reason, still without the password."""
    secret = "s3cret-" + os.urandom(6).hex()
    wrong = "wrong-" + os.urandom(6).hex()
    port = free_port()
    redis = subprocess.Popen([str(RedisServer().binary), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--requirepass", secret],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        addrs = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
        profile = tmp_path / "pw.yaml"
        profile.write_text(f"""
name: fleet-pw
nodes:
  - {{name: p, host: 127.0.0.11, connection: local, roles: [prefill], gpus: 1}}
  - {{name: d, host: 127.0.0.21, connection: local, roles: [decode], gpus: 1}}
router:
  replicas: [{addrs[0]}, {addrs[1]}]
  state_store: redis://127.0.0.1:{port}/0
  state_store_password_env: STORE_PW
""")
        args = [x for u, bp in fleet.bootstrap.items() for x in ("--prefill", f"{u}@{bp}")]
        decode = next(u for u in fleet.a.workers() if u not in fleet.bootstrap)
        args += ["--decode", decode]
        docs = []
        for addr, pw in zip(addrs, (secret, wrong), strict=True):
            log = tmp_path / f"{addr.rsplit(':', 1)[1]}.log"
            with log.open("ab") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "infer_ctl", "router", "serve", "-p", str(profile), "--listen", addr],
                    stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "PYTHONPATH": str(ROOT), "STORE_PW": pw},
                    cwd=ROOT))

            def status(addr: str = addr) -> Any:
                try:
                    return httpx.get(f"http://{addr}/admin/status", timeout=2).json()["state_store"]
                except (httpx.HTTPError, KeyError, ValueError):
                    return None

            assert wait_for(lambda: (s := status()) is not None and (s["connected"] or s["error"] != "not connected yet"),
                            timeout=60)
            time.sleep(1.0)
            docs.append((status(), log))
        (good, good_log), (bad, bad_log) = docs
        assert good["connected"] is True, good
        reason = (bad["error"] or "").lower()
        assert bad["connected"] is False and ("auth" in reason or "password" in reason), bad
        for p in procs:
            cmdline = Path(f"/proc/{p.pid}/cmdline").read_bytes().decode()
            assert secret not in cmdline and wrong not in cmdline
        for text in (json.dumps(good), json.dumps(bad), good_log.read_text(), bad_log.read_text(),
                     httpx.get(f"http://{addrs[0]}/metrics").text):
            assert secret not in text and wrong not in text
        print("wrong password shown as:", bad["error"])
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        redis.kill()
        redis.wait(10)


def test_a_replica_killed_in_the_middle_of_admin_changes_leaves_store_and_others_agreeing(fleet: Fleet) -> None:  # noqa: F811
    a, b = fleet.a, fleet.b
    stop = threading.Event()
    codes: list[int] = []

    def changes() -> None:
        k = 0
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                k += 1
                try:
                    codes.append(c.post(a.url + "/admin/prefixes", json={"name": "k9", "text": f"Text {k}. " * 5}).status_code)
                except httpx.HTTPError:
                    codes.append(-1)
                    return

    t = threading.Thread(target=changes)
    t.start()
    try:
        assert wait_for(lambda: len(codes) >= 5, timeout=30)
        a.kill()
    finally:
        stop.set()
        t.join(30)
        a.proc = None
    store = fleet.redis.client()
    stored = json.loads(store.hget("inferctl:router:{fleet-test}:state", "prefix:k9"))["record"]
    store.close()
    want = sorted((v["version"], v["state"]) for v in stored["versions"])

    def on_b() -> list[tuple[int, str]]:
        return sorted((p["version"], p["state"]) for k, p in b.prefixes().items() if k.startswith("k9@"))

    assert wait_for(lambda: on_b() == want, timeout=7), (on_b(), want)
    assert len(want) >= codes.count(201)  # every change A answered 201 is in the store
    assert httpx.post(b.url + "/admin/prefixes", json={"name": "k9", "text": "After the kill. "}).status_code == 201
    a.start()
    assert wait_for(lambda: sorted((p["version"], p["state"]) for k, p in a.prefixes().items() if k.startswith("k9@"))
                    == on_b(), timeout=5)
    print(f"replica killed after {len(codes)} admin changes ({codes.count(201)} answered 201): "
          f"store and the other replica hold {len(want)} versions")
    assert httpx.post(b.url + "/admin/prefixes/k9/remove").status_code == 200


def _flood(url: str, known: list[str], seconds: float) -> tuple[list[float], int, float]:
    """Two clients send prompts nobody has seen (1200 words each) while a third sends a known one: the known
    one's latencies, the flood's request count, the time it ran. The flood's anchoring must ask for more
    than the 5 % budget on any machine: with 300-word prompts it asked for about 1.6 ms per prompt at
    30-40 prompts/s (just over the budget on a quiet machine), and on a loaded one the in-process
    simulator and clients sent too few for the budget ever to run out (over_budget 0, a CI-like run);
    an anchoring's cost grows with the prompt, the flood's rate much less."""
    import random

    stop = threading.Event()
    codes: list[int] = []

    def flood(k: int) -> None:
        r = random.Random(100 + k)
        with httpx.Client(timeout=30) as c:
            n = 0
            while not stop.is_set():
                n += 1
                codes.append(generate(url, prompt(r, 1200), f"flood-{url[-5:]}-{k}-{n}", client=c).status_code)

    during: list[tuple[float, float, int]] = []
    threads = [threading.Thread(target=flood, args=(k,)) for k in range(2)]
    threads.append(threading.Thread(target=latencies, args=(url, known, stop, during)))
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(60)
    assert set(codes) == {200} and {c for _, _, c in during} == {200}
    return [x[1] for x in during], len(codes), time.monotonic() - t0


def test_a_flood_of_unique_prompts_keeps_first_sight_anchoring_within_its_budget(fleet: Fleet, tmp_path: Path) -> None:  # noqa: F811
    """A flood of unique prompts through replica B: the first-sight anchoring B does on the request path
    stays within 5 % of the time (plus its 50 ms bucket and one overrun), the rest is routed as unseen. The
    known prompt's p50 under the same flood through a single router (no store: first-sight off, every
    prompt anchored after routing, on the same event loop) is the comparison: the anchoring is moved onto
    the request path, not added."""
    import random

    b = fleet.b
    rng = random.Random(11)
    known = [prompt(rng, 60)]
    args = [x for u, bp in fleet.bootstrap.items() for x in ("--prefill", f"{u}@{bp}")]
    args += ["--decode", next(u for u in b.workers() if u not in fleet.bootstrap)]
    profile = tmp_path / "single.yaml"
    profile.write_text("""
name: single
nodes:
  - {name: p, host: 127.0.0.11, connection: local, roles: [prefill], gpus: 1}
  - {name: d, host: 127.0.0.21, connection: local, roles: [decode], gpus: 1}
router:
  health_interval_s: 0.3
""")
    addr = f"127.0.0.1:{free_port()}"
    with (tmp_path / "single.log").open("ab") as err:
        single = subprocess.Popen([sys.executable, "-m", "infer_ctl", "router", "serve", "-p", str(profile), "--listen",
                                   addr, *args], stdout=subprocess.DEVNULL, stderr=err,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    try:
        def up() -> bool:
            try:
                return httpx.get(f"http://{addr}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_for(up, timeout=60)
        results = {}
        for name, url in (("single router", f"http://{addr}"), ("replica B", b.url)):
            for i in range(3):
                generate(url, known[0], f"known-warm-{name[0]}-{i}")
            before = b.status()["kv_events"]["first_sight"]
            lat, n, elapsed = _flood(url, known, 6.0)
            after = b.status()["kv_events"]["first_sight"]
            results[name] = (statistics.median(lat), n, elapsed, {k: after[k] - before[k] for k in after})
        for name, (p50, n, elapsed, first) in results.items():
            print(f"{name}: known prompt p50 {p50 * 1000:.0f} ms under a flood of {n} unique prompts in "
                  f"{elapsed:.1f} s; B's first-sight over that time: {first}")
        first = results["replica B"][3]
        elapsed = results["replica B"][2]
        assert first["over_budget"] > 0  # the flood ran it out of budget: the rest went unseen
        # 5 % of the time, plus the 50 ms bucket, plus the one anchoring that may overrun it
        assert first["seconds"] <= 0.05 * elapsed + 0.05 + 0.1, (first, elapsed)
        assert results["replica B"][0] < 2 * results["single router"][0] + 0.05, results
    finally:
        single.send_signal(signal.SIGTERM)
        try:
            single.wait(20)
        except subprocess.TimeoutExpired:
            single.kill()
