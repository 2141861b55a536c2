"""A role switch whose POST gets no answer (a rebuild longer than the timeout) leaves the server drained:
put back in its old role it could be serving the other pool's requests (launch/pd_switch.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from infer_ctl.launch import pd_switch
from infer_ctl.launch.pd_switch import RoleSwitcher


class _Router:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        self.calls.append((path, body or {}))
        return {"drained": True}


def _worker(final: Exception | None) -> Any:
    def post(url: str, *, json: dict[str, Any], **_kw: Any) -> httpx.Response:
        if not json["prepare_only"] and final is not None:
            raise final
        return httpx.Response(200, json={"success": True, "message": "ok"})
    return post


def test_no_answer_to_the_switch_leaves_it_drained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pd_switch.httpx, "post", _worker(httpx.ReadTimeout("timed out")))
    router = _Router()
    r = RoleSwitcher(router, sleep=lambda _s: None).switch("http://w1", "prefill", "decode")  # type: ignore[arg-type]
    assert not r.ok and not r.fatal
    assert "role is unknown: left drained" in r.message and r.worker_message == "no answer: timed out"
    # drained once, never undrained, never re-registered in either role
    assert [p for p, _ in router.calls] == ["/admin/workers/drain"]


def test_a_refusal_with_an_answer_is_still_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def post(url: str, *, json: dict[str, Any], **_kw: Any) -> httpx.Response:
        if json["prepare_only"]:
            return httpx.Response(200, json={"success": True, "message": "ok"})
        return httpx.Response(400, json={"success": False, "message": "instance is not idle", "safe_to_restore": True})
    monkeypatch.setattr(pd_switch.httpx, "post", post)
    router = _Router()
    r = RoleSwitcher(router, sleep=lambda _s: None).switch("http://w1", "prefill", "decode")  # type: ignore[arg-type]
    assert not r.ok and r.worker_message == "instance is not idle"
    assert router.calls[-1] == ("/admin/workers/drain", {"url": "http://w1", "drain": False})
