"""Executes the named-prefix plan of `PrefixRegistry`: warm-up requests, TTL ticks, index upkeep.

A warm-up is a prefill request that leaves the prompt in the worker's radix cache. In PD mode it goes
through a real prefill+decode pair with max_new_tokens 1 (`warm_via: pair`, the default, also what
`auto` means). SGLang's fake bootstrap host 2.2.2.2 looks like the cheaper way (the prefill runs
without a decode) but SGLang 0.5.23 never caches such a request: `Req.skip_radix_cache_insert` is set
for `bootstrap_host == FAKE_BOOTSTRAP_HOST` (managers/schedule_batch.py) and honoured by every insert
path (mem_cache/common.py), so a fake-host warm-up computes the prompt and throws it away.
`warm_via: fake_bootstrap` remains for workers known to cache fake-host requests.

Pins (core/routing/prefixes.py, "Pins"): by default (`pin_via: touch`) a pinned replica is warmed again
after `pin_touch_s` without traffic, at no priority, so an expired or superseded pin ages out of the
worker like any prefix. Under `pin_via: priority` pinned warm-ups carry `pin_priority` to workers that
run `--radix-eviction-policy priority`; SGLang 0.5.23 takes the max of a node's priorities and never
lowers it, so such a pin stays on the worker after it ends (logged once per ended version).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from infer_ctl.core.routing.anchors import full_key
from infer_ctl.core.routing.pd import FAKE_BOOTSTRAP_HOST, bootstrap_host, new_room
from infer_ctl.core.routing.policy import NoWorkerAvailable, choose_decode
from infer_ctl.core.routing.prefixes import PrefixState, WarmAction
from infer_ctl.core.routing.prompt import render_chat
from infer_ctl.router.http.jsonio import dumps, loads_or_none
from infer_ctl.router.http.upstream import UpstreamError
from infer_ctl.router.request.proxy import Router
from infer_ctl.router.request.usage import token_counts

log = logging.getLogger("infer_ctl.router.prefixes")


class PrefixWarmer:
    def __init__(self, router: Router, *, tick_s: float = 0.5) -> None:
        self.router = router
        self.tick_s = tick_s
        self.fake_timeout_s = router.cfg.settings.warm_fake_timeout_s
        # Only on request: SGLang 0.5.23 does not cache fake-bootstrap requests (module docstring).
        self.use_fake_bootstrap = router.cfg.settings.warm_via == "fake_bootstrap"
        self.may_fall_back = False
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        #: the routing text's block chain of each prefix version whose tier is watched (`keep`)
        self._hashes: dict[tuple[str, int], list[int]] = {}
        #: pins by priority; else the registry plans the touches (PrefixRegistry `pin_touch_s`, given by the
        #: assembly, router/daemon/assembly.py)
        self.pin_by_priority = router.cfg.settings.pin_via == "priority"

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    def poke(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _loop(self) -> None:
        while True:
            self.tick()
            try:
                await asyncio.wait_for(self._wake.wait(), self.tick_s)
            except TimeoutError:
                pass
            self._wake.clear()

    def tick(self) -> None:
        router = self.router
        now = router.clock()
        for rec in router.prefixes.tick(now):
            stuck = sorted(rec.placements) if self.pin_by_priority and (rec.pin or rec.keep == "hbm") else []
            log.warning("named prefix expired" + (
                "; it stays pinned on its workers (SGLang never lowers a cached prefix's priority: restart "
                "them to drop it, or use pin_via: touch)" if stuck else ""),
                extra={"prefix": rec.name, "version": rec.version, **({"pinned_on": stuck} if stuck else {})})
        router.index.expire(now)
        views = [w.view(now) for w in router.workers.prefill_like()]
        for action in router.prefixes.plan_warmups(views, now, self._tiers()):
            router.spawn(self.warm(action))

    def _tiers(self) -> dict[tuple[str, str], str]:
        """Where the exact index says each replica of a prefix with `keep` holds it (hbm, host, none)."""
        kv = self.router.kv
        out: dict[tuple[str, str], str] = {}
        if kv.view is None:
            return out
        known, self._hashes = self._hashes, {}  # only the watched versions' chains are kept
        for rec in self.router.prefixes.records():
            if rec.keep is None or rec.state is not PrefixState.ACTIVE:
                continue
            path, body = self._body(WarmAction(rec.name, rec.version, "", rec.text, rec.fmt, False), False)
            text = self._routing_text(rec.text, rec.fmt)
            key = (rec.name, rec.version)
            hashes = known.get(key)
            if hashes is None:
                hashes = self.router.index.hashes(text)
            self._hashes[key] = hashes
            for url in rec.placements:
                where = kv.residency(hashes, text, url, kv.kind(path, body), body)
                if where is not None:
                    out[(rec.name, url)] = where
        return out

    @staticmethod
    def _routing_text(text: str, fmt: str) -> str:
        return render_chat([{"role": "system", "content": text}]) if fmt == "chat" else text

    def _body(self, action: WarmAction, pin: bool) -> tuple[str, dict[str, Any]]:
        if action.fmt == "chat":
            path = "/v1/chat/completions"
            body: dict[str, Any] = {"messages": [{"role": "system", "content": action.text}], "max_tokens": 1,
                                    "temperature": 0}
        else:
            path = "/generate"
            body = {"text": action.text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        if pin:
            body["priority"] = self.router.cfg.settings.pin_priority
        return path, body

    async def warm(self, action: WarmAction) -> bool:
        router = self.router
        w = router.workers.by_url.get(action.worker)
        ok = False
        tokens: int | None = None
        try:
            if w is None:
                return False
            path, body = self._body(action, action.pin and w.radix_priority and self.pin_by_priority)
            body["rid"] = f"warm-{action.name}-v{action.version}-{router.new_rid()}"
            async with asyncio.timeout(router.cfg.settings.request_timeout_s):
                if router.mode == "collocated":
                    status, data = await router.upstreams.fetch(w.url, "POST", path, dumps(body))
                    ok = status == 200
                else:
                    ok, data = await self._warm_pd(w.url, w.spec.bootstrap_port, path, body)
            if ok:
                tokens = token_counts(loads_or_none(data))[0]
            if ok:
                text = self._routing_text(action.text, action.fmt)
                hashes = router.index.hashes(text)
                router.index.insert(hashes, w.url, router.clock())
                # the exact index learns the prefix's pages (anchors) as it does a routed prompt's
                router.kv.routed(path, body, text, hashes, full_key(hashes, text, router.kv.block_chars),
                                 answered=True)
            log.info("named prefix warmed" if ok else "named prefix warm-up failed",
                     extra={"prefix": action.name, "version": action.version, "worker": action.worker,
                            "pinned": bool(body.get("priority"))})
            return ok
        except (UpstreamError, TimeoutError) as exc:
            log.warning("named prefix warm-up failed", extra={"prefix": action.name, "worker": action.worker,
                                                               "error": str(exc) or type(exc).__name__})
            return False
        finally:
            router.prefixes.warm_done(action, ok, router.clock(), tokens)

    async def _warm_pd(self, url: str, bport: int | None, path: str, body: dict[str, Any]) -> tuple[bool, bytes]:
        router = self.router
        if self.use_fake_bootstrap:
            fake = {**body, "bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_port": bport,
                    "bootstrap_room": new_room(router.rng)}
            try:
                async with asyncio.timeout(self.fake_timeout_s):
                    status, data = await router.upstreams.fetch(url, "POST", path, dumps(fake))
                if status == 200:
                    return True, data
            except (UpstreamError, TimeoutError):
                pass
            if not self.may_fall_back:
                return False, b""
            log.warning("prefill did not honour the fake bootstrap host; warming through prefill+decode pairs",
                        extra={"worker": url})
            self.use_fake_bootstrap = False
        now = router.clock()
        try:
            dec = choose_decode([d.view(now) for d in router.workers.role("decode")], router.rng)
        except NoWorkerAvailable:
            return False, b""
        paired = {**body, "bootstrap_host": bootstrap_host(url), "bootstrap_port": bport,
                  "bootstrap_room": new_room(router.rng)}
        payload = dumps(paired)
        (s1, data), (s2, _) = await asyncio.gather(router.upstreams.fetch(url, "POST", path, payload),
                                                   router.upstreams.fetch(dec.url, "POST", path, payload))
        return s1 == 200 and s2 == 200, data
