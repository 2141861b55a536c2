"""The router's object graph comes from one place (router/daemon/assembly.py): `build(cfg, role)` for the
only process, a leader and a follower gives each part its collaborators, the result serves, and nothing
in the router wires parts together by assignment after construction."""

from __future__ import annotations

import ast
import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from infer_ctl.router.daemon.assembly import build
from infer_ctl.router.daemon.embed import router_config
from infer_ctl.router.daemon.server import RouterServer
from infer_ctl.router.fleet import shared_flights
from infer_ctl.router.fleet.shared_load import SharedLoad
from infer_ctl.router.scaleout.follow import Follower, ProcessRole, Publisher
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread

ROUTER = Path(__file__).resolve().parents[2] / "infer_ctl" / "router"
#: the only function that may link parts after they are built: the cycles no order breaks
BIND = ("daemon/assembly.py", "_bind")
#: names of the router's settings while they are built (config.py, kvindex/kv_settings.py, daemon/procs.py)
CONFIG_NAMES = frozenset({"cfg", "settings"})


@pytest.fixture(scope="module")
def cluster() -> Any:
    c = start_cluster_in_thread([WorkerSpec("mixed") for _ in range(2)])
    yield c
    c.stop()


def _parts_linked(server: RouterServer) -> None:
    router = server.router
    assert router.picker.kv is router.kv and router.feedback.kv is router.kv and router.feedback.index is router.index
    assert router.picker.pending is router.coalesce.pending and router.coalesce.kv is router.kv
    assert router.kv.on_batch == router.coalesce.kv_batch
    assert router.calls.suspect == server.health.suspect
    assert router.attempts.relay.recovery is not None
    assert router.attempts.open_stream == router.attempts.opener.open_stream
    router.ratio.learn(3000, 1000)  # what feedback learns, every reader of the ratio sees
    assert router.kv.chars_per_token() == router.coalesce.chars_per_token() == router.chars_per_token == 3.0
    assert server.admin.workers.replicas is server.admin.prefixes.replicas is server.admin.status.replicas is None
    scrape = router.metrics.render().decode()
    assert "inferctl_router_worker_healthy" in scrape and "inferctl_router_connections_open" in scrape


def test_the_only_process_is_built_linked_and_serves(cluster: ThreadedSimCluster) -> None:
    server = build(router_config(workers=[w.url for w in cluster.workers], health_interval_s=0.3))
    _parts_linked(server)
    assert server.proc is None and server.procs is None and server.shared is None
    assert server.router.coalesce.board is None and server.router.picker.sync_pending is None
    assert server.admin.on_change is None and server.admin.status.peer_counters is None

    async def serve() -> int:
        await server.start()
        try:
            async with httpx.AsyncClient() as client:
                resp = await client.post(server.url + "/generate", json={"text": "hello there",
                                                                         "sampling_params": {"max_new_tokens": 2}})
                return resp.status_code
        finally:
            await server.stop(drain=False)

    assert asyncio.run(asyncio.wait_for(serve(), 60)) == 200


def test_a_leader_and_a_follower_are_built_on_one_shared_block_and_both_serve(cluster: ThreadedSimCluster) -> None:
    state = tempfile.mkdtemp(prefix="asm", dir="/tmp")  # a unix socket's path is short
    block = SharedLoad.create(2, 8, extra=shared_flights.ROW_CELLS)
    urls = [w.url for w in cluster.workers]
    try:
        leader, follower = (build(router_config(workers=urls, health_interval_s=0.3),
                                  ProcessRole(i, 2, state, block.name, 8)) for i in (0, 1))
        for i, server in enumerate((leader, follower)):
            _parts_linked(server)
            router = server.router
            assert server.shared is not None and server.shared.name == block.name
            assert [w.slot for w in router.workers.all()] == [0, 1]  # the configured order, in every process
            assert all(w.cell == block.cell(i, w.slot) for w in router.workers.all())
            assert router.kv.processes == 2 and router.coalesce.board is not None
            assert router.picker.sync_pending == router.coalesce.sync
            assert server.process_metrics is not None
        assert isinstance(leader.procs, Publisher) and leader.admin.on_change == leader.procs.publish_now
        assert leader.process_metrics is not None
        assert leader.admin.status.peer_counters == leader.process_metrics.peer_counters
        assert isinstance(follower.procs, Follower) and follower.admin.on_change is None
        assert follower.admin.status.peer_counters is None

        async def serve() -> list[int]:
            await leader.start()  # publishes the snapshot the follower starts from
            try:
                await follower.start()
                try:
                    async with httpx.AsyncClient() as client:
                        return [(await client.post(s.url + "/generate", json={
                            "text": "hello there", "sampling_params": {"max_new_tokens": 2}})).status_code
                                for s in (leader, follower)]
                finally:
                    await follower.stop(drain=False)
            finally:
                await leader.stop(drain=False)

        assert asyncio.run(asyncio.wait_for(serve(), 60)) == [200, 200]
    finally:
        block.close()
        shutil.rmtree(state, ignore_errors=True)


def _assignments(tree: ast.AST) -> list[tuple[str, ast.expr]]:
    """(enclosing function, target) of every assignment to an attribute."""
    out: list[tuple[str, ast.expr]] = []

    def visit(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else fn
            if isinstance(child, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                for t in targets:
                    out.extend((name, e) for e in (t.elts if isinstance(t, ast.Tuple) else [t]))
            visit(child, name)

    visit(tree, "")
    return out


def test_no_part_is_wired_into_another_after_construction() -> None:
    """`router.picker.sync_pending = ...` outside the assembly's `_bind`, or a class attribute defaulted
    to None for someone to set later (`kv: KvRouting | None = None` on a class), is the wiring by
    assignment the assembly replaced: each part gets its collaborators as constructor arguments."""
    found = []
    for path in sorted(ROUTER.rglob("*.py")):
        rel = path.relative_to(ROUTER).as_posix()
        tree = ast.parse(path.read_text())
        for fn, target in _assignments(tree):
            depth, root = 0, target
            while isinstance(root, ast.Attribute):
                depth, root = depth + 1, root.value
            # an attribute of another object's part (`router.kv.on_batch`, `self.router.picker.kv`); `self.x.y`
            # is a part's own state (`self.stats.gaps`, `self.http.max_connections`)
            own = isinstance(root, ast.Name) and root.id == "self"
            settings = isinstance(root, ast.Name) and root.id in CONFIG_NAMES  # filling in the settings: no part
            if depth >= (3 if own else 2) and not settings and (rel, fn) != BIND:
                found.append(f"{rel}: {ast.unparse(target)} (in {fn or 'module'})")
        for cls in ast.walk(tree):
            if not isinstance(cls, ast.ClassDef) or any("dataclass" in ast.unparse(d) for d in cls.decorator_list) \
                    or any(ast.unparse(b) in ("Protocol", "NamedTuple") for b in cls.bases):
                continue
            found += [f"{rel}: class {cls.name}: {ast.unparse(n)}" for n in cls.body
                      if isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Constant) and n.value.value is None]
    assert not found, "\n".join(found)
    # and the check sees what it looks for
    bad = ast.parse("def f(self, router):\n    router.picker.sync_pending = 1\n    self.router.picker.kv = 2\n")
    assert [(fn, ast.unparse(t)) for fn, t in _assignments(bad)] == [("f", "router.picker.sync_pending"),
                                                                    ("f", "self.router.picker.kv")]
