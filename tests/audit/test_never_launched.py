"""A cluster whose servers were never launched: `inferctl status`, `check servers` and
`audit --only servers` agree (FAIL, exit 2: the profile declares servers that are not serving), the audit
JSON holds every finding, and `audit --since-last` words an unchanged failing run as such.

What is real: the CLI, the local connector running the commands on this machine, the process supervisor's
state files (none: never launched) and the HTTP probes. The nodes are loopback addresses on this host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from infer_ctl.cli.main import main
from tests.ports import free_port


@pytest.fixture
def never_launched(tmp_path: Path) -> Path:
    nodes = []
    for name, host, role in (("pf-01", "127.0.0.1", "prefill"), ("dc-01", "127.0.0.1", "decode"),
                             ("dc-02", "127.0.0.1", "decode")):
        port = {"prefill_port": free_port(host), "bootstrap_port": free_port(host)} if role == "prefill" \
            else {"decode_port": free_port(host)}
        nodes.append({"name": name, "host": host, "connection": "local",
                      "roles": [role], "gpus": 0, "overrides": port})
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "name": "fresh", "nodes": nodes, "models": {"target": {"path": "/m"}},
        "sglang": {"transfer_backend": "mooncake_tcp", "log_dir": str(tmp_path / "{node}" / "log"),
                   "extra_args": {"prefill": ["--device", "cpu"], "decode": ["--device", "cpu"]},
                   "lifecycle": {"supervisor": "process", "config_dir": str(tmp_path / "{node}" / "etc")}},
        "router": {"listen": f"127.0.0.1:{free_port()}"},
    }))  # fmt: skip
    return path


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    rc = main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _failing(doc: dict) -> set[str]:
    return {f["subject"] for f in doc["findings"] if f["status"] == "fail"}


def test_status_check_servers_and_audit_agree(never_launched: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = ["-p", str(never_launched)]
    servers = {"pf-01-prefill", "dc-01-decode", "dc-02-decode"}
    status_rc, status = _json(["status", *p], capsys)
    check_rc, check = _json(["check", "servers", *p], capsys)
    audit_rc, audit = _json(["audit", "--only", "servers", *p], capsys)
    assert (status_rc, check_rc, audit_rc) == (2, 2, 2)
    assert status["status"] == check["status"] == audit["status"] == "fail"
    assert _failing(status) == _failing(check) == _failing(audit) == servers
    # the audit's JSON holds every finding of the family, as `check servers` gives them
    assert sorted((f["check"], f["subject"], f["status"]) for f in audit["findings"]) == sorted(
        (f["check"], f["subject"], f["status"]) for f in check["findings"]
    )
    deployed = [f for f in check["findings"] if f["check"] == "servers.deployed"]
    assert {f["subject"] for f in deployed} == servers
    for f in deployed:  # why it fails, and what to do
        assert "never launched" in f["message"] and "not serving" in f["message"]
        assert "inferctl launch --nodes" in f["remedy"]


def test_since_last_says_nothing_changed_not_no_findings(
    never_launched: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hist = tmp_path / "audit.jsonl"
    args = ["audit", "--only", "servers", "-p", str(never_launched), "--history", str(hist)]
    assert main(args) == 2
    capsys.readouterr()
    assert main([*args, "--since-last"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "no findings" not in out
    assert "overall: FAIL (no changes since" in out and "this run: 3 fail" in out
