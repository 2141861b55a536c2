"""The router in front of real SGLang 0.5.23 (CPU backend), collocated and PD over Mooncake's TCP
transport: every route a client uses, with the OpenAI SDK as the client of the OpenAI routes, and the
engine's own errors passed through intact.

Before the router sent `Content-Type: application/json` upstream, SGLang answered every one of these
requests 400 ("Unsupported Media Type" on the OpenAI routes, a validation error on /generate).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from tests.engine.conftest import Fleet
from tests.waiting import wait_for

CHAT = [{"role": "system", "content": "You are the billing assistant of a bank."},
        {"role": "user", "content": "What is the capital of France?"}]


def _router(**kw: Any) -> RouterHandle:
    kw.setdefault("health_interval_s", 0.5)
    return start_router_in_thread(router_config(**kw))


@pytest.fixture(scope="module")
def colloc_router(engine_fleet: Fleet) -> Iterator[RouterHandle]:
    handle = _router(workers=[engine_fleet.colloc.url], tokenizer_path=engine_fleet.models.config)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def pd_router(engine_fleet: Fleet) -> Iterator[RouterHandle]:
    p, d = engine_fleet.prefill, engine_fleet.decode
    handle = _router(prefill=[(p.url, p.bootstrap_port)], decode=[d.url], tokenizer_path=engine_fleet.models.jinja)
    yield handle
    handle.stop()


@pytest.fixture(params=["collocated", "pd"])
def routed(request: pytest.FixtureRequest) -> RouterHandle:
    name = "colloc_router" if request.param == "collocated" else "pd_router"
    handle: RouterHandle = request.getfixturevalue(name)
    return handle


def _client(router: RouterHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_generate(routed: RouterHandle) -> None:
    r = httpx.post(routed.url + "/generate", timeout=60,
                   json={"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 5, "temperature": 0}})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert len(doc["output_ids"]) == 5 and doc["meta_info"]["completion_tokens"] == 5
    assert doc["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


def test_completions_n_stop_logprobs(routed: RouterHandle) -> None:
    client = _client(routed)
    if routed.router.cfg.workers[0].role != "mixed":
        # SGLang 0.5.23 over PD answers n = 2 with ONE sample (a prefill and a decode given the same body
        # and room, measured here): the router refuses it with the reason instead of losing samples
        with pytest.raises(openai.BadRequestError, match="parallel sampling"):
            client.completions.create(model="tiny", prompt="fox", max_tokens=2, n=2)
        out = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=4, logprobs=2)
        assert out.choices[0].logprobs is not None and len(out.choices[0].logprobs.token_logprobs or []) == 4
        return
    out = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=4, n=2,
                                    logprobs=2, temperature=0.8)
    assert [c.index for c in out.choices] == [0, 1]
    for c in out.choices:
        assert c.logprobs is not None and len(c.logprobs.token_logprobs or []) == 4
    assert out.usage is not None and out.usage.completion_tokens == 8
    # a stop string: the engine cuts the text at it (the noise model emits it only by chance, so the test
    # takes a string from a first greedy answer and asks again)
    first = client.completions.create(model="tiny", prompt="Paris is", max_tokens=8, temperature=0)
    text = first.choices[0].text
    if len(text.strip()) >= 2:
        stop = text.strip()[-1]
        again = client.completions.create(model="tiny", prompt="Paris is", max_tokens=8, temperature=0, stop=[stop])
        assert stop not in again.choices[0].text and again.choices[0].finish_reason == "stop"


def test_chat_and_streamed_chat_with_usage(routed: RouterHandle) -> None:
    client = _client(routed)
    out = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4)  # type: ignore[arg-type]
    assert out.choices[0].message.role == "assistant" and out.usage is not None
    assert out.usage.completion_tokens == 4
    stream = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6, stream=True,  # type: ignore[arg-type]
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert any(c.choices and c.choices[0].finish_reason == "length" for c in chunks)


def test_streamed_completion_raw_sse(routed: RouterHandle) -> None:
    with httpx.stream("POST", routed.url + "/v1/completions", timeout=60,
                      json={"model": "tiny", "prompt": "fox", "max_tokens": 3, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert all(ln.startswith("data: ") for ln in lines)


@pytest.mark.parametrize("body,needle", [
    ({"model": "tiny", "prompt": "hi", "max_tokens": 2, "temperature": -1}, "temperature must be a non-negative"),
    ({"model": "tiny", "prompt": "fox " * 5000, "max_tokens": 2}, "longer than the model's context length"),
])
def test_engine_errors_pass_through_intact(routed: RouterHandle, engine_fleet: Fleet, body: dict[str, Any],
                                           needle: str) -> None:
    direct = engine_fleet.colloc.post("/v1/completions", body)
    via = httpx.post(routed.url + "/v1/completions", json=body, timeout=60)
    assert direct.status_code == 400 and needle in direct.json()["message"]
    assert via.status_code == direct.status_code, via.text
    assert via.json()["message"] == direct.json()["message"]
    # and through the SDK: the engine's message reaches the user
    with pytest.raises(openai.BadRequestError, match=needle.split()[0]):
        _client(routed).completions.create(**body)


def test_abort_on_client_disconnect(routed: RouterHandle, engine_fleet: Fleet) -> None:
    """A client that goes away mid-generation: the engine aborts the request (its running count falls back
    to zero) instead of generating the remaining tokens for nobody."""
    servers = [engine_fleet.colloc] if routed.router.cfg.workers[0].role == "mixed" else [engine_fleet.decode]
    body = json.dumps({"text": "fox", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
                       "stream": True}).encode()
    host, port = routed.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")

    def running() -> float:
        text = servers[0].get("/metrics").text
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                   if ln.startswith("sglang:num_running_reqs"))

    assert wait_for(lambda: running() >= 1, timeout=30)
    sock.close()
    t0 = time.monotonic()
    assert wait_for(lambda: running() == 0, timeout=30), "the engine kept generating for a gone client"
    assert time.monotonic() - t0 < 30


def test_router_spec_reads_the_engines_meta_info(routed: RouterHandle) -> None:
    """`router spec` over real SGLang without a draft model (EAGLE does not run on the CPU device): the
    router read the engine's meta_info on every answer and reports no speculative decoding, not an error
    or invented acceptance."""
    import subprocess
    import sys

    httpx.post(routed.url + "/generate", timeout=60, json={"text": "fox", "sampling_params": {"max_new_tokens": 3}})
    proc = subprocess.run([sys.executable, "-m", "infer_ctl", "router", "spec", "--url", routed.url, "--json"],
                          capture_output=True, text=True, timeout=60)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["exit_code"] == 0, proc.stdout + proc.stderr
    assert doc["router_url"] == routed.url
    # no decode reports speculative fields, so none is listed with an acceptance it does not have
    assert doc["speculative"]["decodes"] == [] and doc["speculative"]["labels"] == {}, doc
