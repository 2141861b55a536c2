"""`check gpu` on a node that has no interpreter for the gatherer, over a REAL sshd node.

What is real: the OpenSSH server on loopback, the SSH connector and fleet, the node's shell answering
"command not found" (exit 127). The profile's `gpu.python` names an interpreter the node does not have,
which is exactly what a minimal image without python3 looks like to inferctl.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infer_ctl.cli.main import main

pytestmark = pytest.mark.ssh


def test_node_without_the_gatherers_python_is_one_unknown_with_a_remedy(
    ssh_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # type: ignore[no-untyped-def]
) -> None:
    cluster = ssh_cluster(2, names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    profile = cluster.write_profile(tmp_path / "p.yaml", gpu={"expected_count": 8, "python": "python3-absent"})
    rc = main(["check", "gpu", "-p", str(profile), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 3 and doc["status"] == "unknown", doc
    facts = [f for f in doc["findings"] if f["check"] == "gpu.facts"]
    assert sorted(f["node"] for f in facts) == ["dc-01", "pf-01"]  # one finding per node, both nodes reported
    for f in facts:
        assert f["status"] == "unknown"
        assert "python3-absent not found on the node" in f["message"]
        assert "python3" in (f["remedy"] or "")
