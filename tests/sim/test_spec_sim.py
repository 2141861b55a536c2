"""Speculative decoding on live simulated workers, read with the same decoder that reads real SGLang
(`infer_ctl.core.routing.spec_fields`): per-domain alpha, drift (schedule and run-time shift), a draft
with a mismatched tokenizer, the interval gauges, /v1/loads and internal_states, PD, and
`--speculative-adaptive`."""

from __future__ import annotations

import concurrent.futures as cf
import json
import random
import time
from typing import Any

import httpx
import pytest

from infer_ctl.core.routing import spec_fields as sf
from infer_ctl.core.sizing.spec import expected_tokens
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from infer_ctl.sim.spec_workload import MISMATCH_ALPHA, DriftStep, SpecWorkload

FAST = 0.002  # wall seconds per model second


def spec_sections(body: dict[str, Any]) -> list[dict[str, float]]:
    """The ranks' `speculative` sections of a `/v1/loads` answer, in SGLang's shape
    (`managers/load_snapshot.py`: {accept_length, accept_rate}; absent before the first interval)."""
    out = [load[sf.LOADS_SECTION] for load in body["loads"] if sf.LOADS_SECTION in load]
    assert all(set(sec) == set(sf.LOADS_FIELDS) for sec in out), out
    return out


def _generate(url: str, n: int, *, domain: str | None = None, tokens: int = 64, tag: str | None = None,
              **extra: Any) -> list[sf.SpecFields | None]:
    """n prompts in one batch; a `tag` makes them (and so their seeded draws) the same on every run."""
    salt = tag if tag is not None else f"q {random.random()}"
    body: dict[str, Any] = {"text": [f"{salt} {i}" for i in range(n)],
                            "sampling_params": {"max_new_tokens": tokens}, **extra}
    if domain is not None:
        body["custom_labels"] = {"domain": domain}
    r = httpx.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return sf.decode_generate_response(r.json())


def _alpha(url: str, requests: int, **kw: Any) -> sf.SpecTally:
    tally = sf.SpecTally()
    for b in range(requests // 50):  # fixed prompts: the same seeded draws on every run
        tally.extend(_generate(url, 50, tag=f"alpha {kw.get('domain')} {b}", **kw))
    assert tally.requests == requests
    return tally


@pytest.fixture(scope="module")
def spec_cluster() -> Any:
    c = start_cluster_in_thread([WorkerSpec("mixed", time_scale=FAST, seed=11)])
    yield c
    c.stop()


@pytest.mark.parametrize(("domain", "alpha"), [("code", 0.88), ("creative", 0.42), (None, 0.8)])
def test_measured_alpha_per_domain_within_002_over_200_requests(spec_cluster: ThreadedSimCluster,
                                                               domain: str | None, alpha: float) -> None:
    tally = _alpha(spec_cluster.urls[0], 200, domain=domain)
    assert tally.alpha == pytest.approx(alpha, abs=0.02)
    # SGLang's own ratios: accept_rate below alpha (chain drafts), proposed = verify_ct x 3
    assert tally.num_proposed_drafts == 3 * tally.verify_ct
    assert tally.accept_rate is not None and tally.accept_rate < alpha
    assert tally.accept_length == pytest.approx(1 + tally.num_correct_drafts / tally.verify_ct, rel=0.1)


def test_meta_info_has_exactly_sglangs_fields_and_only_on_the_final_chunk(spec_cluster: ThreadedSimCluster) -> None:
    url = spec_cluster.urls[0]
    r = httpx.post(url + "/generate", json={"text": "exact fields", "sampling_params": {"max_new_tokens": 30}})
    meta = r.json()["meta_info"]
    assert {k for k in meta if k.startswith("spec_")} == set(sf.META_FIELDS)
    f = sf.decode_meta_info(meta)
    assert f is not None and f.completion_tokens == 30 == meta["completion_tokens"]
    assert f.accept_length == 30 / f.verify_ct and sum(f.correct_drafts_histogram) == f.verify_ct
    body = {"text": "stream it", "stream": True, "sampling_params": {"max_new_tokens": 30}}
    with httpx.stream("POST", url + "/generate", json=body) as resp:
        chunks = [json.loads(ln[5:]) for ln in resp.iter_lines() if ln.startswith("data:") and "[DONE]" not in ln]
    decoded = [sf.decode_generate_response(c)[0] for c in chunks]
    assert all(d is None for d in decoded[:-1]) and decoded[-1] is not None


def test_openai_header_labels_the_domain() -> None:
    """`x-custom-labels` (SGLang's OpenAI label header) picks the domain: accept length is chat's."""
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=FAST, decode_log_interval=10)]) as c:
        url = c.urls[0]
        with httpx.Client(timeout=60, headers={"x-custom-labels": json.dumps({"domain": "chat"})}) as http, \
                cf.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda i: http.post(
                url + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 200},
            ).raise_for_status(), range(32)))
        (load,) = spec_sections(httpx.get(url + "/v1/loads?include=spec").json())
    # ~2.3 tokens per verify at chat's 0.68 (preset default 0.8 would give ~2.95)
    assert load["accept_length"] == pytest.approx(expected_tokens(0.68, 3), rel=0.05)


