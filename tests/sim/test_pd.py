"""PD disaggregation over real HTTP: the bootstrap server, room matching and each failure mode."""

from __future__ import annotations

import concurrent.futures as cf
import random
import time
from typing import Any

import httpx
import pytest

from infer_ctl.sim.cluster import ThreadedSimCluster


def _pd_body(cluster: ThreadedSimCluster, text: str, room: int | None, prefill: int = 1, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"text": text, "sampling_params": {"max_new_tokens": 8}, **extra}
    body["bootstrap_host"] = "127.0.0.1"
    body["bootstrap_port"] = cluster.workers[prefill].bootstrap_port
    if room is not None:
        body["bootstrap_room"] = room
    return body


def _send_pair(cluster: ThreadedSimCluster, p_body: dict[str, Any], d_body: dict[str, Any], prefill: int = 1
               ) -> tuple[httpx.Response, httpx.Response]:
    """What a PD router does: POST to the prefill and the decode concurrently."""
    with cf.ThreadPoolExecutor(2) as ex:
        fp = ex.submit(httpx.post, cluster.urls[prefill] + "/generate", json=p_body, timeout=20)
        fd = ex.submit(httpx.post, cluster.urls[2] + "/generate", json=d_body, timeout=20)
        return fp.result(), fd.result()


def _room() -> int:
    return random.randint(1, 2**62)


def test_paired_request_succeeds_and_decode_reports_prefill_cached_tokens(cluster: ThreadedSimCluster) -> None:
    system = "You are the support bot of Example Corp. " * 20
    for i in range(2):
        body = _pd_body(cluster, system + f"question {i}", _room())
        p, d = _send_pair(cluster, body, body)
        assert p.status_code == 200 and d.status_code == 200, (p.text, d.text)
        assert p.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
        assert d.json()["meta_info"]["completion_tokens"] == 8
        assert d.json()["meta_info"]["cached_tokens"] == p.json()["meta_info"]["cached_tokens"]
    # the second request reused the shared system prompt on the prefill, and the decode says so
    assert d.json()["meta_info"]["cached_tokens"] > 100


def test_pd_streaming_through_the_decode(cluster: ThreadedSimCluster) -> None:
    body = _pd_body(cluster, "stream me", _room(), stream=True)
    with cf.ThreadPoolExecutor(1) as ex:
        fp = ex.submit(httpx.post, cluster.urls[1] + "/generate", json=body, timeout=20)
        with httpx.stream("POST", cluster.urls[2] + "/generate", json=body, timeout=20) as r:
            lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
        assert fp.result().status_code == 200
    assert lines[-1] == "data: [DONE]" and len(lines) >= 3


def test_batch_with_scalar_room_expands_to_room_plus_i(cluster: ThreadedSimCluster) -> None:
    room = _room()
    body = _pd_body(cluster, "", room)
    body["text"] = ["first prompt", "second prompt"]
    p, d = _send_pair(cluster, body, body)
    assert p.status_code == 200 and d.status_code == 200, d.text
    assert len(d.json()) == 2


def test_missing_room_is_400_on_both_roles(cluster: ThreadedSimCluster) -> None:
    for i in (1, 2):
        r = httpx.post(cluster.urls[i] + "/generate", json={"text": "x"})
        assert r.status_code == 400 and "without bootstrap room id" in r.json()["error"]["message"]


def test_mispaired_rooms_fail_on_both_sides_within_the_timeout(cluster: ThreadedSimCluster) -> None:
    # a broken router: the decode gets a different room than the prefill
    t0 = time.monotonic()
    p, d = _send_pair(cluster, _pd_body(cluster, "hello", _room()), _pd_body(cluster, "hello", _room()))
    assert p.status_code == 500 and "KVPoll.Bootstrapping" in p.json()["message"]
    # SGLang renders a non-400 abort through its HTTPException handler as an ErrorResponse
    assert p.json()["object"] == "error" and p.json()["type"] == "500" and p.json()["code"] == 500
    assert d.status_code == 500 and "KV" in d.json()["message"]
    assert time.monotonic() - t0 < 5


def test_same_room_different_prompts_is_a_transfer_failure(cluster: ThreadedSimCluster) -> None:
    room = _room()
    p, d = _send_pair(cluster, _pd_body(cluster, "prompt A", room), _pd_body(cluster, "prompt B", room))
    assert p.status_code == 500 and d.status_code == 500
    assert "does not match" in d.json()["message"] and "does not match" in p.json()["message"]


