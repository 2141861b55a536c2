"""Launch safety on real sshd nodes: two launches at once, a foreign process on a server's port, a pid file
that lost track of its server.

Real: OpenSSH servers on loopback, the SSH connector, the node-side shell (lock file, /proc reads,
signals), separate `inferctl` processes racing each other. Stand-in: `<venv>/0.5.23/bin/python` is
tests/launch/standin_sglang.py (an inferctl simulated worker in place of SGLang). The "foreign" server
is that same stand-in started by hand, i.e. an SGLang-compatible server no pid file names.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from infer_ctl.core.sglang import find_instance, pid_file_path
from infer_ctl.profile.load import load_profile
from tests.launch.standin_cluster import STANDIN, pd_profile, run_cli, standin_servers, write_yaml
from tests.waiting import wait_for

pytest.importorskip("infer_ctl.sim.server", reason="the simulator (infer_ctl.sim) is not available")
pytestmark = [pytest.mark.ssh, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def pd_cluster(ssh_cluster: Any, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    cluster = ssh_cluster(2, names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    return pd_profile(cluster, tmp_path)


def _inferctl(*argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    return subprocess.Popen([sys.executable, "-m", "infer_ctl", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)  # fmt: skip


def _pid_file(prof: Path, name: str) -> int | None:
    path = Path(pid_file_path(find_instance(load_profile(str(prof)), name)))
    return int(path.read_text()) if path.exists() else None


def _ports(data: dict[str, Any]) -> dict[str, int]:
    nodes = {n["name"]: n["overrides"] for n in data["nodes"]}
    return {"pf-01-prefill": nodes["pf-01"]["prefill_port"], "dc-01-decode": nodes["dc-01"]["decode_port"]}


def _assert_one_server_each(prof: Path, data: dict[str, Any]) -> None:
    """No orphan: on each instance's port exactly one server runs, and it is the one its pid file names."""
    for name, port in _ports(data).items():
        assert standin_servers(port) == [_pid_file(prof, name)], name


def test_two_concurrent_launches_one_fails_clearly_and_no_orphan_is_left(
    pd_cluster: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    prof, data = pd_cluster
    p = str(prof)
    try:
        runs = [_inferctl("launch", "-p", p, "--json") for _ in range(2)]
        results = [(r.wait(120), *r.communicate()) for r in runs]
        codes = sorted(code for code, _, _ in results)
        assert codes == [0, 2], results
        _, lost_out, _ = next(r for r in results if r[0] == 2)
        winner = next(r for r, res in zip(runs, results, strict=True) if res[0] == 0)
        error = json.loads(lost_out)["error"]["message"]
        assert "another inferctl launch/stop is running here" in error, error
        assert f"held by pid {winner.pid} " in error and " since " in error, error
        _assert_one_server_each(prof, data)

        # the same race where both may wait: the second waits for the first, finds nothing to do
        for node in data["nodes"]:
            node["overrides"]["extra_args"] = ["--log-level", "info"]
        write_yaml(prof, data)
        runs = [_inferctl("launch", "-p", p, "--json", "--lock-wait", "60") for _ in range(2)]
        results = [(r.wait(120), *r.communicate()) for r in runs]
        assert [code for code, _, _ in results] == [0, 0], results
        actions = sorted(
            tuple(sorted({r["action"] for r in json.loads(out)["results"]})) for _, out, _ in results
        )
        assert actions == [("restarted",), ("unchanged",)], results
        _assert_one_server_each(prof, data)
    finally:
        code, doc, _ = run_cli(capsys, "stop", "-p", p, "--json")
    assert code == 0, doc
    assert all(standin_servers(port) == [] for port in _ports(data).values())


def _foreign_standin(tmp_path: Path, host: str, port: int, bootstrap: int) -> subprocess.Popen[bytes]:
    """An SGLang-compatible prefill started by hand (no pid file names it), answering /health."""
    model = tmp_path / "models" / "Llama-3.1-70B-Instruct"
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN), "-m", "sglang.launch_server", "--model-path", str(model),
         "--host", host, "--port", str(port), "--disaggregation-mode", "prefill",
         "--disaggregation-bootstrap-port", str(bootstrap)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://{host}:{port}/health", timeout=1, trust_env=False).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the foreign stand-in did not start"
        time.sleep(0.2)


