"""Attacks on the flight board (router/fleet/shared_flights.py) and the hold across router processes
(router/request/coalesce.py): each test is a way the board misled another process's requests - held through a
leader's whole answer, held for a follower that computes nothing, a dead process's flights taken for
landed, computing flights kept off a board full of landed ones - and fails on the code before its fix.

Coalescers over one real shared block stand for the processes (each writes only its own row); their
attempts are scripted (an asyncio.Event each), so every wait is exact."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from infer_ctl.core.routing.coalesce import PendingBlocks
from infer_ctl.core.routing.index import block_hashes
from infer_ctl.router.config import WorkerSpec
from infer_ctl.router.fleet import shared_flights as sf
from infer_ctl.router.fleet.shared_load import SharedLoad
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.request.coalesce import Coalescer
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.retry import AttemptFailed
from tests.router.conftest import new_breaker, new_coalesce_config
from tests.router.fleet.test_shared_flights import URLS, Proc, chain, flight

SYSTEM = "A tenant's new system prompt. " + " ".join(f"rule {i}: answer politely" for i in range(120))


class FakeKv:
    """The exact index as the coalescer asks it: `exact` workers, and whether a prompt is stored."""

    def __init__(self, exact: bool) -> None:
        self.view = object()
        self.workers = {u: SimpleNamespace(exact=exact) for u in URLS}
        self.stored = False

    def residency(self, *_: Any, **__: Any) -> str | None:
        return "hbm" if self.stored else "none"

    def marks(self, url: str) -> tuple[int, int]:
        return 0, 0

    @staticmethod
    def kind(endpoint: str, body: dict[str, Any]) -> str:
        return "text"


class Process:
    """One router process's coalescer on the shared block, over the workers URLS."""

    def __init__(self, block: SharedLoad, index: int, kv: FakeKv | None = None) -> None:
        board = sf.FlightBoard(block.cells, block.extra_offset, block.processes, index,
                               lambda s: URLS[s] if 0 <= s < len(URLS) else None, URLS.index)
        self.co = Coalescer(new_coalesce_config(min_tokens=64, max_wait_s=3.0, grace_s=0.0), block_chars=64,
                            chars_per_token=lambda: 4.0, registry=CollectorRegistry(), max_retries=1,
                            kv=kv, board=board)  # type: ignore[arg-type]
        self.workers = {u: WorkerState(WorkerSpec(u, "mixed"), new_breaker()) for u in URLS}


def request(name: str, *, stream: bool, tokens: int = 1) -> RequestContext:
    text = f"{SYSTEM} question {name}"
    return RequestContext(rid=name, endpoint="/generate", request=None, raw=b"",  # type: ignore[arg-type]
                          body={"text": text, "stream": stream, "sampling_params": {"max_new_tokens": tokens}},
                          stream=stream, text=text, hashes=block_hashes(text, 64), named=None, logprobs=False,
                          started=0.0, headers={})


