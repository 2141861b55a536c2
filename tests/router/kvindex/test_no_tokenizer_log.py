"""The router logged "KV events: no tokenizer, ..." at every health check (every 5 s in a benchmark's
log): once per cause now."""

from __future__ import annotations

import logging

import pytest

from tests.router.conftest import new_kv_routing


def test_no_tokenizer_is_logged_once_per_cause(caplog: pytest.LogCaptureFixture) -> None:
    kv = new_kv_routing(enabled=True, tokenizer_path=None)
    with caplog.at_level(logging.WARNING, logger="infer_ctl.router.kv"):
        for _ in range(5):
            kv.configure("http://p0:1", {"model_path": "/nonexistent-model"})
            kv.configure("http://p1:1", {"model_path": "/nonexistent-model"})
    lines = [r.getMessage() for r in caplog.records if "no tokenizer" in r.getMessage()]
    assert kv.view is None and len(lines) == 1, lines
