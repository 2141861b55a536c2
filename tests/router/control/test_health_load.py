"""Pure router-side decisions without sockets: what a load poll adds to a worker's load, how PD warm-ups are sent."""

from __future__ import annotations

import pytest

from infer_ctl.router.config import RouterConfig, router_settings, worker
from infer_ctl.router.control.health import HealthChecker
from infer_ctl.router.daemon.assembly import build_router


@pytest.mark.parametrize(("ours", "waiting", "running", "external"), [
    (10, 6, 4, 0),  # all 10 requests the worker reports are ours: nothing to add (was +6 before)
    (10, 8, 6, 4),  # 4 more than ours: another client's
    (3, 0, 0, 0),  # poll raced our new requests: never negative
])
def test_load_poll_counts_only_other_clients(ours: int, waiting: int, running: int, external: int) -> None:
    router = build_router(RouterConfig(workers=[worker("http://127.0.0.1:1", "prefill", 8998), worker("http://127.0.0.1:2", "decode")]))
    w = router.workers.by_url["http://127.0.0.1:1"]
    w.inflight = ours
    HealthChecker(router).apply(w, True, "start-1", False, (waiting, running, None))
    view = w.view(0.0)
    assert (view.queued, view.load) == (external, ours + external)


@pytest.mark.parametrize(("warm_via", "fake"), [("auto", False), ("pair", False), ("fake_bootstrap", True)])
def test_pd_warmups_use_a_real_pair_unless_asked(warm_via: str, fake: bool) -> None:
    """SGLang 0.5.23 sets skip_radix_cache_insert for bootstrap_host 2.2.2.2: a fake-host warm-up caches
    nothing, so the default must be a real prefill+decode pair."""
    from infer_ctl.router.control.warmer import PrefixWarmer

    cfg = RouterConfig(workers=[worker("http://127.0.0.1:1", "prefill", 8998), worker("http://127.0.0.1:2", "decode")],
                       settings=router_settings(warm_via=warm_via))
    assert PrefixWarmer(build_router(cfg)).use_fake_bootstrap is fake
