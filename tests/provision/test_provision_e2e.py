"""End to end over real sshd nodes with private /etc, /opt, /var (see conftest.py): plan, apply,
idempotency, drift, venv switch and rollback, wheelhouse verification, sudo and reachability errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.provision.lock import MARKER_NAME
from infer_ctl.profile.load import load_profile
from infer_ctl.remote.base import Command, CommandResult
from infer_ctl.remote.fleet import Fleet
from tests.provision.wheels import make_wheelhouse

pytestmark = pytest.mark.ssh

MANAGED = {"persistence", "memlock", "sysctl", "qos", "wheelhouse", "venv", "inferctl", "units"}


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main([*args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def on_node(profile: Path, command: Command, stdin: bytes | None = None) -> CommandResult:
    """Run a command on the (single) node of the profile over SSH: inside its mount namespace, unlike
    edits of the overlay's upper directory from the outside, which the mounted overlay may not see."""
    prof = load_profile(str(profile))
    with Fleet(prof) as fleet:
        [outcome] = fleet.map(prof.nodes, lambda conn, node: conn.run(command, stdin=stdin, timeout=60))
    assert outcome.value is not None, outcome.error
    return outcome.value


def entries(doc: dict[str, Any], node: str | None = None) -> list[dict[str, Any]]:
    return [e for r in doc["results"] if node in (None, r["node"]) for e in r["entries"]]


def kinds(doc: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for e in entries(doc):
        out.setdefault(e["step"], set()).add(e["kind"])
    return out


def wheelhouse(tmp: Path, index: Path, version: str) -> Path:
    out = tmp / f"wh-{version}"
    code = main(["provision", "wheelhouse", "build", "--out", str(out), "--requirement", f"sglang=={version}",
                 "--pip-arg=--no-index", f"--pip-arg=--find-links={index}", "--json"])
    assert code == 0
    return out


def test_fresh_plan_apply_replan_drift_and_rollback(prov_cluster, wheel_index, tmp_path, capsys) -> None:
    pc = prov_cluster(1)
    node = pc.cluster.names[0]
    wh = wheelhouse(tmp_path, wheel_index("0.5.23"), "0.5.23")
    profile = pc.profile(sglang={"wheelhouse": str(wh)})
    before = pc.checksum(node)

    # a fresh node: every managed step wants a CHANGE; the plan itself changes nothing
    code, doc = run_cli(capsys, "provision", "--plan", "-p", str(profile))
    assert code == 1, doc
    assert doc["status"] == "warn" and doc["results"][0]["state"] == "pending"
    by_step = kinds(doc)
    for step in MANAGED:
        assert "change" in by_step[step], (step, by_step[step])
    assert by_step["driver"] == {"ok"} and by_step["timesync"] == {"ok"}
    unit_entry = next(e for e in entries(doc) if e["subject"].endswith("inferctl-sglang-decode.service"))
    assert unit_entry["diff"].startswith("--- /dev/null") and "+LimitMEMLOCK=infinity" in unit_entry["diff"]
    assert pc.checksum(node) == before, "--plan must not change anything on the node"

    # apply, then the node is in the desired state and a second plan is all OK
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "-p", str(profile))
    assert code == 0, json.dumps(doc["results"], indent=1)[:3000]
    assert doc["results"][0]["state"] == "applied"
    code, doc = run_cli(capsys, "provision", "-p", str(profile))
    assert code == 0
    assert {e["kind"] for e in entries(doc)} <= {"ok", "skip"}
    settled = pc.checksum(node)
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "-p", str(profile))
    assert code == 0 and doc["results"][0]["applied"] == []
    assert pc.checksum(node) == settled, "a second apply must change nothing"

    # what apply really did on the node
    venvs = pc.node_path(node, "/opt/inferctl/venvs")
    current = (venvs / "current").readlink()
    assert current.name.startswith("sglang-0.5.23-") and (venvs / "0.5.23").readlink() == current
    assert (pc.node_path(node, str(current)) / MARKER_NAME).is_file()
    assert "vm.max_map_count = 16777216" in pc.node_path(node, "/etc/sysctl.d/90-inferctl.conf").read_text()
    env = pc.node_path(node, "/etc/inferctl/sglang-prefill.env")
    assert oct(env.stat().st_mode & 0o777) == "0o600"  # the mode launch writes it with (launch/deploy.py)
    assert any(c.startswith("sysctl -p /etc/sysctl.d/90-inferctl.conf") for c in pc.calls(node))
    assert any(c.startswith("mlnx_qos -i eth-standin0 --trust dscp --pfc 0,0,0,1,0,0,0,0") for c in pc.calls(node))

    # drift: someone edits a unit on the node; the plan shows the diff, apply restores it with a backup
    unit = pc.node_path(node, "/etc/systemd/system/inferctl-sglang-decode.service")
    unit.write_text(unit.read_text().replace("LimitMEMLOCK=infinity", "LimitMEMLOCK=64M"))
    code, doc = run_cli(capsys, "provision", "-p", str(profile))
    assert code == 1
    drift = [e for e in entries(doc) if e["kind"] == "change"]
    assert [e["subject"] for e in drift] == ["/etc/systemd/system/inferctl-sglang-decode.service"]
    assert "-LimitMEMLOCK=64M" in drift[0]["diff"] and "+LimitMEMLOCK=infinity" in drift[0]["diff"]
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "-p", str(profile))
    assert code == 0
    backups = list(unit.parent.glob("inferctl-sglang-decode.service.inferctl-backup-*"))
    assert len(backups) == 1 and "LimitMEMLOCK=64M" in backups[0].read_text()

    # upgrade to a new SGLang: a new versioned venv, `current` switched, the old one kept for rollback
    wh2 = make_wheelhouse(tmp_path / "wh2", "0.5.24")
    profile2 = pc.profile(tmp_path / "p2.yaml", sglang={"version": "0.5.24", "wheelhouse": str(wh2)})
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "-p", str(profile2), "--only", "wheelhouse,venv")
    assert code == 0, doc
    assert (venvs / "current").readlink().name.startswith("sglang-0.5.24-")
    assert (venvs / "previous").readlink() == current
    # a rebuild of 0.5.23 with another lock would have moved the `0.5.23` link the units use: simulate
    # that, and check that the rollback points it back as well
    newer = (venvs / "current").readlink()
    assert on_node(profile2, Command("ln", "-sfn", str(newer), "/opt/inferctl/venvs/0.5.23")).ok
    code, doc = run_cli(capsys, "provision", "rollback", "-p", str(profile2))
    assert code == 0 and doc["results"][0]["to"] == str(current)
    assert (venvs / "current").readlink() == current
    assert (venvs / "0.5.23").readlink() == current and (venvs / "0.5.24").readlink() == newer
    assert (venvs / "previous").readlink().name.startswith("sglang-0.5.24-")