def test_gauges_loads_and_internal_states_follow_sglangs_intervals() -> None:
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=FAST, decode_log_interval=40),
                                  WorkerSpec("mixed", time_scale=FAST, speculative=False)]) as c:
        url, off = c.urls
        # nothing before the first interval completed
        assert spec_sections(httpx.get(url + "/v1/loads").json()) == []
        (st,) = sf.decode_server_info(httpx.get(url + "/server_info").json())
        assert st == sf.SpecInternalState(None, 3, 4, False)
        assert sf.decode_metrics_text(httpx.get(url + "/metrics").text).accept_length == 0
        fields = _generate(url, 1, tokens=20)  # ~7 decode batches: still no interval
        assert spec_sections(httpx.get(url + "/v1/loads").json()) == []
        fields += _generate(url, 1, tokens=400)
        g = sf.decode_metrics_text(httpx.get(url + "/metrics").text)
        assert g.num_steps == 3 and g.num_draft_tokens == 4
        assert g.accept_length is not None and 2.0 < g.accept_length < 3.6
        assert g.verify_calls_total == sum(f.verify_ct for f in fields if f)
        (load,) = spec_sections(httpx.get(url + "/v1/loads?include=spec").json())
        (st,) = sf.decode_server_info(httpx.get(url + "/server_info").json())
        assert st.avg_accept_length == pytest.approx(load["accept_length"]) and load["accept_rate"] == g.accept_rate
        # include= selects sections as SGLang's LoadSnapshot.to_dict does
        (core,) = httpx.get(url + "/v1/loads?include=core").json()["loads"]
        assert "speculative" not in core and "disaggregation" not in core and "num_running_reqs" in core
        (spec_only,) = httpx.get(url + "/v1/loads?include=spec").json()["loads"]
        assert "speculative" in spec_only and "disaggregation" not in spec_only
        bad = httpx.get(url + "/v1/loads?include=bogus")
        assert bad.status_code == 400 and "Invalid include sections" in bad.json()["detail"]
        # speculation off: no section, no fields, no internal state
        assert _generate(off, 2, tokens=200) == [None, None]
        assert spec_sections(httpx.get(off + "/v1/loads").json()) == []
        assert sf.decode_server_info(httpx.get(off + "/server_info").json())[0].num_steps is None


def test_verify_cost_is_one_plus_steps_times_c() -> None:
    t = WorkerSpec("decode", spec_cost_ratio=0.25).timing()
    base = t.target_step_seconds(4, 1000)
    assert t.decode_step_seconds(4, 1000) == pytest.approx(base * (1 + 3 * 0.25))
    assert t.decode_step_seconds(4, 1000, steps=7) == pytest.approx(base * (1 + 7 * 0.25))
    assert t.decode_step_seconds(4, 1000, steps=0) == pytest.approx(base)


def test_pd_decode_reports_the_fields_the_prefill_none() -> None:
    specs = [WorkerSpec("prefill", time_scale=FAST), WorkerSpec("decode", time_scale=FAST)]
    with start_cluster_in_thread(specs) as c:
        body = {"text": "pd spec", "sampling_params": {"max_new_tokens": 40}, "custom_labels": {"domain": "json"},
                "bootstrap_host": "127.0.0.1", "bootstrap_port": c.workers[0].bootstrap_port,
                "bootstrap_room": random.randint(1, 2**62)}
        with cf.ThreadPoolExecutor(2) as ex:
            fp = ex.submit(httpx.post, c.urls[0] + "/generate", json=body, timeout=20)
            fd = ex.submit(httpx.post, c.urls[1] + "/generate", json=body, timeout=20)
            p, d = fp.result().json(), fd.result().json()
    assert sf.decode_generate_response(p) == [None]
    (f,) = sf.decode_generate_response(d)
    # completion_tokens counts the first token the prefill produced, as on SGLang's decode
    assert f is not None and f.completion_tokens == 40 and f.verify_ct < 40


