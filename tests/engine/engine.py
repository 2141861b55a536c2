"""Real SGLang 0.5.23 servers for the `engine` tier: its own `python -m sglang.launch_server` on the CPU
backend, serving the tiny model of tests/engine/tiny_model.py with random weights (`--load-format dummy`).

Nothing here is a stand-in: every endpoint, header rule, error body, `/server_info` field, `/metrics`
family, KV event, PD bootstrap and Mooncake transfer (its TCP transport) is SGLang's own code. The
text is noise and the timing is CPU timing, so tests assert behaviour and protocol, never speed.

The environment is a virtual environment apart from the project's (SGLang pins its own torch,
transformers, fastapi...): `scripts/install-test-deps.sh` builds it at `$INFERCTL_SGLANG_VENV`
(default `~/.cache/inferctl-test/sglang-cpu`), and writes `.sglang-cpu-ready` in it when complete.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.ports import free_port_range

VENV = Path(os.environ.get("INFERCTL_SGLANG_VENV")
            or Path(os.environ.get("INFERCTL_TEST_CACHE", Path.home() / ".cache/inferctl-test")) / "sglang-cpu")
INSTALL_CMD = "sudo scripts/install-test-deps.sh (builds the SGLang 0.5.23 CPU environment at INFERCTL_SGLANG_VENV)"
#: what every server of the tier shares: CPU backend, a small KV pool (the default sizes it from host
#: memory: 2 GB per server), no overlap scheduler (its CPU path is untested upstream)
COMMON = ["--load-format", "dummy", "--device", "cpu", "--disable-overlap-schedule",
          "--attention-backend", "torch_native", "--host", "127.0.0.1", "--max-total-tokens", "8192",
          "--enable-metrics", "--enable-cache-report", "--log-level", "info",
          # an idle scheduler otherwise polls its sockets without pause: 4 idle servers held most of a
          # 2-core machine while the other tests ran (load 18 measured)
          "--sleep-on-idle"]


def python() -> Path | None:
    """The engine environment's interpreter, or None when it is not (completely) installed."""
    py = VENV / "bin" / "python"
    return py if py.is_file() and (VENV / ".sglang-cpu-ready").is_file() else None


def smg() -> Path | None:
    """SGLang's Rust gateway (smg 1.13.0), installed in the same environment."""
    exe = VENV / "bin" / "smg"
    return exe if exe.is_file() and python() is not None else None


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"SGLANG_USE_CPU_ENGINE": "1", "MOONCAKE_PROTOCOL": "tcp", "MC_FORCE_TCP": "1",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                # a torch thread pool per server would fight over the 2 cores of a CI machine
                "OMP_NUM_THREADS": "1"})
    env.pop("PYTHONPATH", None)
    return env


class EngineServer:
    """One `sglang.launch_server` process. `kv_events=True` gives it a ZMQ publisher (bound, with a
    replay socket) on two ports of its own."""

    def __init__(self, name: str, model: str, workdir: Path, *, page_size: int = 16, mode: str | None = None,
                 kv_events: bool = False, extra: Sequence[str] = ()) -> None:
        self.name, self.model, self.mode = name, model, mode
        self.page_size = page_size
        base = free_port_range(4)
        self.port = base
        self.bootstrap_port = base + 1 if mode == "prefill" else None
        self.kv_endpoint = f"tcp://127.0.0.1:{base + 2}" if kv_events else None
        self.kv_replay = f"tcp://127.0.0.1:{base + 3}" if kv_events else None
        self.extra = list(extra)
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        py = python()
        assert py is not None
        args = [str(py), "-m", "sglang.launch_server", "--model-path", self.model, *COMMON,
                "--port", str(self.port), "--page-size", str(self.page_size)]
        if self.mode is not None:
            args += ["--disaggregation-mode", self.mode, "--disaggregation-transfer-backend", "mooncake"]
            if self.mode == "prefill":
                args += ["--disaggregation-bootstrap-port", str(self.bootstrap_port)]
            else:
                # a decode on CPU keeps retracted requests' KV in host tensors (the default needs CUDA)
                args += ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
        if self.kv_endpoint is not None:
            cfg = {"publisher": "zmq", "endpoint": self.kv_endpoint, "topic": "kv", "bind": True,
                   "replay_endpoint": self.kv_replay}
            args += ["--kv-events-config", json.dumps(cfg)]
        return args + self.extra

    def start(self) -> None:
        fh = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(self.argv(), stdout=fh, stderr=subprocess.STDOUT, env=engine_env(),
                                     start_new_session=True)
        fh.close()

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"SGLang server {self.name} exited {self.proc.returncode}:\n{self.tail()}")
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"SGLang server {self.name} not ready after {timeout:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server and its scheduler/detokenizer children (its own process group)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()
        self.wait_ready()

    def post(self, path: str, body: Any, timeout: float = 60) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=timeout)

    def get(self, path: str, timeout: float = 10) -> httpx.Response:
        return httpx.get(self.url + path, timeout=timeout)


def start_all(servers: Sequence[EngineServer], timeout: float = 300.0) -> None:
    """Start every server at once (their ~25 s start-ups overlap), then wait for all; on a failure every
    one is stopped."""
    try:
        for s in servers:
            s.start()
        deadline = time.monotonic() + timeout
        for s in servers:
            s.wait_ready(max(deadline - time.monotonic(), 1.0))
    except BaseException:
        for s in servers:
            s.stop(signal.SIGKILL)
        raise
