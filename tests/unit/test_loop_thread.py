"""aio.LoopThread: a call past its timeout is cancelled and says where the loop was, whether a task
waits on something (the task's stack) or the loop's own thread is blocked (that thread's stack)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from infer_ctl.aio import LoopThread, LoopTimeout


def test_a_call_past_its_timeout_names_the_waiting_task_and_is_cancelled() -> None:
    loop = LoopThread("test-loop", timeout=0.3)
    cancelled = threading.Event()

    async def waits_for_a_reply_that_never_comes() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        with pytest.raises(LoopTimeout) as err:
            loop.call(waits_for_a_reply_that_never_comes())
        assert isinstance(err.value, TimeoutError)  # callers catching TimeoutError still do
        text = str(err.value)
        assert "test-loop: no result within 0.3s" in text
        assert "waits_for_a_reply_that_never_comes" in text  # the task's own stack
        assert cancelled.wait(5)
        assert loop.call(asyncio.sleep(0, "still usable")) == "still usable"
    finally:
        loop.close()


def test_a_blocked_loop_is_named_with_the_call_that_blocks_it() -> None:
    loop = LoopThread("blocked-loop", timeout=0.3)
    release = threading.Event()

    async def blocks_the_loop_thread() -> None:
        release.wait(10)  # a synchronous call on the loop's thread: nothing else runs meanwhile

    try:
        t0 = time.monotonic()
        with pytest.raises(LoopTimeout) as err:
            loop.call(blocks_the_loop_thread())
        text = str(err.value)
        assert "it is blocked" in text
        assert "release.wait(10)" in text  # from the loop thread's own stack
        assert time.monotonic() - t0 < 5
    finally:
        release.set()
        loop.close()


def test_a_longer_timeout_for_one_call() -> None:
    loop = LoopThread("slow-call", timeout=0.05)
    try:
        assert loop.call(asyncio.sleep(0.3, "done"), timeout=5) == "done"
    finally:
        loop.close()