def test_drift_schedule_changes_a_domains_alpha() -> None:
    # the schedule's clock started 1000 model seconds ago: the step at 500 s has happened, the one at 5000 s not
    workload = SpecWorkload(drift=(DriftStep(500, "chat", 0.3), DriftStep(5000, "chat", 0.9)),
                            epoch=time.monotonic() - 1000 * FAST)
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=FAST, spec_workload=workload)]) as c:
        url = c.urls[0]
        chat = _alpha(url, 200, domain="chat")
        code = _alpha(url, 100, domain="code")
        snap = httpx.get(url + "/sim/spec").json()
    assert chat.alpha == pytest.approx(0.3, abs=0.02)
    assert code.alpha == pytest.approx(0.88, abs=0.025)
    assert snap["alpha"]["chat"] == 0.3 and snap["configured"]["chat"] == 0.68
    assert [s["at_s"] for s in snap["drift"]] == [500, 5000]


def test_runtime_shift_via_admin_api_and_it_survives_a_restart() -> None:
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=FAST, seed=5)]) as c:
        url = c.urls[0]
        assert _alpha(url, 100).alpha == pytest.approx(0.8, abs=0.025)
        r = httpx.post(url + "/sim/spec/alpha", json={"domain": "default", "alpha": 0.4})
        assert r.status_code == 200 and r.json()["alpha"]["default"] == 0.4
        assert _alpha(url, 200).alpha == pytest.approx(0.4, abs=0.02)
        c.start_worker(0)  # the workload is not the server's: a relaunch does not undo the drift
        assert httpx.get(url + "/sim/spec").json()["alpha"]["default"] == 0.4
        for bad in ({"domain": "chat", "alpha": 1.5}, {"domain": "", "alpha": 0.5}, {"alpha": 0.5}, [1]):
            resp = httpx.post(url + "/sim/spec/alpha", json=bad)
            assert resp.status_code == 400 and "error" in resp.json(), bad
        assert httpx.post(url + "/sim/spec/alpha", content=b"{nope").status_code == 400


def test_mismatched_draft_tokenizer_accepts_almost_nothing() -> None:
    workload = SpecWorkload(draft_tokenizer_mismatch=True)
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=FAST, spec_workload=workload)]) as c:
        tally = _alpha(c.urls[0], 100, domain="code")
        off = httpx.get(c.urls[0] + "/sim/spec").json()
    assert tally.alpha is not None and tally.alpha < 0.03
    assert tally.accept_length is not None and tally.accept_length < 1.1
    assert off["draft_tokenizer_mismatch"] is True and set(off["alpha"].values()) == {MISMATCH_ALPHA}


def _steps(url: str) -> tuple[float | None, int | None]:
    gauge = sf.decode_metrics_text(httpx.get(url + "/metrics").text).num_steps
    (state,) = sf.decode_server_info(httpx.get(url + "/server_info").json())
    return gauge, state.num_steps


def test_adaptive_raises_steps_on_high_alpha_and_lowers_them_when_alpha_drops() -> None:
    spec = WorkerSpec("mixed", time_scale=FAST, spec_adaptive=True, decode_log_interval=5, spec_alpha=0.95)
    with start_cluster_in_thread([spec]) as c:
        url = c.urls[0]
        info = httpx.get(url + "/server_info").json()
        assert info["speculative_adaptive"] is True and info["speculative_num_steps"] == 3
        for i in range(3):  # batch size 1: SGLang's slot "1", candidates 1, 3, 5, 7
            _generate(url, 1, tokens=300, tag=f"high {i}")
        high = _steps(url)
        # at 0.95 the EMA of accepted drafts (2.7 at 3 steps, 4.3 at 5) passes the rise thresholds 2.5, 4.5
        assert high[0] == high[1] and high[1] in (5, 7)
        httpx.post(url + "/sim/spec/alpha", json={"domain": "default", "alpha": 0.15}).raise_for_status()
        fields = [f for i in range(3) for f in _generate(url, 1, tokens=300, tag=f"low {i}")]
        low = _steps(url)
        # near 0.15 accepted drafts per step the EMA falls under 1 - 0.5 - 0.25: the smallest candidate (the
        # gauge lags by up to one log interval, and a run of acceptances may probe 3 again for a while)
        assert low[0] is not None and low[1] is not None
        assert low[0] <= 3 and low[1] <= 3 and (low[0] == 1 or low[1] == 1)
        # meta_info counts proposals with the launch step count (SGLang's tokenizer process never sees a switch)
        assert all(f is not None and f.num_proposed_drafts == 3 * f.verify_ct for f in fields)
        snap = httpx.get(url + "/sim/spec").json()
        assert snap["current_steps"] == 1 and snap["adaptive"]["1"]["current_steps"] == 1


def test_adaptive_launch_steps_must_be_a_candidate() -> None:
    with pytest.raises(ValueError, match="not in the adaptive config candidate_steps"):
        WorkerSpec("decode", spec_adaptive=True, spec_gamma=4)
    cfg = {"1": {"candidate_steps": [2, 4]}}
    assert WorkerSpec("decode", spec_adaptive=True, spec_adaptive_config=cfg).timing().spec_gamma == 4
