"""StreamOpener's wait for a PD stream's first chunk (router/request/attempt.py `_first_chunk`) when the
prefill's call already ended with the decode's head: one that failed ends the attempt at once (a retry,
or its 4xx passed on), one that answered lets the decode's first chunk be waited for. The upstream is a
stand-in whose stream never sends a chunk: a wait for it would never end."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from infer_ctl.router.http.upstream import UpstreamError
from infer_ctl.router.request.attempt import StreamOpener
from infer_ctl.router.request.retry import AttemptFailed


class Worker:
    def __init__(self, url: str) -> None:
        self.url = url


class SilentStream:
    """A decode's stream that has sent its head and nothing more (it waits for a KV transfer)."""

    async def next_chunk(self) -> bytes | None:
        await asyncio.sleep(3600)
        return None


def first(prefill: Any) -> Any:
    async def run() -> Any:
        pt: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if isinstance(prefill, BaseException):
            pt.set_exception(prefill)
        else:
            pt.set_result(prefill)
        opener = StreamOpener(calls=None, request_timeout_s=60)  # type: ignore[arg-type]
        return await asyncio.wait_for(
            opener._first_chunk(Worker("http://p"), Worker("http://d"), SilentStream(), pt),  # type: ignore[arg-type]
            timeout=1)
    return asyncio.run(run())


def test_a_prefill_that_failed_with_the_decodes_head_is_a_retry_at_once() -> None:
    with pytest.raises(AttemptFailed) as failed:
        first(UpstreamError("connection reset"))
    assert failed.value.cause == "prefill_error" and failed.value.worker == "http://p"
    with pytest.raises(AttemptFailed) as failed:
        first((503, b"{}", "application/json"))
    assert failed.value.cause == "prefill_status" and failed.value.status == 503


def test_a_prefills_4xx_with_the_decodes_head_is_passed_on_at_once() -> None:
    assert first((400, b'{"message": "bad"}', "application/json")) == (400, b'{"message": "bad"}', "application/json")


def test_a_prefill_that_answered_leaves_the_decodes_first_chunk_to_be_waited_for() -> None:
    with pytest.raises(TimeoutError):
        first((200, b"{}", "application/json"))
