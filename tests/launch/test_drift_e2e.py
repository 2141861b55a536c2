"""`check servers` compares every setting of a running server with the profile, and what is deployed
on its node with what runs, over real sshd nodes.

Real: OpenSSH servers on loopback, the SSH connector, /proc/PID/cmdline and environ read on the node,
HTTP /server_info. Stand-in: `<venv>/0.5.23/bin/python` is tests/launch/standin_sglang.py, which reports
what it was launched with as SGLang 0.5.23's /server_info does (every resolved field, `launch_command`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infer_ctl.launch import orchestrate
from infer_ctl.launch.render import instances
from infer_ctl.profile.load import load_profile
from infer_ctl.remote.fleet import Fleet
from tests.launch.standin_cluster import pd_profile, run_cli, write_yaml

pytest.importorskip("infer_ctl.sim.server", reason="the simulator (infer_ctl.sim) is not available")
pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _findings(capsys: pytest.CaptureFixture[str], prof: Path) -> tuple[int, list[dict[str, Any]]]:
    code, doc, _ = run_cli(capsys, "check", "servers", "-p", str(prof), "--json")
    return code, doc["findings"]


def _not_ok(findings: list[dict[str, Any]], check: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(f["subject"], f["details"].get("setting", "")): f for f in findings
            if f["check"] == check and f["status"] != "ok"}  # fmt: skip


def _write_without_restart(prof: Path) -> None:
    """What a `provision --apply` without `--restart` does: the node's files follow the profile, the
    servers keep running (launch's own prepare step: it writes and starts nothing)."""
    profile = load_profile(str(prof))
    with Fleet(profile) as fleet:
        for o in fleet.map(profile.nodes, lambda c, n: orchestrate.prepare_node(
                c, profile, [i for i in instances(profile) if i.node == n.name])):  # fmt: skip
            assert o.value is not None and all(p.up for p in o.value), o.error


def test_every_flag_env_var_and_deployed_file_is_compared(
    ssh_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = ssh_cluster(2, names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    prof, data = pd_profile(cluster, tmp_path)
    for node in data["nodes"]:
        node["rdma"] = {"devices": ["mlx5_0"], "gid_index": 3}
    write_yaml(prof, data)
    try:
        code, doc, err = run_cli(capsys, "launch", "-p", str(prof), "--json")
        assert code == 0, (doc["findings"], err)
        code, found = _findings(capsys, prof)
        assert code == 0, [f for f in found if f["status"] != "ok"]
        oks = {(f["check"], f["subject"]): f["message"] for f in found}
        assert oks[("servers.files", "pf-01-prefill")] == "deployed files match the profile"
        assert oks[("servers.restart_pending", "dc-01-decode")].endswith("runs what is deployed")
        assert "compared, from /server_info launch_command" in oks[("servers.drift", "pf-01-prefill")]

        # the profile changes what the old 16 /server_info keys never covered: the HCA list, the GID
        # index (an env var), an extra flag
        data["nodes"][0]["rdma"] = {"devices": ["mlx5_0", "mlx5_1"], "gid_index": 5}
        data["sglang"]["extra_args"] = {"decode": ["--chunked-prefill-size", "4096"]}
        write_yaml(prof, data)
        code, found = _findings(capsys, prof)
        assert code == 2
        drift = _not_ok(found, "servers.drift")
        assert set(drift) == {("pf-01-prefill", "disaggregation_ib_device"), ("pf-01-prefill", "env MC_GID_INDEX"),
                              ("dc-01-decode", "chunked_prefill_size")}  # fmt: skip
        assert drift[("pf-01-prefill", "disaggregation_ib_device")]["message"] == (
            "disaggregation_ib_device is mlx5_0 but the profile says mlx5_0,mlx5_1")
        assert drift[("dc-01-decode", "chunked_prefill_size")]["message"] == (
            "chunked_prefill_size is not set on the running server but the profile says 4096")
        files = {f["subject"]: f["message"] for f in found if f["check"] == "servers.files" and f["status"] == "warn"}
        assert set(files) == {"pf-01-prefill", "dc-01-decode"}  # launch would rewrite both
        assert not _not_ok(found, "servers.restart_pending")  # the node's files are still what runs

        # the files follow the profile, the servers do not restart: a restart is pending
        _write_without_restart(prof)
        code, found = _findings(capsys, prof)
        assert not _not_ok(found, "servers.files")
        pending = {f["subject"]: f for f in found if f["check"] == "servers.restart_pending" and f["status"] == "warn"}
        assert set(pending) == {"pf-01-prefill", "dc-01-decode"}
        reasons = " | ".join(pending["pf-01-prefill"]["details"]["differences"])
        assert "gives --disaggregation-ib-device mlx5_0,mlx5_1, the server runs with mlx5_0" in reasons
        assert "sglang-prefill.env sets MC_GID_INDEX=5, the server runs with MC_GID_INDEX=3" in reasons
        assert "inferctl launch --rolling" in pending["dc-01-decode"]["remedy"]

        # a rolling launch restarts them: everything matches again
        code, doc, _ = run_cli(capsys, "launch", "-p", str(prof), "--json", "--rolling")
        assert code == 0, doc["findings"]
        code, found = _findings(capsys, prof)
        assert code == 0, [f for f in found if f["status"] != "ok"]
    finally:
        run_cli(capsys, "stop", "-p", str(prof), "--json")
