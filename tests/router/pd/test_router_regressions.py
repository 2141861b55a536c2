"""Whole-router regressions, each against the real router and simulated (or stand-in) workers:
the chars-per-token estimate learned from the first answer, a prefix re-added after its TTL
lapsed keeps its settings, every attempt failing on a worker 5xx gives the router's 502 JSON, n > 1 over
PD refused at once, the predicted index corrected by the cached tokens workers report, `prefixes remove`,
no "warm 2/2" for an expired prefix, the workers table at 80 columns."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from infer_ctl.aio import LoopThread
from infer_ctl.cli.main import main
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.router.conftest import TIME_SCALE
from tests.waiting import wait_for

WORDS = ["account", "billing", "cluster", "deploy", "engine", "fabric", "gateway", "health"]


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _two_workers() -> ThreadedSimCluster:
    return start_cluster_in_thread([WorkerSpec("mixed", time_scale=TIME_SCALE) for _ in range(2)])


@pytest.fixture(scope="module")
def mixed() -> Iterator[ThreadedSimCluster]:
    cluster = _two_workers()
    yield cluster
    cluster.stop()


@pytest.fixture
def fresh() -> Iterator[ThreadedSimCluster]:
    """Two workers of the test's own: in two full-suite runs of 2026-12-01 every generate through the
    module's shared workers after test_readding_a_prefix_after_its_ttl_lapsed_keeps_its_settings timed
    out (30 s), never when this file ran alone; cause not found (see the closing note of that day)."""
    cluster = _two_workers()
    yield cluster
    cluster.stop()


def gen(url: str, text: str, **extra: Any) -> httpx.Response:
    return httpx.post(url + "/generate", timeout=30, json={"text": text, "sampling_params": {"max_new_tokens": 2},
                                                            **extra})


def test_chars_per_token_from_the_first_answer(mixed: ThreadedSimCluster) -> None:
    # long words: ~9 characters per token, far from the 4.0 guess; the capacity follows at once
    with start_router_in_thread(router_config(workers=mixed.urls[:1], health_interval_s=3600)) as router:
        r = router.router
        assert r.chars_per_token == 4.0
        w = r.workers.all()[0]
        assert w.max_total_tokens  # from the start-up health check
        text = " ".join(["inferencecluster"] * 300)
        assert gen(router.url, text).status_code == 200
        tokens = gen(router.url, text).json()["meta_info"]["prompt_tokens"]
        assert abs(r.chars_per_token - len(text) / tokens) < 0.05 * len(text) / tokens
        assert r.index._capacity[w.url] == int(w.max_total_tokens * r.chars_per_token / r.index.block_chars)


def test_readding_a_prefix_after_its_ttl_lapsed_keeps_its_settings(mixed: ThreadedSimCluster) -> None:
    with start_router_in_thread(router_config(workers=mixed.urls, warm_via="pair")) as router:
        url = router.url + "/admin/prefixes"
        assert httpx.post(url, json={"name": "sys", "text": "Policy one. " * 20, "ttl_s": 0.5, "replicas": 2,
                                     "pin": True, "format": "chat"}).status_code == 201

        def state() -> str:
            return str(httpx.get(url).json()["prefixes"][-1]["state"])

        assert wait_for(lambda: state() == "expired", 10)
        listed = httpx.get(url).json()["prefixes"][-1]
        assert all(not rep["warm"] for rep in listed["replicas"])  # expired: warm nowhere
        code = main(["router", "prefixes", "--url", router.url])
        assert code == 0
        p = httpx.post(url, json={"name": "sys", "text": "Policy two. " * 20}).json()["prefix"]
        assert (p["replicas_wanted"], p["pin"], p["ttl_s"], p["format"], p["version"]) == (2, True, 0.5, "chat", 2)


def test_prefixes_remove_and_no_warm_for_expired(fresh: ThreadedSimCluster, capsys: pytest.CaptureFixture[str]) -> None:
    with start_router_in_thread(router_config(workers=fresh.urls, warm_via="pair")) as router:
        url = router.url + "/admin/prefixes"
        httpx.post(url, json={"name": "gone", "text": "Remove me. " * 20, "replicas": 2}).raise_for_status()
        assert wait_for(lambda: sum(r["warm"] for r in httpx.get(url).json()["prefixes"][0]["replicas"]) == 2, 30)  # warm-ups go through real P+D pairs: slow on a loaded machine
        assert main(["router", "prefixes", "expire", "gone", "--url", router.url]) == 0
        capsys.readouterr()
        assert main(["router", "prefixes", "--url", router.url]) == 0
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.strip().startswith("gone"))
        assert "expired" in row and "2/2" not in row
        assert main(["router", "prefixes", "remove", "gone", "--url", router.url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["versions"] == [1]
        assert httpx.get(url).json()["prefixes"] == []
        assert main(["router", "prefixes", "remove", "gone", "--url", router.url]) != 0  # 404: nothing left


class FailingWorker:
    """A stand-in worker: healthy, but every /generate answers 503 with its own JSON body."""

    def __init__(self) -> None:
        self.calls = 0
        self.loop = LoopThread("failing-worker", 10)
        app = web.Application()
        app.router.add_get("/health", self.json({}))
        app.router.add_get("/server_info", self.json({"startup_time": 1}))
        app.router.add_get("/v1/loads", self.json({"loads": []}))
        app.router.add_post("/generate", self.generate)
        self.runner = web.AppRunner(app)
        self.url = self.loop.call(self._start())

    @staticmethod
    def json(doc: dict[str, Any]) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            return web.json_response(doc)

        return handler

    async def _start(self) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    async def generate(self, request: web.Request) -> web.Response:
        self.calls += 1
        return web.json_response({"object": "error", "message": "worker overloaded", "code": 503}, status=503)

    def close(self) -> None:
        self.loop.call(self.runner.cleanup())
        self.loop.close()


def test_every_attempt_failing_on_worker_5xx_gives_the_router_502() -> None:
    workers = [FailingWorker(), FailingWorker()]
    try:
        cfg = router_config(workers=[w.url for w in workers], retry_base_s=0.001, cb_failures=100)
        with start_router_in_thread(cfg) as router:
            r = gen(router.url, "hello there")
            assert r.status_code == 502
            err = r.json()["error"]
            assert err["type"] == "server_error" and err["code"] == 502
            assert "all 3 attempts failed" in err["message"] and "HTTP 503" in err["message"]
            assert "worker overloaded" in err["message"]  # the worker's own words, inside the router's JSON
            assert sum(w.calls for w in workers) == 3
    finally:
        for w in workers:
            w.close()


def test_n_above_one_over_pd_is_refused_at_once(router: RouterHandle) -> None:
    t0 = time.monotonic()
    r = httpx.post(router.url + "/generate", timeout=30,
                   json={"text": "hi", "sampling_params": {"max_new_tokens": 2, "n": 2}})
    assert r.status_code == 400 and "n > 1" in r.json()["error"]["message"]
    r = httpx.post(router.url + "/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 2})
    assert r.status_code == 400 and "n = 3" in r.json()["error"]["message"]
    assert time.monotonic() - t0 < 2  # no retries, no 30 s transfer timeout
    ok = httpx.post(router.url + "/generate", timeout=30, json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200


def test_predicted_index_corrected_by_reported_cached_tokens(fresh: ThreadedSimCluster) -> None:
    """A worker flushed behind the router's back (not through it): the first request that finds its
    prefix gone drops what the worker's LRU dropped before it; newer entries stay predicted."""
    target = fresh.urls[0]
    with start_router_in_thread(router_config(workers=[target], health_interval_s=3600)) as router:
        r = router.router
        rng = random.Random(5)
        p1, p2, p3 = (words(rng, 300) for _ in range(3))
        for p in (p1, p2, p3):
            assert gen(router.url, p + " one").status_code == 200
            time.sleep(0.02)
        now = r.clock()

        def held(p: str) -> int:
            return r.index.match(r.index.hashes(p), [target], now)[target]

        assert held(p1) and held(p2) and held(p3)
        assert httpx.post(target + "/flush_cache", timeout=10).status_code == 200  # bypassing the router
        reply = gen(router.url, p2 + " two").json()
        assert reply["meta_info"]["cached_tokens"] == 0  # gone, though predicted
        assert held(p1) == 0  # used before p2: an LRU evicted it first
        assert held(p3) > 0  # used after p2: nothing says it is gone
        assert held(p2) > 0  # computed again just now