def test_corrupted_wheel_is_refused_and_nothing_uploaded(prov_cluster, tmp_path, capsys) -> None:
    pc = prov_cluster(1)
    node = pc.cluster.names[0]
    wh = make_wheelhouse(tmp_path / "wh", "0.5.23")
    wheel = next(wh.glob("tinydep-*.whl"))
    wheel.write_bytes(wheel.read_bytes()[:-10] + b"corrupted!")
    profile = pc.profile()
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "-p", str(profile), "--wheelhouse", str(wh))
    assert code == 2
    errors = [e for e in entries(doc) if e["kind"] == "error"]
    assert errors and "tinydep-1.0-py3-none-any.whl" in errors[0]["summary"]
    assert "nothing was uploaded" in errors[0]["summary"]
    assert doc["results"][0]["error"].startswith("not applied")
    assert not pc.node_path(node, "/opt/inferctl").exists()


def test_node_without_sudo_is_a_clear_error(prov_cluster, capsys) -> None:
    pc = prov_cluster(1)
    node = pc.cluster.names[0]
    from tests.provision.standins import SUDO_NEEDS_PASSWORD

    pc.cluster.pose_as_unprivileged(node)  # a root login would need no sudo
    pc.cluster.add_executable(node, "sudo", SUDO_NEEDS_PASSWORD)
    profile = pc.profile(ssh={"sudo": True}, sglang={"version": "0.5.23"})
    code, doc = run_cli(capsys, "provision", "-p", str(profile), "--skip", "venv")
    assert code == 2
    by_step = {e["step"]: e for e in entries(doc)}
    assert by_step["sysctl"]["kind"] == "error" and "sudo needs a password" in by_step["sysctl"]["summary"]
    assert "passwordless sudo" in by_step["sysctl"]["remedy"]
    # steps that need no root still report
    assert by_step["driver"]["kind"] == "ok" and by_step["timesync"]["kind"] == "ok"


