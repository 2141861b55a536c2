"""Speculative requests by temperature band (router/observe/temperature.py): the band of each request, the
decode's window and totals, and the counter `inferctl_router_spec_requests_total` of a live router."""

from __future__ import annotations

import httpx
import pytest

from infer_ctl.core.routing.spec_fields import decode_meta_info
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.router.observe.temperature import BANDS, TemperatureBands, band_of, temperature_of
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.router.conftest import new_spec_stats

META = {"completion_tokens": 8, "spec_verify_ct": 4, "spec_accept_length": 2.0, "spec_accept_rate": 4 / 12,
        "spec_num_correct_drafts": 4, "spec_num_proposed_drafts": 12}


def test_the_band_of_each_request_as_sglang_samples_it() -> None:
    assert temperature_of({"text": "x", "sampling_params": {"temperature": 1.5}}) == 1.5
    assert temperature_of({"text": "x", "temperature": 1.5}) == 1.0  # /generate ignores a top-level one
    assert temperature_of({"messages": [], "temperature": 0.0}) == 0.0
    assert temperature_of({"prompt": "x"}) == 1.0  # SGLang's default
    assert [BANDS[band_of(t)] for t in (0.0, 0.3, 0.7, 0.71, 1.2, 1.21, 2.0)] == [
        "0", "0-0.7", "0-0.7", "0.7-1.2", "0.7-1.2", ">1.2", ">1.2"]


def test_the_window_forgets_the_oldest_and_the_totals_do_not() -> None:
    b = TemperatureBands(window=3)
    for band in (3, 3, 1, 1):
        b.add(band)
    assert b.as_dict() == {"window": {"0": 0, "0-0.7": 2, "0.7-1.2": 0, ">1.2": 1},
                           "total": {"0": 0, "0-0.7": 2, "0.7-1.2": 0, ">1.2": 2}}
    b.restart()
    assert sum(b.as_dict()["window"].values()) == 0 and sum(b.totals) == 4


def test_every_answer_of_a_speculative_decode_is_counted_with_or_without_fields() -> None:
    s = new_spec_stats(window=10)
    # before its /server_info: counted from the speculative fields of its answers
    s.answered("http://d", {"text": "a", "sampling_params": {"temperature": 1.4}}, {}, None, {"meta_info": META})
    s.answered("http://d", {"text": "a"}, {}, None, {"meta_info": {"completion_tokens": 3}})  # unknown yet
    assert decode_meta_info(META) is not None
    assert s.decodes["http://d"].temperature.totals == [0, 0, 0, 1]
    # a speculative decode (its /server_info says so): a chat answer without fields counts too
    s.observe_server_info("http://d", {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 6})
    s.answered("http://d", {"messages": [], "temperature": 0}, {}, None, {"choices": []})
    s.answered("http://d", {"text": "a", "sampling_params": {"temperature": 1.4}}, {}, None, {"meta_info": META})
    assert s.decodes["http://d"].temperature.totals == [1, 0, 0, 2]
    assert s.snapshot()["decodes"][0]["temperature_bands"]["window"] == {"0": 1, "0-0.7": 0, "0.7-1.2": 0, ">1.2": 2}
    s.answered("http://plain", {"text": "a"}, {}, None, {"meta_info": {"completion_tokens": 3}})
    assert "http://plain" not in s.decodes  # not speculative: not counted


@pytest.mark.parametrize("stream", [False, True])
def test_a_live_router_counts_requests_by_band(stream: bool) -> None:
    cluster = start_cluster_in_thread([WorkerSpec("mixed", spec_gamma=6, time_scale=0.05)])
    router = start_router_in_thread(router_config(workers=[cluster.workers[0].url], health_interval_s=0.2))
    try:
        temps = [1.5, 1.5, 0.2, None, 0.0]
        for i, t in enumerate(temps):
            sp = {"max_new_tokens": 4, **({"temperature": t} if t is not None else {})}
            r = httpx.post(router.url + "/generate", json={"text": f"hot {i} " * 5, "sampling_params": sp,
                                                           "stream": stream}, timeout=30)
            assert r.status_code == 200, r.text
        text = httpx.get(router.url + "/metrics", timeout=10).text
        w = cluster.workers[0].url
        got = {b: 0.0 for b in BANDS}
        for line in text.splitlines():
            if line.startswith("inferctl_router_spec_requests_total{") and f'decode="{w}"' in line:
                band = line.split('temperature_band="')[1].split('"')[0]
                got[band] = float(line.rsplit(" ", 1)[1])
        assert got == {"0": 1.0, "0-0.7": 1.0, "0.7-1.2": 1.0, ">1.2": 2.0}, text
        doc = httpx.get(router.url + "/admin/spec", timeout=10).json()
        (d,) = [d for d in doc["decodes"] if d["url"] == w]
        assert d["num_steps"] == 6 and d["temperature_bands"]["window"][">1.2"] == 2
    finally:
        router.stop()
        cluster.stop()
