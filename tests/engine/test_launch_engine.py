"""`launch` starting real SGLang 0.5.23 servers from a profile through the local connector (the process
supervisor: setsid, pid and log files), and every command that reads them: `status`, `check servers`,
`audit --only servers`, `logs`, drift after a profile change, `launch --rolling` under load through the
router with no failed request, `stop`; and `launch --check-args` with SGLang's own parser.

The profile is what an operator of a CPU-only lab writes: `gpus: 0` nodes whose servers run with
`--device cpu` (a contradiction `profile validate` accepts only with that flag), the engine's virtual
environment as the pinned venv (`<venv>/0.5.23`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.profile import load_profile
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from tests.engine import engine
from tests.engine.conftest import Models
from tests.ports import free_port_range

CPU_ARGS = [  # page 32: whole 4,096-byte packets for this model's 128-byte rows (launch.kv_page)
   "--device", "cpu", "--load-format", "dummy", "--attention-backend", "torch_native",
            "--disable-overlap-schedule", "--max-total-tokens", "8192", "--page-size", "32", "--sleep-on-idle"]


def _profile(tmp: Path, model: str, *, extra: list[str] | None = None) -> dict[str, Any]:
    """Two collocated servers on two loopback addresses: a rolling relaunch keeps one serving (over PD a
    pool of one has nothing to serve with while its server restarts; PD launch is what the router tests'
    fleet and docs/launch.md cover)."""
    venvs = tmp / "venvs"
    venvs.mkdir(exist_ok=True)
    if not (venvs / "0.5.23").exists():
        (venvs / "0.5.23").symlink_to(engine.VENV)  # the whole venv: its python finds pyvenv.cfg
    port = free_port_range(1)
    router_port = free_port_range(1)
    return {
        "name": "engine-local",
        "collocated": True,
        "nodes": [{"name": f"n{i}", "host": f"127.0.0.{i}", "connection": "local", "roles": ["prefill", "decode"],
                   "gpus": 0} for i in (1, 2)],
        "models": {"target": {"path": model, "tp": 1}},
        "sglang": {
            "version": "0.5.23", "venv": str(venvs), "log_dir": str(tmp / "{node}" / "log"),
            "lifecycle": {"supervisor": "process", "config_dir": str(tmp / "{node}" / "etc"),
                          "start_timeout_s": 300, "stop_timeout_s": 30},
            "collocated": {"port": port},
            "env": {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"},
            "extra_args": {"collocated": [*CPU_ARGS, *(extra or [])]},
        },
        "router": {"listen": f"127.0.0.1:{router_port}"},
    }


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli(*argv: str, timeout: float = 600) -> tuple[int, Any]:
    """The CLI as a user runs it: its own process, --json."""
    proc = subprocess.run([sys.executable, "-m", "infer_ctl", *argv, "--json"], capture_output=True, text=True,
                          timeout=timeout)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"{argv}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}") from None


def _statuses(doc: dict[str, Any], prefix: str) -> dict[tuple[str, str], str]:
    return {(f["check"], f["subject"]): f["status"] for f in doc["findings"] if f["check"].startswith(prefix)}


@pytest.fixture(scope="module")
def launched(engine_python: Path, tiny_models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("launch-engine")
    path = _write(tmp / "profile.yaml", _profile(tmp, tiny_models.jinja))
    code, doc = cli("launch", "-p", str(path))
    try:
        assert code == 0, json.dumps(doc, indent=1)[:4000]
        yield path
    finally:
        cli("stop", "-p", str(path))


def test_status_check_audit_agree_on_running_servers(launched: Path) -> None:
    code, status = cli("status", "-p", str(launched))
    assert code == 0, status
    code, check = cli("check", "servers", "-p", str(launched))
    assert code == 0, check
    got = _statuses(check, "servers.")
    health = {k: v for k, v in got.items() if k[0] == "servers.health"}
    assert len(health) == 2 and set(health.values()) == {"ok"}, check
    assert {v for k, v in got.items() if k[0] == "servers.drift"} == {"ok"}, check
    code, audit = cli("audit", "--only", "servers", "-p", str(launched))
    assert code == 0 and _statuses(audit, "servers.") == got


def test_logs_and_check_args(launched: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "infer_ctl", "logs", "n1-collocated", "-p", str(launched),
                           "--lines", "200"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "The server is fired up and ready to roll!" in proc.stdout, proc.stdout[-2000:]
    code, doc = cli("launch", "--dry-run", "--check-args", "-p", str(launched))
    assert code in (0, 1), doc  # SGLang's own parser accepts every rendered command
    assert not [f for f in doc["findings"] if f["status"] == "fail"], doc


@pytest.mark.timeout(900)  # two server restarts, one at a time, each waited for (minutes on a loaded machine)
def test_drift_then_rolling_relaunch_under_load(launched: Path, tiny_models: Models) -> None:
    """The profile changes (--max-running-requests 16): check servers names the drift; a rolling
    relaunch replaces both servers one at a time while a client keeps sending through the router, and
    not one of its requests fails."""
    data = yaml.safe_load(launched.read_text())
    data["sglang"]["extra_args"]["collocated"] = [*data["sglang"]["extra_args"]["collocated"],
                                                  "--max-running-requests", "16"]
    _write(launched, data)
    code, check = cli("check", "servers", "-p", str(launched))
    drift = {k: v for k, v in _statuses(check, "servers.drift").items()}
    assert code != 0 and len(drift) == 2 and "ok" not in drift.values(), check

    profile = load_profile(str(launched))
    handle: RouterHandle = start_router_in_thread(router_config(profile=profile, listen=data["router"]["listen"],
                                                                health_interval_s=0.5))
    stop = threading.Event()
    results: list[int | str] = []

    def client() -> None:
        with httpx.Client(timeout=120) as c:
            while not stop.is_set():
                try:
                    r = c.post(handle.url + "/generate", json={"text": "The quick brown fox",
                                                               "sampling_params": {"max_new_tokens": 4}})
                    results.append(r.status_code)
                except httpx.HTTPError as exc:
                    results.append(repr(exc))

    t = threading.Thread(target=client, daemon=True)
    try:
        t.start()
        code, doc = cli("launch", "--rolling", "-p", str(launched), timeout=900)
        assert code == 0, json.dumps(doc, indent=1)[:4000]
    finally:
        stop.set()
        t.join(130)
        handle.stop()
    failed = [r for r in results if r != 200]
    assert len(results) >= 5 and not failed, (len(results), failed[:5])
    code, check = cli("check", "servers", "-p", str(launched))
    assert code == 0, check
