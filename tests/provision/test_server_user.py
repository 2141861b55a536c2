"""The `user` step creates the system user the units run as (real useradd, writing the node's private
/etc), once; `root` opts out. The `logrotate` step installs the rotation of the process supervisor's
log files for the node's log_dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infer_ctl.remote.base import Command
from tests.provision.test_provision_e2e import entries, on_node, run_cli

pytestmark = pytest.mark.ssh


def _user_entries(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in entries(doc) if e["step"] == "user"]


def test_user_step_creates_the_units_user_once_and_root_opts_out(prov_cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    pc = prov_cluster(1)
    node = pc.cluster.names[0]
    profile = pc.profile()
    code, doc = run_cli(capsys, "provision", "--only", "user", "-p", str(profile))
    assert code == 1
    [entry] = _user_entries(doc)
    assert (entry["subject"], entry["kind"]) == ("inferctl-sglang", "change")
    assert not pc.node_path(node, "/var/lib/inferctl-sglang").exists()  # the plan changed nothing

    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "--only", "user,units", "-p", str(profile))
    assert code == 0, doc
    passwd = on_node(profile, Command("getent", "passwd", "inferctl-sglang"))
    name, _, uid, _, _, home, shell = passwd.out.strip().split(":")
    assert (name, home) == ("inferctl-sglang", "/var/lib/inferctl-sglang") and shell.endswith(("nologin", "false"))
    assert int(uid) < 1000  # a system user
    assert pc.node_path(node, "/var/lib/inferctl-sglang").is_dir()
    unit = pc.node_path(node, "/etc/systemd/system/inferctl-sglang-decode.service").read_text()
    assert "User=inferctl-sglang" in unit.splitlines()
    code, doc = run_cli(capsys, "provision", "--only", "user", "-p", str(profile))
    assert code == 0 and _user_entries(doc)[0]["summary"].startswith(f"exists (uid {uid}")

    root = pc.profile(pc.tmp / "root.yaml", sglang={"lifecycle": {"user": "root"}})
    code, doc = run_cli(capsys, "provision", "--only", "user", "-p", str(root))
    assert code == 0 and _user_entries(doc)[0]["kind"] == "skip"


def test_logrotate_step_rotates_the_node_log_dir_in_place(prov_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pc = prov_cluster(1)
    node = pc.cluster.names[0]
    profile = pc.profile(sglang={"log_dir": "/var/log/inferctl/{node}"})
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "--only", "logrotate", "-p", str(profile))
    assert code == 0, doc
    text = pc.node_path(node, "/etc/logrotate.d/inferctl-sglang").read_text()
    assert f"/var/log/inferctl/{node}/sglang-*.log {{" in text
    for directive in ("copytruncate", "rotate 7", "maxsize 512M", "missingok"):
        assert f"    {directive}\n" in text
    code, _ = run_cli(capsys, "provision", "--only", "logrotate", "-p", str(profile))
    assert code == 0
