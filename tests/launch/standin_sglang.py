"""STAND-IN for SGLang's `python -m sglang.launch_server` (no GPUs here), installed by the tests as
`<venv>/<version>/bin/python` on the "nodes". It reads the same flags the real server gets and starts an
inferctl simulated worker (infer_ctl.sim) with the same host, port, role, bootstrap port, model path and
speculative steps (static, or SGLang's --speculative-adaptive with its --speculative-adaptive-config file),
so /health, /server_info and /v1/loads answer like SGLang's. Like SGLang it fails at
start-up, with an error on stderr, when the model path does not exist.

A server over several nodes (`--nnodes N --node-rank r --dist-init-addr host:port`) forms its group the
way torch.distributed's TCP store does: rank 0 listens on the dist-init address and serves HTTP only
once every other rank has joined it; a rank > 0 retries connecting until rank 0 answers. A rank whose
peer goes away behaves as a real one whose process group died: rank 0 exits with an error (NCCL's
watchdog aborts it), a rank > 0 hangs (serving nothing, never rejoining) until it is stopped. So a new
rank 0 next to an old rank 1 never becomes healthy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys


def _typed(value: str) -> object:
    """A value as SGLang's resolved ServerArgs holds it: switches as booleans, numbers as numbers, the
    rest (paths, choices, JSON configs) as text."""
    if value in ("True", "False"):
        return value == "True"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _as_sglang_reports(args: list[str]) -> dict[str, object]:
    """/server_info as SGLang 0.5.23 builds it (build_server_info in sglang/srt/utils/common.py): every
    resolved ServerArgs field of what was given, with resolution's rewrites (NEXTN -> EAGLE, an upper-case
    algorithm, mooncake_tcp -> mooncake without an IB device, num_draft_tokens = num_steps + 1 at topk 1),
    plus `launch_command`, the arguments as given, space-joined."""
    from infer_ctl.core.sglang.settings import command_settings, dest

    out: dict[str, object] = {}
    for flag, value in command_settings(args).items():
        if flag.startswith("--"):
            out[dest(flag)] = _typed(value)
    algo = out.get("speculative_algorithm")
    if isinstance(algo, str):
        out["speculative_algorithm"] = "EAGLE" if algo.upper() == "NEXTN" else algo.upper()
    if out.get("disaggregation_transfer_backend") == "mooncake_tcp":
        out["disaggregation_transfer_backend"] = "mooncake"
        out["disaggregation_ib_device"] = None
    if out.get("speculative_eagle_topk") == 1 and isinstance(out.get("speculative_num_steps"), int):
        out["speculative_num_draft_tokens"] = int(out["speculative_num_steps"]) + 1  # type: ignore[call-overload]
    out["launch_command"] = " ".join(args)
    return out


def main(argv: list[str]) -> int:
    if argv[:2] != ["-m", "sglang.launch_server"]:
        print(f"standin python: only `-m sglang.launch_server` is supported, got {argv[:2]}", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="sglang.launch_server (standin)")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--disaggregation-mode", default="null")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    # SGLang's adaptive mode: the simulator runs SGLang's own controller (infer_ctl/sim/spec_adaptive.py)
    # with the candidates of the config file launch wrote next to the env file
    p.add_argument("--speculative-adaptive", action="store_true")
    p.add_argument("--speculative-adaptive-config", default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", default=None)
    ns, _unknown = p.parse_known_args(argv[2:])
    if not os.path.isdir(ns.model_path):
        print(f"OSError: model path {ns.model_path} is not a directory (standin sglang)", file=sys.stderr)
        return 1

    from aiohttp import web

    from infer_ctl.sim.config import WorkerSpec
    from infer_ctl.sim.info_api import InfoApi
    from infer_ctl.sim.server import SimWorker

    role = {"prefill": "prefill", "decode": "decode"}.get(ns.disaggregation_mode, "mixed")
    spec = WorkerSpec(
        role=role,  # type: ignore[arg-type]
        host=ns.host,
        port=ns.port,
        bootstrap_port=ns.disaggregation_bootstrap_port,
        model=ns.model_path,
        time_scale=0.01,
        spec_gamma=ns.speculative_num_steps or (None if ns.speculative_adaptive else 3),
        spec_adaptive=ns.speculative_adaptive,
        spec_adaptive_config=ns.speculative_adaptive_config,
    )

    # every flag reported back in /server_info as SGLang would, so `check servers` judges what was
    # launched rather than the simulator's fixed defaults (tp 8, EAGLE3, topk 1)
    reported = _as_sglang_reports(argv[2:])

    class LaunchedInfo(InfoApi):
        async def server_info(self, request: web.Request) -> web.Response:
            # the simulator names its own command line in launch_command; this one is SGLang's
            doc = json.loads((await super().server_info(request)).text or "{}")
            return web.json_response({**doc, **reported})

    class LaunchedWorker(SimWorker):
        def __init__(self, spec: WorkerSpec) -> None:
            super().__init__(spec)
            self.info_api = LaunchedInfo(self, self._server_args)

        def _server_args(self) -> dict[str, object]:
            return {**super()._server_args(), **reported}

    async def serve() -> int:
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        if ns.nnodes > 1 and ns.node_rank > 0:
            await _follower(ns, done)
            return 0
        lost = asyncio.Event()
        server = await _rendezvous(ns, lost, done) if ns.nnodes > 1 else None
        if done.is_set():
            return 0  # stopped while waiting for its peers
        worker = LaunchedWorker(spec)
        await worker.start()
        print(f"standin sglang {role} ready on {worker.url}", flush=True)
        stop = asyncio.ensure_future(done.wait())
        peer = asyncio.ensure_future(lost.wait())
        await asyncio.wait({stop, peer}, return_when=asyncio.FIRST_COMPLETED)
        if lost.is_set() and not done.is_set():
            print("standin sglang: a peer rank left the process group; aborting (NCCL watchdog)", flush=True)
            os._exit(1)
        print("standin sglang: SIGTERM, shutting down", flush=True)
        await worker.stop()
        if server is not None:
            server.close()
        return 0

    return asyncio.run(serve())


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


async def _rendezvous(ns: argparse.Namespace, lost: asyncio.Event, done: asyncio.Event) -> asyncio.Server:
    """Rank 0: wait until ranks 1..n-1 joined on the dist-init address; `lost` is set if one leaves."""
    host, port = _split(ns.dist_init_addr)
    joined: set[int] = set()
    all_in = asyncio.Event()

    async def on_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        rank = int(line.split()[1]) if line.startswith(b"rank ") else -1
        joined.add(rank)
        print(f"standin sglang: rank {rank} joined", flush=True)
        if len(joined) >= ns.nnodes - 1:
            all_in.set()
        await reader.read()  # EOF: the peer is gone
        lost.set()

    server = await asyncio.start_server(on_peer, host, port)
    print(f"standin sglang: rank 0 waiting for {ns.nnodes - 1} peer(s) on {host}:{port}", flush=True)
    waits = {asyncio.ensure_future(all_in.wait()), asyncio.ensure_future(done.wait())}
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    return server


async def _follower(ns: argparse.Namespace, done: asyncio.Event) -> None:
    host, port = _split(ns.dist_init_addr)
    while not done.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
            break
        except OSError:
            await asyncio.sleep(0.2)
    else:
        return
    writer.write(f"rank {ns.node_rank}\n".encode())
    await writer.drain()
    print(f"standin sglang: rank {ns.node_rank} joined rank 0 at {host}:{port}", flush=True)
    eof = asyncio.ensure_future(reader.read())
    stop = asyncio.ensure_future(done.wait())
    await asyncio.wait({eof, stop}, return_when=asyncio.FIRST_COMPLETED)
    if not done.is_set():
        print("standin sglang: lost rank 0; hanging like a rank whose process group died", flush=True)
        await done.wait()
    writer.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
