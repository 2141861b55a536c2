"""The provision QoS step over every real `mlnx_qos -i` output in tests/fixtures/rdma/mlnx_qos/: plan,
apply, plan again; the second plan must show no change (the step converges on every NIC shape).

The step runs for real over the local connector; only `mlnx_qos` is a stand-in (no ConnectX here). It
prints its fixture with the settings applied so far and, like mlnx_qos on a NIC without a trust mode,
refuses `--trust` (exit 1) when the fixture shows no trust state, so a plan that tried fails its apply."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from infer_ctl.core.provision.model import EntryKind, PlanEntry
from infer_ctl.facts.qos import parse_mlnx_qos
from infer_ctl.profile import Profile
from infer_ctl.provision.context import Planned, ProvisionOptions, StepContext
from infer_ctl.provision.steps.qos import QosStep
from infer_ctl.remote.commandline import SudoMode
from infer_ctl.remote.local import LocalConnector

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "rdma" / "mlnx_qos"
FIXTURES = sorted(p for p in CORPUS.glob("*.txt"))
NETDEV = "ens1f0np0"

# $1.. = mlnx_qos's arguments. State: trust/pfc files next to the fixture copy.
STANDIN = r"""#!/bin/sh
S=STATE
trust_arg= ; pfc_arg=
while [ $# -gt 0 ]; do case "$1" in
  -i) shift ;;
  --trust) trust_arg=$2; shift ;;
  --pfc) pfc_arg=$2; shift ;;
esac; shift; done
# mlnx_qos applies --pfc first, then --trust: on a NIC without a trust mode it prints the message below
# and exits 1 (python/mlnx_qos in Mellanox/mlnx-tools)
[ -n "$pfc_arg" ] && echo "$pfc_arg" > "$S/pfc"
if [ -n "$trust_arg" ]; then
  grep -Eq '^Priority trust (state|mode): (dscp|pcp)' "$S/fixture.txt" || {
    echo "Priority trust state is not supported on your system"; exit 1; }
  echo "$trust_arg" > "$S/trust"
fi
out=$(cat "$S/fixture.txt")
if [ -f "$S/trust" ]; then
  out=$(printf '%s\n' "$out" | sed -E "s/^(Priority trust (state|mode): )(dscp|pcp)/\1$(cat "$S/trust")/")
fi
if [ -f "$S/pfc" ]; then
  row=$(tr ',' ' ' < "$S/pfc" | sed 's/ /   /g')
  out=$(printf '%s\n' "$out" | sed -E "s/^([[:space:]]*enabled[[:space:]]+)([01][[:space:]]+)+[01]/\1$row/")
fi
printf '%s\n' "$out"
"""


def _profile(trust: str, priority: int) -> Profile:
    return Profile.model_validate({
        "name": "qos-corpus",
        "nodes": [{"name": "n1", "host": "127.0.0.1", "connection": "local", "roles": ["prefill", "decode"],
                   "rdma": {"devices": ["mlx5_0"], "netdev": NETDEV}}],
        # ECN is read from sysfs, not from mlnx_qos: out of this corpus
        "fabric": {"apply_qos": True, "trust": trust, "pfc_priority": priority, "ecn": False},
    })


def _plan(profile: Profile) -> list[Planned]:
    conn = LocalConnector("n1", sudo_mode=SudoMode(enabled=False))
    ctx = StepContext(conn, profile, profile.node("n1"), ProvisionOptions(), privileged=True)
    return QosStep().plan(ctx)


def _kinds(planned: list[Planned]) -> list[tuple[str, EntryKind]]:
    return [(p.entry.subject, p.entry.kind) for p in planned]


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    tool = bin_dir / "mlnx_qos"
    tool.write_text(STANDIN.replace("S=STATE", f"S={shlex.quote(str(state))}"))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    return state


def test_the_corpus_is_there() -> None:
    assert len(FIXTURES) >= 6 and any("trust-unsupported" in p.name for p in FIXTURES)


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name)
@pytest.mark.parametrize(("trust", "priority"), [("dscp", 3), ("pcp", 5)])
def test_plan_apply_plan_converges(fixture: Path, trust: str, priority: int, standin: Path) -> None:
    (standin / "fixture.txt").write_text(fixture.read_text())
    profile = _profile(trust, priority)
    first = _plan(profile)
    for p in first:
        if p.action is not None:
            p.action()  # what --apply runs; raises (StepFailed) if mlnx_qos refuses it
    second = _plan(profile)
    assert [e for e, k in _kinds(second) if k is EntryKind.CHANGE] == [], _kinds(second)
    assert all(p.action is None for p in second)
    assert {e for e, _ in _kinds(first)} == {e for e, _ in _kinds(second)}
    facts = parse_mlnx_qos(fixture.read_text())
    main: PlanEntry = next(p.entry for p in second if p.entry.subject == NETDEV)
    assert main.kind is EntryKind.OK
    assert f"PFC {','.join('1' if i == priority else '0' for i in range(8))}" in main.summary
    if facts.trust is None:
        skipped = next(p.entry for p in second if p.entry.subject == f"{NETDEV} trust")
        assert skipped.kind is EntryKind.SKIP and "trust not supported on this NIC" in skipped.summary
        assert skipped.details["supported"] is False
        assert all("--trust" not in c for p in first for c in p.entry.commands)
    else:
        assert f"trust {trust}" in main.summary


def test_trust_unsupported_reads_none_in_both_paths(standin: Path) -> None:
    """The real capture of a NIC without a trust mode: `check fabric` and `provision` read the same
    None through the same parser, and provisioning plans no --trust (it used to read "none" and plan
    `mlnx_qos --trust dscp` on every run)."""
    [fixture] = [p for p in FIXTURES if "trust-unsupported" in p.name]
    text = fixture.read_text()
    assert "Priority trust state: none" in text
    assert parse_mlnx_qos(text).trust is None
    (standin / "fixture.txt").write_text(text)
    first = _plan(_profile("dscp", 3))
    assert _kinds(first) == [(NETDEV, EntryKind.CHANGE), (f"{NETDEV} trust", EntryKind.SKIP)]
    assert first[0].entry.commands == (f"mlnx_qos -i {NETDEV} --pfc 0,0,0,1,0,0,0,0",)
    assert first[0].entry.summary == "set PFC"
