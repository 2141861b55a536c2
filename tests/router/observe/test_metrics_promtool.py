"""Every router endpoint that serves metrics passes `promtool check metrics`: /metrics of
one process, and the merged exposition several processes answer with (scaleout/metrics_merge.py). The
pair KV gauges were `..._speed_gb_s` / `..._latency_ms` (abbreviated, non-base units); promtool is run
when installed (Debian's `prometheus` package), else the same naming rules are applied here."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.router.config import PrefixSpec
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.router.observe.tenants import TenantSpec, key_digest
from infer_ctl.router.scaleout.metrics_merge import merge
from infer_ctl.sim.cluster import start_cluster_in_thread
from tests.router.conftest import pd_specs

KEY = "promtool-key-0123456789abcdef"
#: promtool's (client_golang promlint) unit abbreviations and non-base units
_ABBREVIATED = {"s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d"}
_NON_BASE = re.compile(r"_(milliseconds|microseconds|nanoseconds|minutes|hours|days|weeks|months|years|"
                       r"kilobytes|megabytes|gigabytes|terabytes|petabytes|bits|percent)(_|$)")


def lint(text: str) -> list[str]:
    """promtool's problems, or the same rules applied to the parsed exposition when it is not installed."""
    promtool = shutil.which("promtool")
    if promtool is not None:
        out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        return [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    problems = []
    for fam in text_string_to_metric_families(text):
        if not fam.documentation:
            problems.append(f"{fam.name} no help text")
        if set(fam.name.split("_")) & _ABBREVIATED:
            problems.append(f"{fam.name} metric names should not contain abbreviated units")
        if _NON_BASE.search(fam.name):
            problems.append(f"{fam.name} use base unit")
    return problems


def test_the_rules_catch_the_old_pair_names() -> None:
    bad = ("# HELP inferctl_router_pair_kv_transfer_speed_gb_s x\n# TYPE inferctl_router_pair_kv_transfer_speed_gb_s gauge\n"
           'inferctl_router_pair_kv_transfer_speed_gb_s{prefill="a",decode="b"} 1.0\n')
    assert lint(bad), "the old name passed"


@pytest.fixture(scope="module")
def scrape() -> Iterator[str]:
    """A PD router's /metrics with every family present: tenants, a named prefix, streams, a refusal, and
    the pair KV gauges (the prefill's /v1/loads reports the last transfer; the health check reads it)."""
    cluster = start_cluster_in_thread(pd_specs(1, 1))
    pre = [(w.url, w.bootstrap_port) for w in cluster.workers if w.spec.role == "prefill"]
    dec = [w.url for w in cluster.workers if w.spec.role == "decode"]
    prompt = "You are a promtool test assistant. " * 4
    router = start_router_in_thread(router_config(
        prefill=pre, decode=dec, tenants=[TenantSpec("team", key_digest(KEY))],
        worker_usd_per_s={"prefill": 0.01, "decode": 0.01}, prefixes=[PrefixSpec("p", prompt)],
        health_interval_s=0.3, warm_via="pair"))
    try:
        auth = {"authorization": f"Bearer {KEY}"}
        deadline = time.monotonic() + 30
        while True:
            for stream in (False, True):
                r = httpx.post(router.url + "/generate", headers=auth, timeout=30,
                               json={"text": prompt + "hi", "stream": stream, "sampling_params": {"max_new_tokens": 4}})
                assert r.status_code == 200
            text = httpx.get(router.url + "/metrics", timeout=10).text
            if "inferctl_router_pair_kv_transfer_bytes_per_second{" in text:
                break
            assert time.monotonic() < deadline, "no pair KV sample reached /metrics"
            time.sleep(0.3)
        assert httpx.post(router.url + "/generate", json={}, timeout=30).status_code == 401
        yield httpx.get(router.url + "/metrics", timeout=10).text
    finally:
        router.stop()
        cluster.stop()


def test_one_process_metrics_pass_promtool(scrape: str) -> None:
    assert lint(scrape) == []
    assert "inferctl_router_pair_kv_transfer_latency_seconds{" in scrape
    assert "_gb_s" not in scrape and "_latency_ms" not in scrape


def test_merged_metrics_of_several_processes_pass_promtool(scrape: str) -> None:
    assert lint(merge([(0, scrape), (1, scrape)], 0).decode()) == []


def test_output_tokens_are_counted_without_tenants() -> None:
    """The dashboard's tokens/s reads inferctl_router_output_tokens_total; before, output tokens were
    counted only per tenant (inferctl_tenant_output_tokens_total), so the panel was empty without tenants."""
    with start_cluster_in_thread(pd_specs(1, 1)) as cluster:
        pre = [(w.url, w.bootstrap_port) for w in cluster.workers if w.spec.role == "prefill"]
        dec = [w.url for w in cluster.workers if w.spec.role == "decode"]
        router = start_router_in_thread(router_config(prefill=pre, decode=dec, health_interval_s=0.5))
        try:
            total = 0
            for stream in (False, True):
                r = httpx.post(router.url + "/generate", timeout=30, json={
                    "text": "count my tokens", "stream": stream, "sampling_params": {"max_new_tokens": 5}})
                assert r.status_code == 200
                total += 5
            fams = {f.name: f for f in text_string_to_metric_families(httpx.get(router.url + "/metrics").text)}
            assert fams["inferctl_router_output_tokens"].samples[0].value == total
            assert "inferctl_tenant_output_tokens" not in fams
        finally:
            router.stop()
