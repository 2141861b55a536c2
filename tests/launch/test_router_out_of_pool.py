"""A launch killed between taking a server out of the router's pool and putting it back (kill -9, a
lost controller) must not leave it out for good: the next `launch --rolling` re-adds it. Against the
real inferctl router (in a thread); the registrations taken out are kept in a state file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from infer_ctl.core.sglang import instances
from infer_ctl.launch.router_hook import OutOfPool, RouterNotifier
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread


def _setup(listen: str) -> Any:
    return validate_profile_data({
        "name": "p", "ssh": {"config_file": None},
        "nodes": [{"name": f"pf-0{i}", "host": f"127.0.0.{10 + i}", "roles": ["prefill"]} for i in (1, 2)]
        + [{"name": "dc-01", "host": "127.0.0.21", "roles": ["decode"]}],
        "router": {"listen": listen},
    })  # fmt: skip


def _registered(url: str) -> set[str]:
    return {w["url"] for w in httpx.get(url + "/admin/workers", trust_env=False).json()["workers"]}


def test_a_server_left_out_by_a_killed_launch_is_put_back_by_the_next(tmp_path: Path) -> None:
    boot = _setup("127.0.0.1:1")
    pd = [i for i in instances(boot) if i.is_leader]
    pf1, pf2 = (i for i in pd if i.role == "prefill")
    cfg = router_config(prefill=[(i.url, i.bootstrap_port) for i in (pf1, pf2)],
                        decode=[i.url for i in pd if i.role == "decode"], health_interval_s=60)  # fmt: skip
    with start_router_in_thread(cfg) as router:
        profile = _setup(router.url.removeprefix("http://"))
        state = tmp_path / "router-out.json"

        first = RouterNotifier.for_profile(profile, record=OutOfPool(router.url, state))
        assert first.take_out(pf1) == "removed from the router"
        assert first.take_out(pf2) == "removed from the router"
        del first  # killed here: neither put back
        assert pf1.url not in _registered(router.url) and pf2.url not in _registered(router.url)

        second = RouterNotifier.for_profile(profile, record=OutOfPool(router.url, state))
        # pf1 is restarted by this run: put back once healthy, like a server it took out itself
        assert second.take_out(pf1) == "out of the router's pool since an interrupted launch"
        assert (second.put_back(pf1) or "").startswith("re-added to the router")
        # pf2 is not restarted (already on the new settings): put back at the end of the run
        assert second.restore_left_over() == {pf2.url: "re-added to the router (left out by an interrupted launch)"}
        assert {pf1.url, pf2.url} <= _registered(router.url)

        third = RouterNotifier.for_profile(profile, record=OutOfPool(router.url, state))
        assert third.left_over == set() and third.restore_left_over() == {}


def test_a_server_that_never_left_the_pool_is_not_added_twice(tmp_path: Path) -> None:
    """The remove failed half-way (or someone re-added it by hand): putting it back is a no-op."""
    boot = _setup("127.0.0.1:1")
    pd = [i for i in instances(boot) if i.is_leader]
    pf1 = next(i for i in pd if i.role == "prefill")
    cfg = router_config(prefill=[(pf1.url, pf1.bootstrap_port)], decode=[i.url for i in pd if i.role == "decode"],
                        health_interval_s=60)  # fmt: skip
    with start_router_in_thread(cfg) as router:
        profile = _setup(router.url.removeprefix("http://"))
        state = tmp_path / "router-out.json"
        notifier = RouterNotifier.for_profile(profile, record=OutOfPool(router.url, state))
        assert notifier.take_out(pf1) == "removed from the router"
        httpx.post(router.url + "/admin/workers", json=notifier.removed[pf1.url], trust_env=False).raise_for_status()
        assert (notifier.put_back(pf1) or "").startswith("re-added to the router")
        assert notifier.removed == {} and OutOfPool(router.url, state).load() == {}