class Scripted:
    """An attempt that starts (`started`), lands its prompt when told (`land`: its first byte) and
    answers when told (`answer`, landing then if it had not)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.land = asyncio.Event()
        self.answer = asyncio.Event()

    async def __call__(self, ctx: RequestContext, pre: WorkerState, dec: WorkerState | None) -> str:
        self.started.set()
        landing = asyncio.ensure_future(self.land.wait())
        answer = asyncio.ensure_future(self.answer.wait())
        await asyncio.wait([landing, answer], return_when=asyncio.FIRST_COMPLETED)
        ctx.flight.land()
        await answer
        landing.cancel()
        return ctx.rid


def go(p: Process, ctx: RequestContext, attempt: Scripted, url: str = URLS[0]) -> asyncio.Task[str]:
    return asyncio.ensure_future(p.co.run(ctx, p.workers[url], None, attempt))


async def started_within(attempt: Scripted, seconds: float) -> bool:
    try:
        await asyncio.wait_for(attempt.started.wait(), seconds)
    except TimeoutError:
        return False
    return True


Held = tuple["Process", Scripted, Scripted, "asyncio.Task[str]", "asyncio.Task[str]"]


async def held_follower(block: SharedLoad) -> Held:
    """A streaming leader computing in process 0, and a follower in process 1 held for it: (process
    1, the leader's attempt, the follower's, the leader's request, the follower's)."""
    a, b = Process(block, 0), Process(block, 1)
    la, fb = Scripted(), Scripted()
    leader = go(a, request("leader", stream=True), la)
    await la.started.wait()
    b.co.sync()
    follower = go(b, request("follower", stream=True), fb)
    await asyncio.sleep(0.02)
    assert b.co.holding == 1
    return b, la, fb, leader, follower


@pytest.fixture
def block3() -> Iterator[SharedLoad]:
    b = SharedLoad.create(3, 8, extra=sf.ROW_CELLS)
    yield b
    b.close()


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 20))


def test_a_unary_leader_with_a_long_answer_is_not_waited_for_in_another_process(block3: SharedLoad) -> None:
    """Its own process hears its landing only from its whole answer (no trusted KV stream), so it
    does not hold its own followers for it; another process held its followers through the whole
    decode (up to max_wait_s), as it took every remote flight to land at its first byte."""
    async def main() -> None:
        a, b = Process(block3, 0), Process(block3, 1)
        la, fb = Scripted(), Scripted()
        leader = go(a, request("leader", stream=False, tokens=512), la)
        await la.started.wait()
        b.co.sync()  # b's picker looks at the board
        follower = go(b, request("follower", stream=True), fb)
        assert await started_within(fb, 0.5), "held for a leader that lands only with its answer"
        assert b.co.holding == 0
        fb.answer.set()
        la.answer.set()
        await asyncio.gather(leader, follower)
    run(main)


def test_a_unary_leader_on_an_exact_worker_lands_for_another_processs_followers(block3: SharedLoad) -> None:
    """On a worker whose KV events are trusted, its process lands it when the worker's stores cover its
    prompt - but only when a request of its own waited for it; another process's followers waited for
    its whole answer (or max_wait_s)."""
    async def main() -> None:
        kv = FakeKv(exact=True)
        a, b = Process(block3, 0, kv), Process(block3, 1, FakeKv(exact=True))
        la, fb = Scripted(), Scripted()
        leader = go(a, request("leader", stream=False, tokens=512), la)
        await la.started.wait()
        b.co.sync()  # b's picker looks at the board
        follower = go(b, request("follower", stream=True), fb)
        await asyncio.sleep(0.05)
        assert b.co.holding == 1 and not fb.started.is_set()  # waits for the leader's prefill
        kv.stored = True  # the leader's prompt is stored on its worker (its prefill ended)
        a.co.kv_batch(URLS[0])
        assert await started_within(fb, 0.5), "the landing was never published"
        fb.answer.set()
        la.answer.set()
        await asyncio.gather(leader, follower)
        assert b.co.held.labels("landed")._value.get() == 1
    run(main)


def test_a_held_follower_is_not_taken_for_the_leader_in_a_third_process(block3: SharedLoad) -> None:
    """A follower in process 0 waits for a leader in process 1. Process 2 mirrored both at once, the
    follower's row first: published as computing its whole chain, the follower took the blocks its
    leader computes, and process 2's request waited for the follower (its own answer, up to
    max_wait_s) instead of the leader's first byte."""
    async def main() -> None:
        b, a, c = Process(block3, 0), Process(block3, 1), Process(block3, 2)
        la, fb, gc = Scripted(), Scripted(), Scripted()
        leader = go(a, request("leader", stream=True), la)
        await la.started.wait()
        b.co.sync()  # b's picker looks at the board
        follower = go(b, request("follower", stream=True), fb)
        await asyncio.sleep(0.02)
        assert b.co.holding == 1
        c.co.sync()  # c's picker: both rows changed since its last look
        third = go(c, request("third", stream=True), gc)
        await asyncio.sleep(0.02)
        assert c.co.holding == 1
        la.land.set()  # the leader's first byte: its prompt is stored
        assert await started_within(fb, 0.5)
        assert await started_within(gc, 0.5), "process 2 waited for the held follower, not for the leader"
        for s in (la, fb, gc):
            s.answer.set()
        await asyncio.gather(leader, follower, third)
    run(main)