def test_decode_pointed_at_the_wrong_prefill_fails(cluster: ThreadedSimCluster) -> None:
    room = _room()
    good = _pd_body(cluster, "which prefill?", room, prefill=1)
    wrong = _pd_body(cluster, "which prefill?", room, prefill=3)  # bootstrap of another prefill
    p, d = _send_pair(cluster, good, wrong)
    assert p.status_code == 500 and d.status_code == 500


def test_room_zero_is_never_valid(cluster: ThreadedSimCluster) -> None:
    p, d = _send_pair(cluster, _pd_body(cluster, "zero", 0), _pd_body(cluster, "zero", 0))
    assert p.status_code == 500 and d.status_code == 500
    assert "room 0" in d.json()["message"]


def test_unreachable_bootstrap_server_fails_fast(cluster: ThreadedSimCluster) -> None:
    body = _pd_body(cluster, "nobody home", _room())
    body["bootstrap_port"] = 1  # nothing listens there
    r = httpx.post(cluster.urls[2] + "/generate", json=body, timeout=20)
    assert r.status_code == 500 and "cannot reach the prefill bootstrap server" in r.json()["message"]


def test_bootstrap_server_routes(cluster: ThreadedSimCluster) -> None:
    base = f"http://127.0.0.1:{cluster.workers[1].bootstrap_port}"
    assert httpx.get(base + "/health").text == "OK"
    assert "prefill_dp_size" in httpx.get(base + "/route", params={"engine_rank": -1}).json()


def test_stream_failure_is_an_abort_chunk_on_a_200_stream(cluster: ThreadedSimCluster) -> None:
    body = _pd_body(cluster, "lonely", _room(), stream=True)  # no prefill request ever comes
    with httpx.stream("POST", cluster.urls[2] + "/generate", json=body, timeout=20) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert '"type":"abort"' in lines[0] and lines[-1] == "data: [DONE]"


@pytest.mark.parametrize("path", ["/v1/chat/completions"])
def test_openai_pd(cluster: ThreadedSimCluster, path: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
            "bootstrap_host": "127.0.0.1", "bootstrap_port": cluster.workers[1].bootstrap_port,
            "bootstrap_room": _room()}
    with cf.ThreadPoolExecutor(2) as ex:
        fp = ex.submit(httpx.post, cluster.urls[1] + path, json=body, timeout=20)
        fd = ex.submit(httpx.post, cluster.urls[2] + path, json=body, timeout=20)
        assert fp.result().status_code == 200
        assert fd.result().json()["usage"]["completion_tokens"] == 5


def test_fake_bootstrap_host_computes_but_never_caches(cluster: ThreadedSimCluster) -> None:
    """SGLang 0.5.23: Req.skip_radix_cache_insert = (bootstrap_host == "2.2.2.2"), so a fake-host request
    (health check, "warm-up") reads the radix cache but never fills it."""
    prompt = f"fake host warm-up {_room()} " + "shared prefix words " * 40
    fake = {"text": prompt, "sampling_params": {"max_new_tokens": 4}, "bootstrap_host": "2.2.2.2",
            "bootstrap_port": 8998, "bootstrap_room": 0}
    url = cluster.urls[3] + "/generate"
    first = httpx.post(url, json=fake, timeout=20)
    assert first.status_code == 200, first.text
    assert first.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    again = httpx.post(url, json=fake, timeout=20).json()
    assert again["meta_info"]["cached_tokens"] == 0  # the first one was computed, not cached
    body = _pd_body(cluster, prompt, _room(), prefill=3)
    p, d = _send_pair(cluster, body, body, prefill=3)
    assert p.status_code == 200 and d.status_code == 200, (p.text, d.text)
    assert d.json()["meta_info"]["cached_tokens"] == 0  # nor did the fake requests warm the real pair
    after = httpx.post(url, json=fake, timeout=20).json()  # a real request does fill it; fake ones read it
    # - 2: an EAGLE tree (the default preset) matches n - 1 tokens as n - 2 bigrams, as SGLang does
    assert after["meta_info"]["cached_tokens"] == after["meta_info"]["prompt_tokens"] - 2


