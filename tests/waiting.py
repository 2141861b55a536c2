"""Polling for a condition in tests (instead of fixed sleeps): one helper for every test module."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, every: float = 0.05) -> Any:
    """The first truthy value `cond()` returns within `timeout` seconds, else its last value. The
    default timeout is generous on purpose: it is only spent when the test is about to fail, and the
    suite runs on 2 loaded cores."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every)
    return cond()
