"""Named prefixes' `keep`: hbm (priority warm-ups, warmed again once it left HBM) and
host (warm while it sits in host memory: no re-warm because it left HBM or idled). Pure registry, the
profile's and the admin API's validation."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import ValidationError

from infer_ctl.cli.main import main
from infer_ctl.core.routing.policy import WorkerView
from infer_ctl.core.routing.prefixes import TIER_GRACE_S, PrefixRegistry
from infer_ctl.profile.router import NamedPrefix
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from tests.router.conftest import new_prefix_registry

W = [WorkerView("http://p0:1")]
URL = W[0].url


def warmed(keep: str | None, pin: bool = False) -> PrefixRegistry:
    reg = new_prefix_registry({"pin_via": "priority"}, rewarm_idle_s=100)  # keep hbm by its re-warms alone, no touches
    reg.register("a", "A" * 400, now=0, keep=keep, pin=pin)
    (action,) = reg.plan_warmups(W, 0)
    assert action.pin is (keep == "hbm" or pin)  # keep hbm warms with the pin's priority
    reg.warm_done(action, True, 0)
    return reg


def test_keep_host_stays_warm_in_host_memory() -> None:
    reg = warmed("host")
    assert reg.plan_warmups(W, 50, {("a", URL): "host"}) == []  # left HBM: not re-warmed for it
    assert reg.plan_warmups(W, 500, {("a", URL): "host"}) == []  # idle, but still in host memory
    assert reg.plan_warmups(W, 500, {("a", URL): "hbm"}) == []
    assert [a.worker for a in reg.plan_warmups(W, 500, {("a", URL): "none"})] == [URL]  # gone from both


def test_keep_host_without_the_tier_known_rewarms_as_before() -> None:
    reg = warmed("host")
    assert reg.plan_warmups(W, 50) == []
    assert [a.worker for a in reg.plan_warmups(W, 150)] == [URL]  # idle re-warm: nothing says it is in host


def test_keep_hbm_rewarms_once_it_left_hbm() -> None:
    reg = warmed("hbm")
    assert reg.plan_warmups(W, TIER_GRACE_S / 2, {("a", URL): "host"}) == []  # its events may be in flight
    assert reg.plan_warmups(W, 50, {("a", URL): "hbm"}) == []
    (again,) = reg.plan_warmups(W, 50, {("a", URL): "host"})
    assert again.pin  # loaded back to HBM with the priority


def test_no_keep_ignores_the_tier() -> None:
    reg = warmed(None)
    assert reg.plan_warmups(W, 50, {("a", URL): "none"}) == []
    assert reg.plan_warmups(W, 50, {("a", URL): "host"}) == []


def test_keep_values_and_conflicts_are_refused() -> None:
    reg = new_prefix_registry()
    with pytest.raises(ValueError, match="keep must be hbm or host"):
        reg.register("a", "AAA", now=0, keep="ssd")
    with pytest.raises(ValueError, match="keep host"):
        reg.register("a", "AAA", now=0, keep="host", pin=True)
    rec = reg.register("a", "AAA", now=0, keep="host")
    assert rec.as_dict(0)["keep"] == "host" and reg.settings("a") == (None, 1, False, "text", "host")
    with pytest.raises(ValidationError, match="keep"):
        NamedPrefix.model_validate({"name": "p", "text": "x", "keep": "ssd"})
    with pytest.raises(ValidationError, match="keep: host conflicts with pin"):
        NamedPrefix.model_validate({"name": "p", "text": "x", "keep": "host", "pin": True})
    assert NamedPrefix.model_validate({"name": "p", "text": "x", "keep": "hbm"}).keep == "hbm"


def test_admin_api_and_cli_keep_field(capsys: pytest.CaptureFixture[str]) -> None:
    router = start_router_in_thread(router_config())
    try:
        url = router.url + "/admin/prefixes"
        bad = httpx.post(url, json={"name": "p", "text": "hello", "keep": "ssd"})
        assert bad.status_code == 400 and "keep" in bad.text
        bad = httpx.post(url, json={"name": "p", "text": "hello", "keep": "host", "pin": True})
        assert bad.status_code == 400 and "keep host and pin" in bad.text
        ok = httpx.post(url, json={"name": "p", "text": "hello", "keep": "host"})
        assert ok.status_code == 201 and ok.json()["prefix"]["keep"] == "host"
        # a new version keeps the setting unless told; null clears it
        assert httpx.post(url, json={"name": "p", "text": "hello v2"}).json()["prefix"]["keep"] == "host"
        assert httpx.post(url, json={"name": "p", "text": "hello v3", "keep": None}).json()["prefix"]["keep"] is None
        # `inferctl router prefixes add --keep`
        assert main(["router", "prefixes", "add", "q", "--text", "hi there", "--keep", "hbm", "--url", router.url,
                     "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["prefix"]["keep"] == "hbm"
        assert main(["router", "prefixes", "add", "q", "--text", "hi there", "--keep", "none", "--url", router.url,
                     "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["prefix"]["keep"] is None
        assert main(["router", "prefixes", "add", "q", "--text", "hi", "--keep", "ssd", "--url", router.url]) != 0
        assert "--keep must be hbm, host or none" in capsys.readouterr().err
        assert main(["router", "prefixes", "--url", router.url]) == 0 and "keep" in capsys.readouterr().out
    finally:
        router.stop()