def test_workers_table_fits_80_columns(mixed: ThreadedSimCluster, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """On an 80-column terminal no line is wider than 80 and no column is lost (a table too wide folds
    to `key: value` blocks, output/fit.py); piped, it is one header and one line per worker, unwrapped
    (a pipe has no width to fit)."""
    cols = ("worker", "role", "state", "infl", "reqs", "err", "rst", "index")
    with start_router_in_thread(router_config(workers=mixed.urls)) as router:
        # a terminal 80 columns wide (rich reads both variables); styles stripped before measuring
        monkeypatch.setenv("COLUMNS", "80")
        monkeypatch.setenv("TTY_COMPATIBLE", "1")
        assert main(["router", "workers", "--url", router.url]) == 0
        lines = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out).splitlines()
        assert all(len(line) <= 80 for line in lines), "\n".join(lines)
        shown = [line.split(":")[0].strip() for line in lines if ":" in line]
        header = next((line.split() for line in lines if line.strip().startswith("worker ")), [])
        for col in cols:
            assert col in shown or col in header, "\n".join(lines)
        assert sum(url in "\n".join(lines) for url in mixed.urls) >= len(mixed.urls)
        assert any("index predicted (no KV events)" in line for line in lines)

        monkeypatch.delenv("TTY_COMPATIBLE")  # piped
        assert main(["router", "workers", "--url", router.url]) == 0
        lines = capsys.readouterr().out.splitlines()
        header = next(line for line in lines if line.strip().startswith("worker"))
        for col in cols:
            assert col in header.split()
        for url in mixed.urls:
            (row,) = [line for line in lines if line.startswith(url)]
            assert len(row.split()) >= len(cols), row
        assert any("index predicted (no KV events)" in line for line in lines)


