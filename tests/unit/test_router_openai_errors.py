"""Router-made errors carry OpenAI's error `type` for their status: clients branch on
invalid_request_error / authentication_error / rate_limit_error / server_error, not on the router's own
reasons (those stay in the message and in inferctl_router_rejected_total{reason})."""

from __future__ import annotations

import json

import pytest

from infer_ctl.router.http import sse
from infer_ctl.router.http.jsonio import error_body, openai_error_type
from infer_ctl.router.observe.tenants import UNKNOWN_KEY, TenantRefusal

OPENAI_TYPES = {"invalid_request_error", "authentication_error", "rate_limit_error", "server_error"}


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (404, "invalid_request_error"), (405, "invalid_request_error"),
    (409, "invalid_request_error"), (413, "invalid_request_error"), (401, "authentication_error"),
    (429, "rate_limit_error"), (500, "server_error"), (502, "server_error"), (503, "server_error"),
    (504, "server_error")])
def test_error_type_follows_openai(status: int, kind: str) -> None:
    assert openai_error_type(status) == kind
    assert json.loads(error_body(status, "m")) == {"error": {"message": "m", "type": kind, "code": status}}


def test_stream_error_events_and_tenant_refusals_use_the_same_types() -> None:
    event = sse.error_event(502, "upstream stream broke")
    doc = json.loads(event.split(b"\n\n")[0][len(b"data: "):])
    assert doc["error"]["type"] == "server_error" and doc["error"]["code"] == 502
    assert json.loads(UNKNOWN_KEY.body())["error"]["type"] == "authentication_error"
    limited = TenantRefusal(429, "requests_per_s", "over", retry_after=1)
    assert json.loads(limited.body())["error"]["type"] == "rate_limit_error"
    assert {openai_error_type(s) for s in range(400, 600)} == OPENAI_TYPES
