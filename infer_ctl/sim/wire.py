"""HTTP wire helpers shared by the native and OpenAI APIs: reading a JSON body with SGLang's error
text and its Content-Type rules (content_type.py), and SSE framing (`data: {json}` events ending with
`data: [DONE]`)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from infer_ctl.sim import content_type, contract
from infer_ctl.sim.protocol import RequestError

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
SSE_DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def read_json(request: web.Request) -> Any:
    """The request body as JSON, whatever its Content-Type (the simulator's own `/sim/...` endpoints); a
    body that is not JSON is FastAPI's 400 (`RequestError` kind "body")."""
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, contract.json_error(exc), "body") from None


async def read_generate_body(request: web.Request) -> Any:
    """`/generate`'s body: FastAPI decodes it only under a JSON Content-Type; otherwise the raw bytes
    reach the GenerateReqInput model, which refuses them (400, kind "body")."""
    if not content_type.fastapi_parses_json(request.headers.get("Content-Type")):
        raw = await request.read()
        raise RequestError(400, content_type.generate_not_json(raw), "body")
    return await read_json(request)


async def read_openai_body(request: web.Request) -> Any:
    """An OpenAI route's body: FastAPI decodes a JSON-typed body first (a malformed one fails there), then
    `validate_json_request` refuses any media type but application/json (400, kind "body")."""
    header = request.headers.get("Content-Type")
    body = await read_json(request) if content_type.fastapi_parses_json(header) else None
    if not content_type.openai_accepts(header):
        raise RequestError(400, content_type.unsupported_media_type(), "body")
    return body
