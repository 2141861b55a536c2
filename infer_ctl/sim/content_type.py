"""SGLang 0.5.23's two Content-Type rules, so a client (or a router) that forgets the header fails against
the simulator exactly as it fails against the engine (issue 26: the router shipped without the header
because the simulator took any body).

1. FastAPI (0.13x, `routing.get_request_handler`, `strict_content_type` on by default) parses a body as
   JSON only when its media subtype is `json` or ends in `+json`; any other or no Content-Type leaves the
   raw bytes, which the body model then refuses. On `/generate` that is the GenerateReqInput dataclass:
   400 "Input should be a dictionary or an instance of GenerateReqInput" with the bytes as `input`.
2. The OpenAI routes also depend on `http_server.validate_json_request`: the media type (before any `;`)
   must be exactly `application/json`, else 400 "Unsupported Media Type: Only 'application/json' is
   allowed" (loc `['header', 'content-type']`).

Both render through SGLang's RequestValidationError handler (400 ErrorResponse, type "Bad Request").
The texts are built as FastAPI builds them (`contract.validation_text`). FastAPI appends the endpoint's
source location ("File .../http_server.py, line 928, in generate_request") to the `/generate` one, which
names a path on the engine's machine: the simulator leaves it out. Pure module.
"""

from __future__ import annotations

from infer_ctl.sim.contract import validation_text

UNSUPPORTED = "Unsupported Media Type: Only 'application/json' is allowed"


def fastapi_parses_json(content_type: str | None) -> bool:
    """Whether FastAPI decodes the body as JSON for this Content-Type header (rule 1)."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    maintype, _, subtype = media.partition("/")
    if not maintype or not subtype:  # email.message falls back to text/plain on a malformed type
        return False
    return subtype == "json" or subtype.endswith("+json")


def openai_accepts(content_type: str | None) -> bool:
    """`validate_json_request` (rule 2): the header, lowercased, up to its first `;`."""
    return (content_type or "").lower().split(";", maxsplit=1)[0] == "application/json"


def unsupported_media_type() -> str:
    """The OpenAI routes' message for a missing or non-JSON Content-Type (byte-exact with SGLang's)."""
    return validation_text([{"loc": ["header", "content-type"], "msg": UNSUPPORTED, "type": "value_error"}])


def generate_not_json(raw: bytes) -> str:
    """`/generate`'s message for a body FastAPI did not decode (rule 1), less the endpoint location."""
    return validation_text([{"type": "dataclass_type", "loc": ("body",),
                     "msg": "Input should be a dictionary or an instance of GenerateReqInput",
                     "input": raw, "ctx": {"class_name": "GenerateReqInput"}}])