def test_a_follower_decides_on_the_board_as_it_is_when_the_picker_did_not_look(block3: SharedLoad) -> None:
    """The picker brings the mirror up to date only on its exact path (a candidate with trusted KV
    events); the hold read the overlay as it was at the process's last look and missed a leader in
    another process on the same worker."""
    async def main() -> None:
        a, b = Process(block3, 0), Process(block3, 1)
        la, fb = Scripted(), Scripted()
        leader = go(a, request("leader", stream=True), la)
        await la.started.wait()
        follower = go(b, request("follower", stream=True), fb)  # no b.co.sync(): the picker did not look
        await asyncio.sleep(0.05)
        assert b.co.holding == 1 and not fb.started.is_set()
        la.land.set()
        assert await started_within(fb, 0.5)
        la.answer.set()
        fb.answer.set()
        await asyncio.gather(leader, follower)
    run(main)


def test_a_look_that_raises_does_not_end_the_watch(block3: SharedLoad, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch that looks at the board while a request waits for another process's flight ended at
    the first exception, silently; the request then waited out its max_wait_s."""
    async def main() -> None:
        b, la, fb, leader, follower = await held_follower(block3)
        board = b.co.board
        assert board is not None
        real, calls = board.sync, []

        def flaky(*args: Any) -> int:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("a look that fails once")
            return real(*args)
        monkeypatch.setattr(board, "sync", flaky)
        await asyncio.sleep(0.02)
        la.land.set()
        assert await started_within(fb, 0.5), "the watch died with the exception"
        la.answer.set()
        fb.answer.set()
        await asyncio.gather(leader, follower)
    run(main)


def test_a_worker_taken_out_here_reroutes_requests_held_for_another_processs_flight_there(
        block3: SharedLoad) -> None:
    """A worker this process found unhealthy (or removed): its own flights there fail as their
    connections are closed and their followers are tried elsewhere; followers of another process's
    flight there waited until that process noticed too (its health checks, or the admin snapshot a
    second later), or max_wait_s."""
    async def main() -> None:
        b, la, fb, leader, follower = await held_follower(block3)
        b.workers[URLS[0]].healthy = False
        b.co.worker_down(URLS[0])
        with pytest.raises(AttemptFailed) as exc:
            await asyncio.wait_for(follower, 0.5)
        assert exc.value.worker == URLS[0] and not fb.started.is_set()
        la.answer.set()
        await leader
    run(main)


# ---- the board alone (two boards on one block, as in test_shared_flights.py) ----------------------
@pytest.fixture
def block() -> Iterator[SharedLoad]:
    b = SharedLoad.create(2, 8, extra=sf.ROW_CELLS)
    yield b
    b.close()


def test_a_row_zeroed_while_it_is_read_fails_its_flights_rather_than_landing_them(block: SharedLoad) -> None:
    """The supervisor zeroes a dead process's row (shared_load.py zero_row) while another process
    reads it: that reader got the row's old version, then zeroed slots. A slot holding id 0 was taken
    for another flight that had replaced the mirrored one - so the mirrored one had "landed", and all
    its followers went at once to compute the prefix, instead of one taking over."""
    a, b = Proc(block, 0), Proc(block, 1)
    f = flight(URLS[0], chain("dies mid-read"))
    a.board.publish(f, 0)
    b.sync()
    row = a.board.own.base
    block.cells[row + sf._ROW_HEAD:row + sf.ROW_CELLS] = memoryview(bytes((sf.ROW_CELLS - sf._ROW_HEAD) * 8)).cast("q")
    block.cells[row + sf.VERSION] += 1  # the header as the reader read it, before the zeroing reached it
    b.sync()
    assert [(s, c) for _, s, c in b.heard] == [("failed", "client")]
    assert not b.mirrored()


def test_a_board_full_of_landed_flights_still_publishes_a_computing_one(block: SharedLoad) -> None:
    """Landed flights keep their slot until their worker's KV events cover them (or the grace): at a
    high request rate every slot held a landed flight, and the computing ones - what another process's
    requests wait for - were the ones left unpublished. The oldest ended flight gives its slot up."""
    a, b = Proc(block, 0), Proc(block, 1)
    landed = [flight(URLS[0], chain(f"landed {i}", 2)) for i in range(sf.SLOTS)]
    for f in landed:
        a.board.publish(f, 0)
        a.board.state(f, sf.LANDED)
    new = flight(URLS[1], chain("computing now"))
    a.board.publish(new, 0)
    assert a.board.unpublished == 0 and a.board.own.slots[new] == 0  # the first landed one's slot
    b.sync()
    assert b.mirrored()[(URLS[1], tuple(new.hashes))] == "computing"
    assert (URLS[0], tuple(landed[0].hashes)) not in b.mirrored()
    a.board.free(landed[0])  # its request's end later: nothing left to free
    assert a.board.own.slots[new] == 0


def test_a_follower_promoted_in_another_process_computes_there_for_this_ones_requests(block: SharedLoad) -> None:
    """A follower published as held (it waited for a leader that failed), then promoted in its process:
    its claim makes it, here too, the flight computing the blocks nobody computes any more."""
    a, b = Proc(block, 0), Proc(block, 1)
    h = chain("promoted", 20)
    f = flight(URLS[0], h)
    a.board.publish(f, len(h))  # held: it computes nothing of its own
    b.sync()
    assert b.pending.leader(URLS[0], [*h, 1])[0] is None
    a.board.claim(f, 2)
    assert b.sync() == 1
    leader, computing = b.pending.leader(URLS[0], [*h, 1])
    assert leader is not None and isinstance(leader.tag, sf.Remote) and computing == len(h) - 2


def test_add_says_where_a_flight_starts_computing() -> None:
    p = PendingBlocks()
    lead, follow = flight(URLS[0], chain("x", 10)), flight(URLS[0], [*chain("x", 10), 7, 8])
    assert p.add(lead, 3) == 3
    assert p.add(follow, 3) == 10  # the leader computes 3..9, the worker holds 0..2: its own tail from 10
    assert p.add(flight(URLS[0], chain("y", 4)), 4) == 4  # held whole: none of its own


def test_a_mirrored_flight_joins_the_overlay_only_for_a_decision_on_a_chain_like_its_own(block: SharedLoad) -> None:
    """Every process added every other process's chains to its overlay and removed them again: N - 1
    times its own overlay work per request. Mirrored now, they join at the first decision here that
    reads a chain on their worker starting with their first block, and leave unseen otherwise."""
    a, b = Proc(block, 0), Proc(block, 1)
    pending = PendingBlocks()
    one, two = flight(URLS[0], chain("one")), flight(URLS[0], chain("two"))
    for f in (one, two):
        a.board.publish(f, 0)

    def sync() -> int:
        return b.board.sync(pending, lambda f, s: b.heard.append((f, s, f.cause)), lambda f: "worker", "client")
    assert sync() == 2 and pending.blocks(URLS[0]) == 0
    assert b.board.materialize(pending, URLS[1], one.hashes) == 0  # another worker
    assert b.board.materialize(pending, URLS[0], [*one.hashes[:3], 5]) == 1
    assert pending.depth(URLS[0], one.hashes) == len(one.hashes) and pending.depth(URLS[0], two.hashes) == 0
    one.land()
    a.board.state(one, sf.LANDED)
    a.board.state(two, sf.LANDED)
    a.board.free(one)
    a.board.free(two)
    sync()
    assert pending.blocks(URLS[0]) == 0 and not b.board.mirror.lazy and not b.mirrored()
    assert sorted(s for _, s, _ in b.heard) == ["landed", "landed"]
