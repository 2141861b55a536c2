"""The connection cap: past router.max_connections open client connections a new one is
answered `503` with `Retry-After: 1` and a JSON error at once, then closed - not reset - and counted;
connections already open, a stream in flight among them, are untouched. Real sockets against a real router
and simulated workers. Also: the soft RLIMIT_NOFILE raised to the hard one at start, and the default cap
below it."""

from __future__ import annotations

import json
import resource
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.router.daemon import nofile
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread

CAP = 6


@pytest.fixture(scope="module")
def mixed() -> Iterator[ThreadedSimCluster]:
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.2)])
    yield cluster
    cluster.stop()


def _wait_open(router: RouterHandle, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(router.server.http.conns) != n:
        assert time.monotonic() < deadline, f"{len(router.server.http.conns)} connections open, not {n}"
        time.sleep(0.01)


def _raw_get(url: str, path: str = "/health") -> bytes:
    """A plain HTTP/1.1 GET on a new socket; everything the router sends until it closes (a reset raises)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


def test_past_the_cap_a_new_client_gets_503_and_open_streams_continue(mixed: ThreadedSimCluster) -> None:
    with start_router_in_thread(router_config(workers=mixed.urls, max_connections=CAP)) as router, \
            httpx.Client(timeout=30) as client:
        idle: list[socket.socket] = []
        try:
            body = {"text": "a stream that outlives the refusal", "stream": True,
                    "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}
            with client.stream("POST", router.url + "/generate", json=body) as stream:
                assert stream.status_code == 200
                lines = stream.iter_lines()
                first = next(line for line in lines if line.startswith("data:"))
                host, port = router.url.removeprefix("http://").split(":")
                for _ in range(CAP - 1):  # idle: connected, nothing sent (the slow-header attack's shape)
                    idle.append(socket.create_connection((host, int(port)), timeout=10))
                _wait_open(router, CAP)
                answer = _raw_get(router.url)  # the CAP+1th: answered, then closed (recv would raise on a reset)
                head, _, doc = answer.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 503 "), answer
                assert b"\r\nRetry-After: 1\r\n" in head + b"\r\n" and b"\r\nConnection: close\r\n" in head + b"\r\n"
                err = json.loads(doc)["error"]
                assert err["type"] == "server_error" and err["code"] == 503 and f"{CAP} open connections" in err["message"]
                rest = [line for line in lines if line.startswith("data:")]
            assert rest[-1] == "data: [DONE]", rest[-3:]
            tokens = sum(len(json.loads(line[5:]).get("output_ids") or []) for line in [first, *rest[:-1]])
            assert tokens in (64, json.loads(rest[-2][5:])["meta_info"]["completion_tokens"])
            # the stream's connection is back to idle: one slot frees when an idle client leaves
            idle.pop().close()
            _wait_open(router, CAP - 1)
            assert _raw_get(router.url).startswith(b"HTTP/1.1 200 ")
            _wait_open(router, CAP - 1)
            for s in idle:
                s.close()
            idle.clear()
            _wait_open(router, 1)  # the stream's keep-alive connection
            fams = {f.name: f for f in text_string_to_metric_families(client.get(router.url + "/metrics").text)}
            assert fams["inferctl_router_connections_refused"].samples[0].value == 1
            assert fams["inferctl_router_connections_open"].samples[0].value == 1
        finally:
            for s in idle:
                s.close()


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one_at_start(mixed: ThreadedSimCluster) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lower = min(1024, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lower, hard))
    try:
        with start_router_in_thread(router_config(workers=mixed.urls)) as router:
            now = resource.getrlimit(resource.RLIMIT_NOFILE)
            assert now[0] == hard or (hard == resource.RLIM_INFINITY and now[0] > lower)
            assert router.server.http.max_connections == nofile.default_max_connections(now[0], 1024)
            assert router.server.http.max_refusing == nofile.refusing_budget(now[0])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_default_cap_leaves_headroom_under_the_limit() -> None:
    """Clients, two upstream connections per request in flight, the lingering refusals and the reserve fit
    under the limit. Before, the cap was the limit less 256: with 256 refusals lingering, the accept failed
    with EMFILE at 22,000 connections on a 20,000 limit and clients past the cap were reset."""
    for soft, mc in ((1024, 1024), (20_000, 1024), (65_536, 1024), (1 << 20, 1024), (4096, 16), (100, 1024)):
        cap = nofile.default_max_connections(soft, mc)
        if soft > 200:
            assert cap + 2 * min(cap, mc) + nofile.refusing_budget(soft) + nofile.RESERVE <= soft, (soft, mc)
        assert 1 <= cap <= nofile.DEFAULT_MAX
    assert nofile.default_max_connections(20_000, 1024) == 20_000 - 64 - 1024 - 2 * 1024
    assert nofile.default_max_connections(1 << 20, 1024) == nofile.DEFAULT_MAX
    assert nofile.default_max_connections(1024, 1024) == (1024 - 64 - 128) // 3  # few descriptors: a third
    assert nofile.refusing_budget(1024) == 128 and nofile.refusing_budget(1 << 20) == nofile.MAX_REFUSING


def test_the_cap_flows_from_the_profile() -> None:
    from infer_ctl.errors import ProfileError
    from infer_ctl.profile import parse_profile_text
    from infer_ctl.router.config import from_profile
    from tests.router.kvindex.test_kv_config import BASE

    assert from_profile(parse_profile_text(BASE, "p.yaml"), env={}).settings.max_connections is None
    cfg = from_profile(parse_profile_text(BASE + "router: {max_connections: 5000}\n", "p.yaml"), env={})
    assert cfg.settings.max_connections == 5000
    with pytest.raises(ProfileError):
        parse_profile_text(BASE + "router: {max_connections: 0}\n", "p.yaml")
