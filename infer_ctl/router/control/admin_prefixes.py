"""The operator API's named prefixes (/admin/prefixes): list, add (or a new version), expire, warm, remove;
each verb run here, or with a state store (router/scaleout/state_sync.py) on the stored record for every
replica."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from infer_ctl.core.routing.prefixes import KEEP_CHOICES, PrefixRegistry, replicas_beyond_workers
from infer_ctl.profile.router import MAX_PREFIX_REPLICAS, PREFIX_NAME_PATTERN
from infer_ctl.router.control.admin_http import (
    error_response,
    is_integer,
    is_number,
    json_body,
    json_response,
)
from infer_ctl.router.control.warmer import PrefixWarmer
from infer_ctl.router.request.proxy import Router
from infer_ctl.router.scaleout.state_sync import StateSync, VerbRefused
from infer_ctl.router.scaleout.store_status import StoreUnavailable


def _known(call: Any, missing: str) -> Any:
    """An admin verb on one named prefix: a name the registry does not know is a 404 naming it."""
    def verb(reg: PrefixRegistry, now: float) -> Any:
        try:
            return call(reg, now)
        except KeyError:
            raise VerbRefused(404, f"{missing}; see `inferctl router prefixes`", "not_found") from None
    return verb


class PrefixRoutes:
    """The handlers of /admin/prefixes."""

    def __init__(self, router: Router, warmer: PrefixWarmer, replicas: StateSync | None) -> None:
        self.router = router
        self.warmer = warmer
        #: with a state store, every change of named prefixes goes through it to every replica
        self.replicas = replicas

    async def prefixes(self, request: web.Request) -> web.Response:
        now = self.router.clock()
        return json_response({"prefixes": [r.as_dict(now) for r in self.router.prefixes.records()]})

    async def _change(self, name: str, verb: Any) -> Any:
        """Run an operator verb on the named prefixes: here, or through the state store on every replica.
        Returns the verb's result, or the error response."""
        try:
            if self.replicas is None:
                return verb(self.router.prefixes, self.router.clock())
            return await self.replicas.change_prefix(name, verb)
        except VerbRefused as exc:
            return error_response(exc.status, exc.message)  # the type a client sees follows the status
        except StoreUnavailable as exc:
            return error_response(503, str(exc))

    def _local(self, rec: Any) -> Any:
        """This replica's copy of a record a verb returned (the verb may have run on the stored copy)."""
        return self.router.prefixes.get(rec.name, rec.version) or rec

    async def add_prefix(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        name, text = body.get("name"), body.get("text")
        if not isinstance(name, str) or not re.match(PREFIX_NAME_PATTERN, name) or not isinstance(text, str) or not text:
            return error_response(400, "give name (letters, digits, '.', '_', '-'; up to 128) and text (non-empty)")

        def verb(reg: PrefixRegistry, now: float) -> Any:
            # A new version (or a renewal) keeps the latest version's settings unless the request gives
            # them: `prefixes add NAME --file v2.txt` must not silently drop K replicas, the pin, the TTL
            # and `keep`, also when that version has expired in the meantime.
            cur = reg.settings(name)
            ttl = body.get("ttl_s", cur[0] if cur else None)
            replicas = body["replicas"] if body.get("replicas") is not None else (cur[1] if cur else 1)
            pin = body["pin"] if body.get("pin") is not None else (cur[2] if cur else False)
            fmt = body["format"] if body.get("format") is not None else (cur[3] if cur else "text")
            keep = body.get("keep", cur[4] if cur else None)  # null: neither
            if (ttl is not None and (not is_number(ttl) or ttl <= 0)) or not is_integer(replicas) \
                    or not 1 <= replicas <= MAX_PREFIX_REPLICAS or not isinstance(pin, bool) or fmt not in ("text", "chat"):
                raise VerbRefused(400, f"ttl_s must be a number > 0 (or null: no TTL), replicas an integer "
                                  f"1..{MAX_PREFIX_REPLICAS}, pin a boolean, format text or chat", "invalid_request_error")
            if body.get("replicas") is not None and (why := replicas_beyond_workers(
                    replicas, [w.role for w in self.router.workers.prefill_like()])):
                raise VerbRefused(409, why, "invalid_request_error")
            if keep is not None and keep not in KEEP_CHOICES:
                raise VerbRefused(400, f"keep must be hbm, host or null, got {str(keep)[:20]!r}", "invalid_request_error")
            if keep == "host" and pin:
                raise VerbRefused(400, "keep host and pin conflict: pin keeps the prefix in HBM (give keep hbm, "
                                  "or pin false)", "invalid_request_error")
            return reg.register(name, text, now=now, ttl_s=ttl, replicas=replicas, pin=pin, fmt=fmt, keep=keep)

        rec = await self._change(name, verb)
        if isinstance(rec, web.Response):
            return rec
        self.warmer.poke()
        return json_response({"prefix": self._local(rec).as_dict(self.router.clock())}, 201)

    async def expire_prefix(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]

        verb = _known(lambda reg, now: reg.expire(name, now), f"no active prefix {name!r}")

        rec = await self._change(name, verb)
        if isinstance(rec, web.Response):
            return rec
        return json_response({"prefix": self._local(rec).as_dict(self.router.clock())})

    async def remove_prefix(self, request: web.Request) -> web.Response:
        """Forget a prefix altogether: every version, its placements and statistics."""
        name = request.match_info["name"]

        verb = _known(lambda reg, now: reg.remove(name), f"no prefix {name!r}")

        versions = await self._change(name, verb)
        if isinstance(versions, web.Response):
            return versions
        return json_response({"removed": name, "versions": [r.version for r in versions]})

    async def warm_prefix(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]

        verb = _known(lambda reg, now: reg.request_warm(name, now), f"no active prefix {name!r}")

        rec = await self._change(name, verb)
        if isinstance(rec, web.Response):
            return rec
        self.warmer.poke()
        return json_response({"prefix": self._local(rec).as_dict(self.router.clock())})
