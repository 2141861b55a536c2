"""The Grafana dashboards in docs/dashboards/ query only metrics the project exports: every metric name in
every PromQL expression is found in a live router's /metrics (simulated workers behind it, tenants,
pricing, a named prefix, speculative decodes) or in an audit textfile the audit's own code writes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.checks.audit import AuditResult, textfile_text
from infer_ctl.checks.remediation_state import textfile_families
from infer_ctl.core.findings import Finding
from infer_ctl.router.config import PrefixSpec
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.router.observe.tenants import TenantSpec, key_digest
from infer_ctl.sim.cluster import ThreadedSimCluster, start_cluster_in_thread
from tests.router.conftest import pd_specs

DASHBOARDS = Path(__file__).resolve().parents[3] / "docs" / "dashboards"
KEY = "dashboard-key-0123456789abcdef"
# PromQL functions and keywords that may appear in the dashboards; anything else that looks like an
# identifier outside label matchers and grouping clauses is a metric name
FUNCTIONS = {"rate", "increase", "sum", "max", "min", "avg", "count", "histogram_quantile", "time", "irate",
             "topk", "abs", "clamp_min"}
KEYWORDS = {"by", "without", "and", "or", "unless", "bool", "on", "ignoring", "offset"}


def exported(text: str) -> set[str]:
    """Every series name a Prometheus scrape of `text` can hold: counters as NAME_total, histograms as
    NAME_bucket/_sum/_count, also for families that have no sample yet."""
    names: set[str] = set()
    for fam in text_string_to_metric_families(text):
        names.update(s.name for s in fam.samples)
        if fam.type == "counter":
            names.add(fam.name + "_total")
        elif fam.type == "histogram":
            names.update(fam.name + s for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(fam.name)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values, regexes)
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges
    e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", e)  # grouping label lists
    e = re.sub(r"(?<![A-Za-z_:])\d+(\.\d+)?(e[+-]?\d+)?", " ", e)  # numbers (1e6)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word, rest = m.group(0), e[m.end():].lstrip()
        if word in KEYWORDS:
            continue
        if rest.startswith("("):
            assert word in FUNCTIONS, f"unknown PromQL function {word!r} in {expr}"
            continue
        names.add(word)
    return names


def queries(path: Path) -> list[str]:
    doc = json.loads(path.read_text())
    assert doc["uid"] and doc["title"] and doc["templating"]["list"][0]["type"] == "datasource"
    out = []
    for panel in doc["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["targets"], panel
        out += [t["expr"] for t in panel["targets"]]
    return out


def test_the_metric_name_extraction() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (tenant, le) (rate(a_bucket{x="y"}[$__rate_interval])))') == {"a_bucket"}
    assert metric_names('count by (node) (b{check=~"gpu\\\\..*"} >= 1) / c * 3600') == {"b", "c"}
    assert metric_names("time() - max(d) / (sum(e) / 1e6)") == {"d", "e"}


@pytest.fixture(scope="module")
def router_metrics() -> Iterator[str]:
    cluster: ThreadedSimCluster = start_cluster_in_thread(pd_specs(1, 1))
    pre = [(w.url, w.bootstrap_port) for w in cluster.workers if w.spec.role == "prefill"]
    dec = [w.url for w in cluster.workers if w.spec.role == "decode"]
    prompt = "You are a dashboard test assistant. " * 4
    router = start_router_in_thread(router_config(
        prefill=pre, decode=dec, tenants=[TenantSpec("team", key_digest(KEY))], worker_usd_per_s={"prefill": 0.01, "decode": 0.01},
        prefixes=[PrefixSpec("dash", prompt)], health_interval_s=0.5, warm_via="pair"))
    try:
        auth = {"authorization": f"Bearer {KEY}"}
        for stream in (False, True):
            r = httpx.post(router.url + "/generate", headers=auth, timeout=30,
                           json={"text": prompt + "hello", "stream": stream, "sampling_params": {"max_new_tokens": 4}})
            assert r.status_code == 200
        assert httpx.post(router.url + "/generate", json={}, timeout=30).status_code == 401
        yield httpx.get(router.url + "/metrics").text
    finally:
        router.stop()
        cluster.stop()


def audit_textfile() -> str:
    findings = [Finding.fail("gpu.xid", "pf-01", "GPU0", "XID 79: fallen off the bus", remedy="drain"),
                Finding.warn("fabric.link_flaps", "dc-01", "mlx5_0", "one link down in 24 h"),
                Finding.ok("gpu.ecc", "pf-02", "GPU3", "no uncorrectable errors")]
    result = AuditResult(findings=findings, families=["gpu", "fabric"], nodes=["pf-01", "pf-02", "dc-01"],
                         family_durations={"gpu": 1.5, "fabric": 0.7}, duration_s=2.2)
    state = {"counters": {"drain": {"pf-01": 1}}, "drained": {"pf-01": {"roles": ["prefill"], "since": "x"}}}
    return textfile_text(result, run_timestamp=1.7e9, extra=textfile_families(state, {"pf-01": ["prefill"]}))


def test_router_dashboard_queries_only_metrics_the_router_exports(router_metrics: str) -> None:
    have = exported(router_metrics)
    used = set().union(*(metric_names(q) for q in queries(DASHBOARDS / "inferctl-router.json")))
    assert used - have == set()
    # the panels the dashboard promises: tenants' cost, speculative acceptance, TTFT, predicted vs actual
    assert {"inferctl_tenant_cost_dollars_total", "inferctl_router_spec_accept_rate", "inferctl_router_ttft_seconds_bucket",
            "inferctl_router_cache_predicted_tokens_total", "inferctl_router_cache_actual_tokens_total",
            "inferctl_router_retries_total", "inferctl_router_worker_cb_state", "inferctl_tenant_ttft_seconds_bucket"} <= used


def test_audit_dashboard_queries_only_metrics_the_audit_textfile_has() -> None:
    text = audit_textfile()
    assert 'check="gpu.xid"' in text and "inferctl_remediation_drained" in text
    have = exported(text)
    used = set().union(*(metric_names(q) for q in queries(DASHBOARDS / "inferctl-audit.json")))
    assert used - have == set()
    assert {"inferctl_check_status", "inferctl_node_status", "inferctl_audit_status"} <= used


def test_a_metric_the_project_does_not_export_is_caught(router_metrics: str) -> None:
    assert metric_names("rate(inferctl_router_requests_totl[5m])") - exported(router_metrics) == {"inferctl_router_requests_totl"}