# -- n > 1 (parallel sampling) in PD mode: what SGLang 0.5.23 does with bootstrap rooms -------------------
def test_parallel_samples_of_a_prompt_share_its_room() -> None:
    """_normalize_bootstrap_params + tokenizer_manager's n > 1 path: every sample of prompt i gets
    prompt i's room (a scalar room gives prompt i room+i; a list gives list[i]), whatever was sent."""
    from infer_ctl.sim.protocol import parse_generate, parse_openai
    from infer_ctl.sim.tokenizer import make_tokenizer

    tok = make_tokenizer(None)
    base = {"text": ["a", "b"], "sampling_params": {"n": 2}, "bootstrap_host": "h", "bootstrap_port": 1}
    rooms = [it.pd.room for it in parse_generate({**base, "bootstrap_room": 10}, tok).items]
    assert rooms == [10, 11, 10, 11]
    rooms = [it.pd.room for it in parse_generate({**base, "bootstrap_room": [7, 3]}, tok).items]
    assert rooms == [7, 3, 7, 3]
    chat = {"messages": [{"role": "user", "content": "hi"}], "n": 3, "bootstrap_room": [5, 6, 7]}
    assert [it.pd.room for it in parse_openai(chat, tok, chat=True).items] == [5, 5, 5]
    assert [it.pd.room for it in parse_openai({**chat, "bootstrap_room": 9}, tok, chat=True).items] == [9, 9, 9]
    single = parse_generate({"text": ["a", "b"], "bootstrap_room": 10}, tok)  # n = 1: room+i per prompt
    assert [it.pd.room for it in single.items] == [10, 11]


def test_generate_batch_with_n2_fails_on_a_pd_pair(cluster: ThreadedSimCluster) -> None:
    """The max_new_tokens=0 warm-up of each prompt pairs, then its n samples share one room at once:
    on a real pair that corrupts the room's transfer (decode aborts), so the simulated pair fails."""
    room = _room()
    body = _pd_body(cluster, "", room)
    body["text"] = ["first parallel prompt", "second parallel prompt"]
    body["sampling_params"] = {"max_new_tokens": 4, "n": 2}
    p, d = _send_pair(cluster, body, body)
    assert p.status_code == 500 and d.status_code == 500, (p.text, d.text)
    assert f"bootstrap_room={room}" in p.json()["message"] and "share the room" in p.json()["message"]


def test_n2_through_the_fake_bootstrap_host_succeeds(cluster: ThreadedSimCluster) -> None:
    # FakeKVSender/FakeKVReceiver keep no per-room state: a real pair accepts it, so does the sim
    body = {"text": "fake parallel", "sampling_params": {"max_new_tokens": 3, "n": 2},
            "bootstrap_host": "2.2.2.2", "bootstrap_port": 8998, "bootstrap_room": 0}
    p, d = _send_pair(cluster, body, body)
    assert p.status_code == 200 and d.status_code == 200, (p.text, d.text)
    assert [o["meta_info"]["completion_tokens"] for o in d.json()] == [3, 3]


def test_n2_on_a_mixed_worker_caches_the_prefix_first(cluster: ThreadedSimCluster) -> None:
    """SGLang sends each prompt once with max_new_tokens=0 before its samples: they find it cached."""
    body = {"text": f"mixed parallel {_room()} " + "words " * 30, "sampling_params": {"max_new_tokens": 3, "n": 2}}
    out = httpx.post(cluster.urls[0] + "/generate", json=body, timeout=20).json()
    # - 2: an EAGLE tree (the default preset) matches n - 1 tokens as n - 2 bigrams, as SGLang does
    assert [o["meta_info"]["cached_tokens"] for o in out] == [o["meta_info"]["prompt_tokens"] - 2 for o in out]


# -- stopping a decode drops its connections like a killed process ------------------------------------------
def test_stopping_a_decode_closes_its_in_flight_connections_promptly() -> None:
    from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread

    specs = [WorkerSpec("prefill", time_scale=0.02, bootstrap_timeout_s=30.0),
             WorkerSpec("decode", time_scale=0.02, waiting_timeout_s=30.0)]
    with start_cluster_in_thread(specs) as c:
        port = c.workers[0].bootstrap_port
        lonely = {"text": "no prefill ever", "sampling_params": {"max_new_tokens": 4},
                  "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": _room()}
        busy = {"text": "long decode", "sampling_params": {"max_new_tokens": 100_000}, "stream": True,
                "bootstrap_host": "2.2.2.2", "bootstrap_port": port, "bootstrap_room": 0}

        def stream_busy() -> str:
            with httpx.stream("POST", c.urls[1] + "/generate", json=busy, timeout=25) as r:
                for _ in r.iter_lines():
                    pass
            return "ended"

        with cf.ThreadPoolExecutor(2) as ex:
            waiting = ex.submit(httpx.post, c.urls[1] + "/generate", json=lonely, timeout=25)  # in KvReceiver.fetch
            running = ex.submit(stream_busy)
            time.sleep(0.5)
            assert not waiting.done() and not running.done()
            t0 = time.monotonic()
            c.stop_worker(1)
            for fut in (waiting, running):
                with pytest.raises(httpx.TransportError):  # dropped, not answered (nor timed out)
                    fut.result(timeout=5)
            assert time.monotonic() - t0 < 5
        c.start_worker(1)  # the same port serves again
        assert httpx.get(c.urls[1] + "/health", timeout=5).status_code == 200
