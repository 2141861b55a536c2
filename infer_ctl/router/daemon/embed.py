"""Run the router inside another program (the demo, tests, benchmarks): its own event loop in a thread.

    cfg = router_config(prefill=[(url, bootstrap_port)], decode=[url], profile=profile)
    handle = start_router_in_thread(cfg)
    handle.url; handle.stop()
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeVar

from infer_ctl.aio import LoopThread
from infer_ctl.profile.router import RouterSettings
from infer_ctl.router.config import RouterConfig, WorkerSpec, from_profile, router_settings, worker
from infer_ctl.router.daemon.assembly import Seat, build

if TYPE_CHECKING:
    from infer_ctl.profile import Profile

T = TypeVar("T")


def router_config(*, prefill: Sequence[tuple[str, int | None]] = (), decode: Sequence[str] = (),
                  workers: Sequence[str] = (), profile: Profile | None = None, listen: str = "127.0.0.1:0",
                  **overrides: Any) -> RouterConfig:
    """A config for explicit workers: PD (prefill (url, bootstrap_port) pairs + decode urls) or collocated
    (`workers`). Settings and named prefixes come from `profile` when given, and its servers unless workers
    are given.

    `overrides`: a RouterSettings field (profile/router.py) by its name, a nested group as a dict of its
    fields merged into the profile's (`kv_events={"enabled": False}`, `coalesce={"max_wait_s": 0.5}`),
    validated as a profile's values are (a bad one: UsageError naming router.<field>); or a run-time
    field of RouterConfig that is no setting (tenants, tracing, admin_token, tokenizer_path, ...)."""
    specs: list[WorkerSpec] = [worker(u, "prefill", bp) for u, bp in prefill]
    specs += [worker(u, "decode") for u in decode]
    specs += [worker(u, "mixed") for u in workers]
    if profile is not None:
        cfg = from_profile(profile, listen=listen, workers=specs or None)  # none given: the profile's servers
    else:
        host, _, port = listen.rpartition(":")
        cfg = RouterConfig(host=host or "127.0.0.1", port=int(port), workers=specs)
    runtime = {f.name for f in fields(RouterConfig)} - {"settings"}
    settings = {k: v for k, v in overrides.items() if k not in runtime and k != "settings"}
    unknown = sorted(set(settings) - set(RouterSettings.model_fields))
    if unknown:
        raise TypeError(f"unknown router setting {unknown[0]!r}")
    cfg.settings = router_settings(overrides.get("settings", cfg.settings), **settings)
    for key, value in overrides.items():
        if key in runtime:
            setattr(cfg, key, value)
    return cfg


class RouterHandle:
    """A router serving from a daemon thread. `stop()` drains and closes it."""

    def __init__(self, cfg: RouterConfig, timeout: float = 30.0, seat: Seat | None = None) -> None:
        """`seat`: a shared block this router counts its load and flights in, as one of several router
        processes would (a test's routers in one process)."""
        self._runner = LoopThread("inferctl-router", timeout)
        self.loop = self._runner.loop
        self.server = build(cfg, seat=seat)
        try:
            self.call(self.server.start())
        except BaseException:
            self._runner.close()
            raise

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def router(self) -> Any:
        return self.server.router

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self._runner.call(coro, timeout)

    def where(self) -> str:
        """What the router's loop is doing (its thread's and tasks' stacks): for a test's failure message."""
        return self._runner.where()

    def stop(self, drain: bool = True) -> None:
        if self._runner.closed:
            return
        try:
            # the drain may take all of drain_timeout_s; the closing steps after it get the usual timeout
            wait = self._runner.timeout + (self.server.cfg.settings.drain_timeout_s if drain else 0.0)
            self.call(self.server.stop(drain=drain), wait)
        finally:
            self._runner.close()

    def __enter__(self) -> RouterHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_router_in_thread(config: RouterConfig, seat: Seat | None = None) -> RouterHandle:
    return RouterHandle(config, seat=seat)
