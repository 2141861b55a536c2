"""A real redis-server (Debian package `redis-server`) on a free loopback port, for the router replicas'
shared state: no persistence (`--save '' --appendonly no`), so a restart comes back empty as a store
without persistence does in production. Tests skip, naming the package, when the binary is missing."""

from __future__ import annotations

import importlib.util
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from tests.sim.kv_client import free_port

REDIS_SERVER = shutil.which("redis-server")


def need_redis() -> str:
    if importlib.util.find_spec("redis") is None:
        pytest.skip("the Redis client (python package redis) is not installed: pip install -e '.[test]'")
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (Debian package redis-server: apt-get install redis-server, "
                    "or scripts/install-test-deps.sh)")
    return REDIS_SERVER


class RedisServer:
    def __init__(self, port: int | None = None) -> None:
        self.binary = need_redis()
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="inferctl-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.05)
        client.close()
        return self

    def kill(self) -> None:
        """SIGKILL: the store vanishes as in a crash (nothing is written, no goodbye to clients)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def client(self):  # type: ignore[no-untyped-def]
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2, decode_responses=True)
