"""STAND-IN for SGLang's `python -m sglang.launch_server` (no GPUs here), installed by the tests as
`<venv>/<version>/bin/python` on the "nodes". It reads the same flags the real server gets and starts an
inferctl simulated worker (infer_ctl.sim) with the same host, port, role, bootstrap port, model path and
speculative steps, so /health, /server_info and /v1/loads answer like SGLang's. Like SGLang it fails at
start-up, with an error on stderr, when the model path does not exist.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

REPORTED = (
    "--tp-size",
    "--dp-size",
    "--disaggregation-transfer-backend",
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--radix-eviction-policy",
)
_REPORTED_KEYS = {f[2:].replace("-", "_") for f in REPORTED}


def _as_sglang_reports(launched: dict[str, str]) -> dict[str, object]:
    """Values as SGLang 0.5.23's /server_info shows them: ints as ints, NEXTN resolved to EAGLE,
    mooncake_tcp rewritten to mooncake (+ MC_FORCE_TCP)."""
    out: dict[str, object] = {}
    for key, value in launched.items():
        if key in ("tp_size", "dp_size", "speculative_eagle_topk", "speculative_num_draft_tokens"):
            out[key] = int(value)
        elif key == "speculative_algorithm":
            out[key] = "EAGLE" if value.upper() == "NEXTN" else value.upper()
        elif key == "disaggregation_transfer_backend":
            out[key] = "mooncake" if value == "mooncake_tcp" else value
        else:
            out[key] = value
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
    # reported back in /server_info as SGLang would, so `check servers` judges what was launched rather
    # than the simulator's fixed defaults (tp 8, EAGLE3, topk 1)
    for flag in REPORTED:
        p.add_argument(flag, dest=flag[2:].replace("-", "_"), default=None)
    ns, _unknown = p.parse_known_args(argv[2:])
    if not os.path.isdir(ns.model_path):
        print(f"OSError: model path {ns.model_path} is not a directory (standin sglang)", file=sys.stderr)
        return 1

    from infer_ctl.sim.config import WorkerSpec
    from infer_ctl.sim.server import SimWorker

    role = {"prefill": "prefill", "decode": "decode"}.get(ns.disaggregation_mode, "mixed")
    spec = WorkerSpec(
        role=role,  # type: ignore[arg-type]
        host=ns.host,
        port=ns.port,
        bootstrap_port=ns.disaggregation_bootstrap_port,
        model=ns.model_path,
        time_scale=0.01,
        spec_gamma=ns.speculative_num_steps or 3,
    )

    launched = {k: v for k, v in vars(ns).items() if k in _REPORTED_KEYS and v is not None}

    class LaunchedWorker(SimWorker):
        def _server_args(self) -> dict[str, object]:
            return {**super()._server_args(), **_as_sglang_reports(launched)}

    async def serve() -> None:
        worker = LaunchedWorker(spec)
        await worker.start()
        print(f"standin sglang {role} ready on {worker.url}", flush=True)
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        await done.wait()
        print("standin sglang: SIGTERM, shutting down", flush=True)
        await worker.stop()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