def test_launch_refuses_a_foreign_server_on_its_port_and_stop_finds_it(
    pd_cluster: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A server no pid file names answers on the prefill's port (an orphan of an earlier run): launch
    must not call it ready, nor start a second server over it; `stop`, finding the pid file stale,
    stops what listens there and says so. A non-SGLang process on the decode's port is named and left."""
    prof, data = pd_cluster
    p = str(prof)
    pf = next(n for n in data["nodes"] if n["name"] == "pf-01")
    dc = next(n for n in data["nodes"] if n["name"] == "dc-01")
    orphan = _foreign_standin(tmp_path, pf["host"], pf["overrides"]["prefill_port"],
                              pf["overrides"]["bootstrap_port"])  # fmt: skip
    other = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(dc["overrides"]["decode_port"]), "--bind", dc["host"]],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip

    def other_listens() -> bool:  # a fixed 0.5 s was not always enough for python -m http.server to bind
        assert other.poll() is None, "http.server exited"
        try:
            return httpx.get(f"http://{dc['host']}:{dc['overrides']['decode_port']}/", timeout=1,
                             trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_for(other_listens, 30)
        code, doc, err = run_cli(capsys, "launch", "-p", p, "--json")
        assert code == 2, (doc, err)
        fails = {f["subject"]: f["message"] for f in doc["findings"] if f["check"] == "launch.port_in_use"}
        assert set(fails) == {"pf-01-prefill", "dc-01-decode"}, doc["findings"]
        assert f"pid {orphan.pid} (" in fails["pf-01-prefill"] and "sglang.launch_server" in fails["pf-01-prefill"]
        assert "`inferctl stop` stops it" in fails["pf-01-prefill"]
        assert f"pid {other.pid} (" in fails["dc-01-decode"] and "http.server" in fails["dc-01-decode"]
        rows = {r["instance"]: r for r in doc["results"]}
        assert {r["state"] for r in rows.values()} == {"refused"}
        assert not any(f["check"] == "launch.ready" and f["status"] == "ok" for f in doc["findings"])
        assert standin_servers(pf["overrides"]["prefill_port"]) == [orphan.pid]  # nothing started over it
        assert _pid_file(prof, "pf-01-prefill") is None

        code, doc, _ = run_cli(capsys, "stop", "-p", p, "--json")
        assert code == 1, doc  # warnings: what it found
        rows = {r["instance"]: r for r in doc["results"]}
        assert rows["pf-01-prefill"]["result"] == "stopped"
        assert rows["pf-01-prefill"]["stray"].startswith(f"pid file stale: stopped {pf['host']}:")
        assert f"pid {orphan.pid} (" in rows["pf-01-prefill"]["stray"]
        assert orphan.wait(10) == 0  # SIGTERM: it shut down cleanly
        assert "not an SGLang server: left running" in rows["dc-01-decode"]["foreign"]
        assert other.poll() is None
        checks = {(f["check"], f["subject"]) for f in doc["findings"] if f["status"] == "warn"}
        assert checks == {("stop.stray", "pf-01-prefill"), ("stop.port_in_use", "dc-01-decode")}
    finally:
        for proc in (orphan, other):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        run_cli(capsys, "stop", "-p", p, "--json")


def test_stop_with_a_stale_pid_file_stops_the_server_still_on_the_port(
    pd_cluster: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's sequence: the pid file names a dead process while the real server runs on."""
    prof, data = pd_cluster
    p = str(prof)
    try:
        code, doc, err = run_cli(capsys, "launch", "-p", p, "--json", "--nodes", "dc-01")
        assert code == 0, (doc, err)
        port = _ports(data)["dc-01-decode"]
        (server,) = standin_servers(port)
        dead = subprocess.Popen(["true"])
        dead.wait()
        pid_file = Path(pid_file_path(find_instance(load_profile(p), "dc-01-decode")))
        pid_file.write_text(f"{dead.pid}\n")

        code, doc, _ = run_cli(capsys, "status", "-p", p, "--json", "--nodes", "dc-01")
        assert code == 2 and doc["results"][0]["process"] == "dead"

        code, doc, _ = run_cli(capsys, "stop", "-p", p, "--json", "--nodes", "dc-01")
        assert code == 1, doc
        (row,) = doc["results"]
        assert row["result"] == "stopped" and f"pid {server} (" in row["stray"], row
        assert [f["check"] for f in doc["findings"]] == ["stop.stray"]
        deadline = time.monotonic() + 5
        while standin_servers(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert standin_servers(port) == []
    finally:
        run_cli(capsys, "stop", "-p", p, "--json")


def test_launch_reads_the_roce_gid_index_and_refuses_a_node_without_one(
    pd_cluster: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mooncake uses GID index 3 unless told: pf-01's RoCE v2 IPv4 GID is at 1 (Intel E810 layout), so
    its env file must say MC_GID_INDEX=1; dc-01's HCA has RoCE v1 GIDs only, so its decode must not
    start. The node's sysfs is a tree in the kernel's formats (INFERCTL_SYSFS_ROOT, as `check fabric`)."""
    from tests.fabric.sysfs_tree import Hca, Netdev, build

    prof, data = pd_cluster
    p = str(prof)
    e810 = [(0, "fe80::3efd:feff:fe9d:1a2b", "IB/RoCE v1"), (1, "::ffff:10.0.0.11", "RoCE v2")]
    build(tmp_path / "sysfs" / "pf-01", [Hca(gids=e810)], [Netdev()])
    build(tmp_path / "sysfs" / "dc-01", [Hca(gids=[(0, "::ffff:10.0.0.21", "IB/RoCE v1")])], [Netdev()])
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(tmp_path / "sysfs" / "{node}"))
    for node in data["nodes"]:
        node["rdma"] = {"devices": ["mlx5_0"]}
    write_yaml(prof, data)
    try:
        code, doc, err = run_cli(capsys, "launch", "-p", p, "--json")
        assert code == 2, (doc, err)
        rows = {r["instance"]: r for r in doc["results"]}
        assert (rows["pf-01-prefill"]["action"], rows["pf-01-prefill"]["state"]) == ("started", "ready")
        env = (tmp_path / "pf-01" / "etc" / "sglang-prefill.env").read_text()
        assert "MC_GID_INDEX=1\n" in env
        assert rows["dc-01-decode"]["state"] == "refused"
        (fail,) = [f for f in doc["findings"] if f["status"] == "fail"]
        assert (fail["check"], fail["subject"]) == ("launch.gid_index", "dc-01-decode")
        assert "MC_GID_INDEX cannot be determined: mlx5_0/1 has no RoCE v2 ipv4 GID" in fail["message"]
        assert not (tmp_path / "dc-01" / "etc" / "sglang-decode.env").exists()
        assert standin_servers(_ports(data)["dc-01-decode"]) == []

        # pinned in the profile: used as is, no probe
        data["nodes"][1]["rdma"]["gid_index"] = 0
        write_yaml(prof, data)
        code, doc, err = run_cli(capsys, "launch", "-p", p, "--json", "--nodes", "dc-01")
        assert code == 0, (doc, err)
        assert "MC_GID_INDEX=0\n" in (tmp_path / "dc-01" / "etc" / "sglang-decode.env").read_text()
    finally:
        run_cli(capsys, "stop", "-p", p, "--json")
