"""The audit engine without hosts: family registry, crash isolation, history, since-last diff, textfile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.checks import audit as A
from infer_ctl.checks.registry import FAMILY_MODULES, AuditContext, CheckFamily, families
from infer_ctl.core.findings import Finding, Status
from infer_ctl.errors import UsageError
from infer_ctl.profile import load_profile


def test_every_registered_module_exposes_a_family() -> None:
    names = [f.name for f in families()]
    assert "gpu" in names and len(names) == len(FAMILY_MODULES) == len(set(names))


def test_only_unknown_family_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="nosuch") as exc:
        families({"gpu", "nosuch"})
    assert "gpu" in (exc.value.remedy or "")
    assert [f.name for f in families({"gpu"})] == ["gpu"]


def test_a_crashing_family_becomes_one_unknown_and_the_others_still_run() -> None:
    prof = load_profile("builtin:local")

    def boom(ctx: AuditContext) -> list[Finding]:
        raise RuntimeError("kaput")

    good = CheckFamily("good", "ok", lambda ctx: [Finding.ok("good.x", ctx.nodes[0].name, "node", "fine")])
    result = A.run_families(prof, None, list(prof.nodes), [CheckFamily("bad", "x", boom), good], {})
    assert [(f.check, f.status) for f in result.findings] == [("bad.internal", Status.UNKNOWN), ("good.x", Status.OK)]
    assert "kaput" in result.findings[0].message and result.status is Status.UNKNOWN
    assert set(result.family_durations) == {"bad", "good"}


def _result(findings: list[Finding], nodes=("a", "b"), fams=("gpu",)) -> A.AuditResult:  # type: ignore[no-untyped-def]
    return A.AuditResult(findings=findings, families=list(fams), nodes=list(nodes))


def test_history_roundtrip_skips_torn_lines_and_other_profiles(tmp_path: Path) -> None:
    hist = tmp_path / "h" / "audit.jsonl"
    r1 = A.history_record(_result([Finding.fail("gpu.xid", "a", "GPU0", "XID 79")]), "prod")
    A.append_history(hist, r1)
    A.append_history(hist, A.history_record(_result([]), "other"))
    with hist.open("a") as fh:
        fh.write('{"ts": "torn')
    assert A.read_last_run(hist, "prod") == json.loads(json.dumps(r1))
    assert A.read_last_run(hist, "other")["findings"] == []  # type: ignore[index]
    assert A.read_last_run(tmp_path / "missing.jsonl") is None


def test_diff_new_worse_better_recovered_and_unchanged() -> None:
    prev = A.history_record(
        _result([
            Finding.warn("gpu.temperature", "a", "GPU0", "hot"),
            Finding.fail("gpu.row_remap", "a", "GPU1", "pending"),
            Finding.fail("gpu.xid", "b", "GPU2", "XID 79"),
            Finding.ok("gpu.count", "a", "node", "8 GPUs"),
            Finding.warn("gpu.pcie", "a", "GPU5", "x8"),
        ]), "p")
    now = _result([
        Finding.fail("gpu.temperature", "a", "GPU0", "at slowdown"),  # worse
        Finding.ok("gpu.row_remap", "a", "GPU1", "no pending"),  # recovered
        Finding.warn("gpu.xid", "b", "GPU2", "XID 13"),  # better
        Finding.fail("gpu.count", "a", "node", "7 GPUs"),  # new problem on a known key
        Finding.warn("gpu.pcie", "a", "GPU5", "x8"),  # unchanged: not reported
        Finding.unknown("gpu.facts", "b", "node", "unreachable"),  # new
    ])
    changes, report = A.diff_runs(prev, now)
    kinds = {(c.check, c.node): c.kind for c in changes}
    assert kinds == {
        ("gpu.temperature", "a"): "worse",
        ("gpu.row_remap", "a"): "recovered",
        ("gpu.xid", "b"): "better",
        ("gpu.count", "a"): "worse",
        ("gpu.facts", "b"): "new",
    }
    assert len(report) == 5 and all(f.check != "gpu.pcie" for f in report)


def test_problem_that_disappears_is_recovered_only_if_its_node_and_family_were_checked() -> None:
    prev = A.history_record(_result([Finding.fail("gpu.xid", "b", "GPU2", "XID 79"),
                                     Finding.fail("fabric.pfc", "a", "mlx5_0", "off")], fams=("gpu", "fabric")), "p")
    changes, report = A.diff_runs(prev, _result([], nodes=("a", "b"), fams=("gpu",)))
    assert [(c.check, c.kind) for c in changes] == [("gpu.xid", "recovered")]
    assert report[0].status is Status.OK and "was fail: XID 79" in report[0].message
    changes, _ = A.diff_runs(prev, _result([], nodes=("a",), fams=("gpu", "fabric")))
    assert [(c.check, c.kind) for c in changes] == [("fabric.pfc", "recovered")]


def test_first_run_reports_every_problem_as_new() -> None:
    changes, report = A.diff_runs(None, _result([Finding.ok("gpu.count", "a", "node", "8"),
                                                 Finding.warn("gpu.pcie", "a", "GPU0", "x8")]))
    assert [c.kind for c in changes] == ["new"] and [f.check for f in report] == ["gpu.pcie"]


def test_textfile_content_and_atomic_write(tmp_path: Path) -> None:
    res = _result([Finding.fail("gpu.xid", "a", "GPU0", "XID 79"), Finding.ok("gpu.count", "b", "node", "8")])
    res.family_durations = {"gpu": 1.5}
    path = A.write_audit_textfile(tmp_path / "inferctl.prom", res, run_timestamp=1700000000.0)
    text = path.read_text()
    for line in (
        'inferctl_check_status{check="gpu.xid",code="IC-GPU-018",node="a",subject="GPU0"} 2',
        'inferctl_check_ok{check="gpu.count",code="IC-GPU-003",node="b",subject="node"} 1',
        'inferctl_findings{status="fail"} 1',
        "inferctl_last_run_timestamp_seconds 1700000000",
        "inferctl_audit_status 2",
        'inferctl_audit_family_duration_seconds{family="gpu"} 1.5',
        'inferctl_node_status{node="a"} 2',
        'inferctl_node_status{node="b"} 0',
    ):
        assert line in text.splitlines(), line
    assert [p.name for p in tmp_path.iterdir()] == ["inferctl.prom"]
    # node_exporter's format, checked by the Prometheus client's own parser
    parsed = {fam.name: fam for fam in text_string_to_metric_families(text)}
    assert parsed["inferctl_check_status"].samples[0].value == 2


def test_a_controller_side_problem_that_disappears_is_recovered() -> None:
    """Pseudo-nodes outside the fleet ("local" of the tokenizer family) are compared by family."""
    before = A.history_record(_result([Finding.fail("tokenizer.vocab", "local", "models", "draft != target")],
                                      fams=("gpu", "tokenizer")), "p")
    changes, report = A.diff_runs(before, _result([], fams=("gpu", "tokenizer")))
    assert [(c.kind, c.node) for c in changes] == [("recovered", "local")]
    assert report[0].status == Status.OK
    changes, _ = A.diff_runs(before, _result([], fams=("gpu",)))  # tokenizer not run this time
    assert changes == []


@pytest.mark.parametrize("flag", ["--textfile", "--history"])
def test_unwritable_outputs_are_usage_errors_before_anything_runs(tmp_path: Path, flag: str) -> None:
    attr = flag.lstrip("-")
    ran: list[str] = []
    fam = CheckFamily("x", "x", run=lambda ctx: ran.append("x") or [], needs_nodes=False)
    profile = load_profile("builtin:local")
    for bad in (tmp_path, Path("/proc/no-such-dir/out")):
        with pytest.raises(UsageError) as info:
            A.audit(profile, list(profile.nodes), [fam], A.AuditOptions(**{attr: bad}))
        assert flag in info.value.message and info.value.remedy
    assert ran == []


@pytest.mark.parametrize(("argv", "expected"), [([], False), (["--pingpong"], True)])
def test_audit_pingpong_flag_reaches_the_families(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                  argv: list[str], expected: bool) -> None:
    # the fabric family runs its pair tests when ctx.options["pingpong"] is true (checks/fabric.py);
    # a recording family stands in for it so no RDMA tool or node is needed
    from infer_ctl.checks import registry
    from infer_ctl.cli.main import main

    seen: list[dict] = []

    def record(ctx: AuditContext) -> list[Finding]:
        seen.append(dict(ctx.options))
        return [Finding.ok("fabric.recorded", "controller", "options", "recorded")]

    monkeypatch.setattr(registry, "all_families", lambda modules=None: [CheckFamily("fabric", "x", record, needs_nodes=False)])
    assert main(["audit", "-p", "builtin:local", "--json", *argv]) == 0
    assert json.loads(capsys.readouterr().out)["findings"][0]["check"] == "fabric.recorded"
    assert [o.get("pingpong") for o in seen] == [expected]


def test_since_last_compares_runs_of_the_same_kind_with_or_without_pair_tests(tmp_path: Path) -> None:
    # an hourly --pingpong run between two plain runs must not make its pair-test findings "recovered"
    hist = tmp_path / "audit.jsonl"
    plain = A.history_record(_result([Finding.warn("gpu.temp", "a", "GPU0", "hot")]), "prod")
    paired = A.history_record(_result([Finding.fail("fabric.pingpong", "a", "a->b", "no answer")], fams=("fabric",)),
                              "prod", pingpong=True)
    A.append_history(hist, plain)
    A.append_history(hist, paired)
    assert A.read_last_run(hist, "prod", pingpong=False) == json.loads(json.dumps(plain))
    assert A.read_last_run(hist, "prod", pingpong=True) == json.loads(json.dumps(paired))
    assert A.read_last_run(hist, "prod") == json.loads(json.dumps(paired))  # no filter: the newest
    # lines written before the flag existed were runs without pair tests
    legacy = tmp_path / "legacy.jsonl"
    A.append_history(legacy, {k: v for k, v in plain.items() if k != "pingpong"})
    assert A.read_last_run(legacy, "prod", pingpong=False) is not None
    assert A.read_last_run(legacy, "prod", pingpong=True) is None


def test_only_imports_just_the_named_families() -> None:
    # `audit --only gpu` must not pay for the tokenizer/servers families' imports (~0.4 s)
    import subprocess
    import sys

    probe = ("import sys; from infer_ctl.checks.registry import families; "
             "print([f.name for f in families({'gpu'})], sorted(m for m in sys.modules if m.startswith('infer_ctl.checks.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == "['gpu'] ['infer_ctl.checks.family_names', 'infer_ctl.checks.gpu', 'infer_ctl.checks.registry']", out


# ---- facts not gathered are "not checked", never "recovered" ---------------------------------------
def _unreachable(node: str) -> Finding:
    return Finding.unknown("gpu.facts", node, "node", "GPU facts not gathered: connection refused",
                           details={"not_gathered": ["gpu.*"]})


def _run_after(previous: dict | None, now: A.AuditResult) -> tuple[list, list, dict]:  # type: ignore[type-arg]
    changes, report = A.diff_runs(previous, now)
    record = A.history_record(now, "p", not_checked=A.carry_unchecked(previous, now))
    return changes, report, json.loads(json.dumps(record))


def test_problems_of_a_node_that_became_unreachable_are_not_checked_never_recovered() -> None:
    prev = A.history_record(_result([
        Finding.fail("gpu.row_remap", "b", "GPU3", "row remap pending"),
        Finding.fail("gpu.xid", "b", "GPU1", "XID 79"),
        Finding.ok("gpu.count", "b", "node", "8 GPUs"),
        Finding.fail("gpu.xid", "a", "GPU0", "XID 48"),
    ]), "p")
    changes, report, rec = _run_after(prev, _result([_unreachable("b"), Finding.ok("gpu.xid", "a", "node", "none")]))
    kinds = {(c.check, c.node, c.subject): c.kind for c in changes}
    assert kinds == {("gpu.row_remap", "b", "GPU3"): "not_checked", ("gpu.xid", "b", "GPU1"): "not_checked",
                     ("gpu.facts", "b", "node"): "new", ("gpu.xid", "a", "GPU0"): "recovered"}
    unchecked = {(f.check, f.subject): f for f in report if f.details.get("not_checked")}
    assert set(unchecked) == {("gpu.row_remap", "GPU3"), ("gpu.xid", "GPU1")}
    assert all(f.status is Status.UNKNOWN for f in unchecked.values())
    assert "last known fail: row remap pending" in unchecked[("gpu.row_remap", "GPU3")].message
    # the history carries the last known state, without reporting it again while the node stays away
    assert sorted(rec["not_checked"]) == [["gpu.row_remap", "b", "GPU3", "fail", "row remap pending"],
                                         ["gpu.xid", "b", "GPU1", "fail", "XID 79"]]
    changes, report, rec2 = _run_after(rec, _result([_unreachable("b")]))
    assert changes == [] and report == [] and rec2["not_checked"] == rec["not_checked"]
    # the node is back: what is fixed recovers, what is not stays (no change to report)
    changes, report, rec3 = _run_after(rec2, _result([Finding.fail("gpu.row_remap", "b", "GPU3", "row remap pending"),
                                                      Finding.ok("gpu.xid", "b", "node", "no XIDs")]))
    assert sorted((c.check, c.kind) for c in changes) == [("gpu.facts", "recovered"), ("gpu.xid", "recovered")]
    assert rec3["not_checked"] == []
    (xid,) = [f for f in report if f.check == "gpu.xid"]
    assert xid.status is Status.OK and "was fail: XID 79" in xid.message


def test_an_unknown_fact_leaves_that_checks_earlier_problems_not_checked() -> None:
    prev = A.history_record(_result([Finding.fail("gpu.xid", "a", "GPU3", "XID 79"),
                                     Finding.fail("gpu.row_remap", "a", "GPU1", "pending")]), "p")
    now = _result([Finding.unknown("gpu.xid", "a", "node", "kernel log not readable: permission denied"),
                   Finding.ok("gpu.row_remap", "a", "GPU1", "no pending")])
    changes, _ = A.diff_runs(prev, now)
    assert {(c.check, c.kind) for c in changes} == {("gpu.xid", "not_checked"), ("gpu.row_remap", "recovered"),
                                                   ("gpu.xid", "new")}
    # a finding that turns UNKNOWN on the same key is not checked either, not "better"
    changes, _report = A.diff_runs(prev, _result([Finding.unknown("gpu.xid", "a", "GPU3", "kernel log not readable")]))
    assert [(c.check, c.subject, c.kind) for c in changes if c.subject == "GPU3"] == [("gpu.xid", "GPU3", "not_checked")]


def test_gpu_facts_not_read_cover_every_gpu_rule_but_the_kernel_log() -> None:
    prev = A.history_record(_result([Finding.fail("gpu.row_remap", "a", "GPU1", "pending"),
                                     Finding.fail("gpu.xid", "a", "GPU1", "XID 79")]), "p")
    now = _result([Finding.unknown("gpu.driver", "a", "node", "nvidia-smi did not answer",
                                   details={"not_gathered": ["gpu.*", "!gpu.xid", "!gpu.sxid", "!gpu.driver"]}),
                   Finding.ok("gpu.xid", "a", "node", "no XIDs since boot")])
    kinds = {c.check: c.kind for c in A.diff_runs(prev, now)[0]}
    assert kinds == {"gpu.row_remap": "not_checked", "gpu.xid": "recovered", "gpu.driver": "new"}


def test_a_family_that_did_not_run_leaves_all_its_problems_not_checked() -> None:
    prev = A.history_record(_result([Finding.fail("gpu.xid", "a", "GPU3", "XID 79")]), "p")
    now = _result([Finding.unknown("gpu.internal", "controller", "gpu", "gpu checks crashed: boom")])
    assert [(c.check, c.kind) for c in A.diff_runs(prev, now)[0]] == [("gpu.internal", "new"), ("gpu.xid", "not_checked")]


def test_memory_of_unreached_nodes_is_kept() -> None:
    prev = A.history_record(_result([Finding.ok("gpu.pcie_replay", "a", "GPU0", "x", details={"memory": {"replays": 5}}),
                                     Finding.ok("gpu.pcie_replay", "b", "GPU0", "x", details={"memory": {"replays": 7}})]), "p")
    now = _result([Finding.ok("gpu.pcie_replay", "a", "GPU0", "x", details={"memory": {"replays": 9}}), _unreachable("b")])
    mem = A.remembered(now.findings, json.loads(json.dumps(prev)))
    assert mem == {"gpu.pcie_replay": {"a": {"GPU0": {"replays": 9}}, "b": {"GPU0": {"replays": 7}}}}


def test_a_pair_test_whose_client_could_not_take_part_is_not_checked() -> None:
    """Pair findings are keyed on the server; the client dc-02 died: its pairs are not checked, not recovered."""
    pair = "pf-01/mlx5_0 <-> dc-02/mlx5_0"
    prev = A.history_record(_result([Finding.fail("fabric.pingpong", "pf-01", pair, "retry exceeded"),
                                     Finding.fail("fabric.pingpong", "pf-01", "pf-01/mlx5_0 <-> dc-01/mlx5_0", "slow")],
                                    nodes=("pf-01", "dc-01", "dc-02"), fams=("fabric",)), "p")
    untested = [[c, p] for c in ("fabric.pingpong",) for p in ("dc-02/*", "* <-> dc-02/*")]
    now = _result([Finding.fail("fabric.pingpong", "dc-02", "dc-02", "dc-02 cannot take part in pair tests: not reachable",
                                details={"not_gathered_subjects": untested})],
                  nodes=("pf-01", "dc-01", "dc-02"), fams=("fabric",))
    kinds = {(c.subject, c.kind) for c in A.diff_runs(prev, now)[0]}
    assert (pair, "not_checked") in kinds and ("pf-01/mlx5_0 <-> dc-01/mlx5_0", "recovered") in kinds
