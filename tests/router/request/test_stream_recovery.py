"""Mid-stream recovery: a decode killed while it streams 128-token greedy answers under
load; with recovery on every stream ends normally and its text equals a run without the kill, with no
token twice or missing; with it off the broken streams end with an error event (as before).

Real: the router, simulated SGLang workers (PD over the simulated bootstrap, real HTTP on loopback); the
kill aborts every socket of the decode's server at once, as a dead process's kernel does. The
simulator's greedy tokens are a function of the whole context (sim/engine.py, greedy_token), as a
model's are, so a continuation from prompt + emitted ids must reproduce the uninterrupted text."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from infer_ctl.router.daemon.embed import RouterHandle
from infer_ctl.sim.cluster import ThreadedSimCluster, start_cluster_in_thread
from tests.router.conftest import pd_router, pd_specs

N_STREAMS = 12
TOKENS = 128


@pytest.fixture
def cluster() -> Iterator[ThreadedSimCluster]:
    c = start_cluster_in_thread(pd_specs(2, 3, time_scale=0.4))
    yield c
    c.stop()


def _body(i: int, **sp: object) -> dict[str, object]:
    return {"text": f"stream {i}: tell me about the river and the mill " * 3, "stream": True,
            "sampling_params": {"max_new_tokens": TOKENS, "temperature": 0, **sp}}


def _stream(url: str, body: dict[str, object], progress: list[int], slot: int) -> list[dict]:
    events = []
    with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
                progress[slot] = len(events)
    return events


def _run(router: RouterHandle, bodies: list[dict], kill: ThreadedSimCluster | None = None) -> list[list[dict]]:
    out: list[list[dict]] = [[] for _ in bodies]
    progress = [0] * len(bodies)

    def one(i: int) -> None:
        out[i] = _stream(router.url, bodies[i], progress, i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    if kill is not None:
        deadline = time.monotonic() + 30
        # every stream past its second event: a cut before it is the documented not-continuable case (a
        # stream still starting when half the others were under way was cut there once in a loaded run)
        while min(progress) < 8 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert max(progress) < TOKENS, "the streams finished before the kill: slow the simulator down"
        decode = next(i for i, w in enumerate(kill.workers) if w.spec.role == "decode")
        kill.stop_worker(decode)
    for t in threads:
        t.join(90)
    return out


def _text(events: list[dict]) -> str:
    return events[-1]["text"]


def _errors(runs: list[list[dict]]) -> int:
    return sum(any("error" in e for e in ev) for ev in runs)


def _metric(router: RouterHandle, outcome: str) -> float:
    for line in httpx.get(router.url + "/metrics").text.splitlines():
        if line.startswith(f'inferctl_router_stream_recoveries_total{{outcome="{outcome}"}}'):
            return float(line.split()[-1])
    return 0.0


def _requests(router: RouterHandle, status: int) -> float:
    prefix = f'inferctl_router_requests_total{{endpoint="/generate",status="{status}"}}'
    return sum(float(ln.split()[-1]) for ln in httpx.get(router.url + "/metrics").text.splitlines()
               if ln.startswith(prefix))


def test_a_killed_decode_loses_no_stream_and_changes_no_text(cluster: ThreadedSimCluster) -> None:
    bodies = [_body(i) for i in range(N_STREAMS)]
    router = pd_router(cluster, health_interval_s=0.5)
    try:
        reference = _run(router, bodies)
        assert _errors(reference) == 0
        killed = _run(router, bodies, kill=cluster)
        assert _errors(killed) == 0, [e[-1] for e in killed if "error" in e[-1]]
        for ref, got in zip(reference, killed, strict=True):
            assert _text(got) == _text(ref)
            meta = got[-1]["meta_info"]
            assert meta["completion_tokens"] == TOKENS and meta["prompt_tokens"] == ref[-1]["meta_info"]["prompt_tokens"]
            ids = [t for e in got for t in e["output_ids"]]  # the simulator's ids are per-event deltas
            assert ids == [t for e in ref for t in e["output_ids"]]  # no token twice, none missing
            assert len({e["meta_info"]["id"] for e in got}) == 1  # one stream, one id
        resumed = _metric(router, "resumed")
        print(f"resumed {resumed:g} of {N_STREAMS} streams")
        assert resumed >= 1
        # a resumed stream is a success: counted 200 (its error-free end), never the break's 502
        assert _requests(router, 200) == 2 * N_STREAMS and _requests(router, 502) == 0
    finally:
        router.stop()


def test_with_recovery_off_a_killed_decode_ends_its_streams_with_an_error_event(cluster: ThreadedSimCluster) -> None:
    router = pd_router(cluster, health_interval_s=0.5, stream_recovery=False)
    try:
        killed = _run(router, [_body(i) for i in range(N_STREAMS)], kill=cluster)
        assert _errors(killed) >= 1
        assert _metric(router, "resumed") == 0
        # each stream ended by the error event counts as its 502 (router.md: "counts that status")
        assert _requests(router, 502) == _errors(killed)
        assert _requests(router, 200) == N_STREAMS - _errors(killed)
    finally:
        router.stop()


def test_a_stream_that_cannot_continue_exactly_ends_with_the_error_event(cluster: ThreadedSimCluster) -> None:
    router = pd_router(cluster, health_interval_s=0.5)
    try:
        seeded = [_body(i, temperature=0.7, sampling_seed=7) for i in range(N_STREAMS)]
        killed = _run(router, seeded, kill=cluster)
        assert _errors(killed) >= 1
        assert _metric(router, "not_continuable") >= 1 and _metric(router, "resumed") == 0
        assert _requests(router, 502) == _errors(killed)
    finally:
        router.stop()
