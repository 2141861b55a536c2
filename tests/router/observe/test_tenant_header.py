"""Tenants named by header: the header sent twice is ambiguous (400, not last-wins: a
front proxy that sets it could be overridden by the client's own copy), and with
router.tenant_trusted_proxies only connections from those networks may name a tenant (others: 403).
Real: the router and simulated workers."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infer_ctl.errors import InferctlError, UsageError
from infer_ctl.profile.load import parse_profile_text
from infer_ctl.router.config import from_profile
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.router.observe.tenants import TenantSpec
from infer_ctl.router.observe.trusted import parse_networks, trusted
from infer_ctl.sim.cluster import ThreadedSimCluster, start_cluster_in_thread
from tests.router.conftest import pd_specs
from tests.router.observe.test_tenants import PROFILE

BODY = {"text": "who am I", "sampling_params": {"max_new_tokens": 2}}
TENANTS = [TenantSpec("team"), TenantSpec("default")]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThreadedSimCluster]:
    c = start_cluster_in_thread(pd_specs(1, 1))
    yield c
    c.stop()


def _router(cluster: ThreadedSimCluster, **kw: Any) -> Any:
    pre = [(w.url, w.bootstrap_port) for w in cluster.workers if w.spec.role == "prefill"]
    dec = [w.url for w in cluster.workers if w.spec.role == "decode"]
    return start_router_in_thread(router_config(prefill=pre, decode=dec, tenants=TENANTS, health_interval_s=0.5, **kw))


def _post(url: str, headers: list[tuple[str, str]]) -> httpx.Response:
    return httpx.post(url + "/generate", json=BODY, headers=headers, timeout=30)


def _requests(url: str) -> dict[str, int]:
    return {t["tenant"]: t["requests"] for t in httpx.get(url + "/admin/tenants", timeout=10).json()["tenants"]}


def test_the_tenant_header_sent_twice_is_ambiguous(cluster: ThreadedSimCluster) -> None:
    with _router(cluster) as router:
        r = _post(router.url, [("x-inferctl-tenant", "default"), ("X-Inferctl-Tenant", "team")])
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and "more than once" in err["message"]
        assert _requests(router.url) == {"team": 0, "default": 0}  # charged to neither
        assert _post(router.url, [("x-inferctl-tenant", "team")]).status_code == 200
        assert _requests(router.url) == {"team": 1, "default": 0}


def test_only_trusted_proxies_may_name_a_tenant(cluster: ThreadedSimCluster) -> None:
    with _router(cluster, tenant_trusted_proxies=["10.0.0.0/8", "fd00::/8"]) as router:  # not loopback
        r = _post(router.url, [("x-inferctl-tenant", "team")])
        assert r.status_code == 403, r.text
        assert r.json()["error"]["type"] == "invalid_request_error" and "trusted proxies" in r.json()["error"]["message"]
        assert _post(router.url, []).status_code == 200  # no header: the default tenant, as before
        assert _requests(router.url) == {"team": 0, "default": 1}
    with _router(cluster, tenant_trusted_proxies=["127.0.0.0/8"]) as router:
        assert _post(router.url, [("x-inferctl-tenant", "team")]).status_code == 200
        assert _requests(router.url) == {"team": 1, "default": 0}


def test_header_mode_without_trusted_proxies_warns(cluster: ThreadedSimCluster, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="infer_ctl.router"), _router(cluster) as router:
        assert _post(router.url, [("x-inferctl-tenant", "team")]).status_code == 200  # as before: trusted
    assert any("any client can claim any tenant" in r.getMessage() for r in caplog.records)


def test_addresses_are_matched_by_network() -> None:
    nets = parse_networks(["10.1.0.0/16", "2001:db8::/32", "192.168.1.7"])
    assert trusted(nets, "10.1.2.3") and trusted(nets, "::ffff:10.1.2.3") and trusted(nets, "2001:db8::1")
    assert trusted(nets, "192.168.1.7") and not trusted(nets, "192.168.1.8")
    assert not trusted(nets, "10.2.0.1") and not trusted(nets, None) and not trusted(nets, "not-an-address")
    with pytest.raises(UsageError, match="not a CIDR"):
        parse_networks(["10.0.0.1/8"])


def test_the_setting_comes_from_the_profile() -> None:
    text = PROFILE % "    - {name: team}" + "  tenant_trusted_proxies: [10.0.0.0/24, 'fd00::/8']\n"
    cfg = from_profile(parse_profile_text(text), env={})
    assert [str(n) for n in cfg.settings.tenant_trusted_proxies] == ["10.0.0.0/24", "fd00::/8"]
    with pytest.raises(InferctlError, match="tenant_trusted_proxies"):
        parse_profile_text(PROFILE % "    - {name: team}" + "  tenant_trusted_proxies: [10.0.0.1/24]\n")