def test_unreachable_node_exit_3_and_others_still_planned(prov_cluster, capsys) -> None:
    pc = prov_cluster(2)
    down, up = pc.cluster.names
    pc.cluster.stop(down)
    profile = pc.profile()
    code, doc = run_cli(capsys, "provision", "-p", str(profile), "--only", "sysctl,memlock")
    assert code == 3
    states = {r["node"]: r for r in doc["results"]}
    assert states[down]["state"] == "unreachable" and states[down]["error"]
    assert states[up]["state"] == "pending"


def test_fail_fast_and_rolling_skip_the_rest_of_the_fleet(prov_cluster, capsys) -> None:
    """--rolling 1 --fail-fast: the first node's apply fails (its systemctl is broken), so the other node
    is not touched and is reported as skipped, not as unreachable or applied."""
    pc = prov_cluster(2)
    first, second = pc.cluster.names
    pc.cluster.add_executable(first, "systemctl", 'echo "standin systemctl: broken" >&2; exit 1\n')
    profile = pc.profile()
    before = pc.checksum(second)
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "-p", str(profile), "--only", "units",
                        "--rolling", "1", "--fail-fast")
    assert code == 2
    states = {r["node"]: r for r in doc["results"]}
    assert states[first]["state"] == "error" and "daemon-reload" in states[first]["error"]
    assert states[second]["state"] == "skipped" and "--fail-fast" in states[second]["error"]
    assert pc.checksum(second) == before

    # without --fail-fast the healthy node is applied anyway
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "-p", str(profile), "--only", "units", "--rolling", "1")
    assert code == 2
    assert {r["node"]: r["state"] for r in doc["results"]} == {first: "error", second: "applied"}


def test_interrupted_apply_leaves_files_old_or_new(prov_cluster, tmp_path, capsys) -> None:
    """Kill inferctl in the middle of an apply (while systemctl daemon-reload runs, after the first
    env/unit files were written): every managed file is either absent (old) or complete (new); a rerun
    finishes the job."""
    pc = prov_cluster(1)
    node = pc.cluster.names[0]
    profile = pc.profile()
    state = pc.node_dir(node) / "state"
    (state / "hang-daemon-reload").touch()
    args = ["provision", "--apply", "--yes", "-p", str(profile), "--skip", "wheelhouse,venv,inferctl,persistence", "--json"]
    proc = subprocess.Popen([sys.executable, "-m", "infer_ctl", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        deadline = time.monotonic() + 30
        while not (state / "hanging").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert (state / "hanging").exists(), "the apply never reached daemon-reload"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        (state / "hang-daemon-reload").unlink()
        if proc.poll() is None:
            proc.kill()
    managed = ["/etc/security/limits.d/90-inferctl.conf", "/etc/sysctl.d/90-inferctl.conf",
               "/etc/inferctl/sglang-prefill.env", "/etc/systemd/system/inferctl-sglang-prefill.service",
               "/etc/inferctl/sglang-decode.env", "/etc/systemd/system/inferctl-sglang-decode.service"]
    midway = {p: pc.node_path(node, p).read_bytes() if pc.node_path(node, p).exists() else None for p in managed}
    assert midway["/etc/systemd/system/inferctl-sglang-prefill.service"] is not None  # it was interrupted late
    assert midway["/etc/systemd/system/inferctl-sglang-decode.service"] is None  # ... but not at the end

    code, doc = run_cli(capsys, *args[:-1])
    assert code == 0, doc
    for path, content in midway.items():
        final = pc.node_path(node, path).read_bytes()
        assert content in (None, final), f"{path} was left partial by the interrupted apply"
    leftovers = [p for p in pc.upper(node).rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []
