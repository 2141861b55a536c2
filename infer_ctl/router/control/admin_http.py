"""What every handler of the operator API (/admin, admin.py) shares: JSON answers and errors, the request
body, the bearer token, and the checks of values the handlers take."""

from __future__ import annotations

import hmac
from typing import Any

from aiohttp import web

from infer_ctl.router.http.jsonio import DecodeError, dumps, error_body, loads


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=dumps(obj), content_type="application/json")


def error_response(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=error_body(status, message), content_type="application/json")


def is_integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def norm_url(url: Any) -> str:
    url = str(url or "").rstrip("/")
    return url if not url or "://" in url else "http://" + url


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; a 400 (raised) otherwise."""
    try:
        body = loads(await request.read())
    except (DecodeError, ValueError):
        raise web.HTTPBadRequest(body=error_body(400, "malformed JSON body"),
                                 content_type="application/json") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(body=error_body(400, "the body must be a JSON object"),
                                 content_type="application/json")
    return body


def authorized(token: str | None, header: str) -> bool:
    """Whether an Authorization header carries the admin token (always true when none is configured).
    The scheme is case-insensitive (RFC 9110 §11.1: `bearer x` is the same as `Bearer x`)."""
    if not token:
        return True
    scheme, _, cred = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(cred.strip().encode(), token.encode())
