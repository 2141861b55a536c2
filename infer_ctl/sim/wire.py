"""HTTP wire helpers shared by the native and OpenAI APIs: reading a JSON body with SGLang's error
text, and SSE framing (`data: {json}` events ending with `data: [DONE]`)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from infer_ctl.sim import contract
from infer_ctl.sim.protocol import RequestError

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
SSE_DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def read_json(request: web.Request) -> Any:
    """The request body as JSON; a body that is not JSON is FastAPI's 400 (`RequestError` kind "body")."""
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, contract.json_error(exc), "body") from None
