"""core/remediation.py: which findings drain, the role limits, the recovery window, the state it leaves,
and the hook's argv (no router, no node: the plan is pure)."""

from __future__ import annotations

from infer_ctl.core import remediation as rem
from infer_ctl.core.findings import Finding
from infer_ctl.core.gpu.xids import RMA
from infer_ctl.profile.remediation import RemediationSettings

POLICY = RemediationSettings(enabled=True, recovery_audits=2)
FLEET = [rem.NodeRoles("pf-01", frozenset({"prefill"})), rem.NodeRoles("pf-02", frozenset({"prefill"})),
         rem.NodeRoles("dc-01", frozenset({"decode"})), rem.NodeRoles("dc-02", frozenset({"decode"})),
         rem.NodeRoles("dc-03", frozenset({"decode"}))]


def xid79(node: str) -> Finding:
    # the remedy core/gpu/xids.py gives XID 79 (its wording is what "says drain" reads)
    return Finding.fail("gpu.xid", node, "GPU2", "XID 79 in the last 24 h: GPU has fallen off the bus",
                        remedy=f"the GPU fell off the bus: drain the node and reboot it; if it recurs, reseat or {RMA}")


def ok(node: str) -> Finding:
    return Finding.ok("gpu.count", node, "node", "8 GPUs")


def clean(*nodes: str) -> list[Finding]:
    return [ok(n) for n in nodes]


ALL = [n.name for n in FLEET]


def test_which_findings_say_drain() -> None:
    p = POLICY
    assert rem.says_drain(xid79("dc-01"), p)
    # the same remedy on a WARN does not drain; nor does a FAIL whose remedy does not ask for it
    assert not rem.says_drain(Finding.warn("gpu.xid", "dc-01", "GPU2", "XID 13", remedy="drain the node"), p)
    assert not rem.says_drain(Finding.fail("gpu.temperature", "dc-01", "GPU0", "hot", remedy="check airflow"), p)
    # "drain the GPU" drains the node (a TP server cannot lose one GPU); "drain peer-to-peer traffic" does not
    assert rem.says_drain(Finding.fail("gpu.row_remap", "dc-01", "GPU3", "remap pending",
                                       remedy="drain the GPU, then `nvidia-smi -r -i 3`"), p)
    assert not rem.says_drain(Finding.fail("gpu.recovery_action", "dc-01", "GPU3", "drain_p2p",
                                           remedy="drain peer-to-peer traffic from this GPU"), p)
    # only checks of remediation.checks; always_drain needs no wording; details.action does too
    assert not rem.says_drain(Finding.fail("fabric.port_state", "dc-01", "mlx5_0", "down", remedy="drain the node"), p)
    wider = RemediationSettings(checks=["gpu.*", "fabric.*"], always_drain=["fabric.port_state"])
    assert rem.says_drain(Finding.fail("fabric.port_state", "dc-01", "mlx5_0", "down", remedy="reseat"), wider)
    assert rem.says_drain(Finding.fail("gpu.diag", "dc-01", "GPU0", "x", details={"action": "drain"}), p)


def test_drain_then_recovery_window_then_return() -> None:
    s0: dict = {}
    p1 = rem.plan(s0, [xid79("dc-01"), *clean("pf-01", "pf-02", "dc-02", "dc-03")], FLEET, POLICY)
    assert [d.node for d in p1.drain] == ["dc-01"] and not p1.hold and not p1.keep and not p1.ret
    s1 = rem.next_state(s0, p1, now="t1", drained_ok={"dc-01": {"workers": ["http://h:30001"]}}, returned_ok=[],
                        counts={"drain": {"dc-01": 1}})
    assert s1["drained"]["dc-01"]["clean_audits"] == 0 and s1["drained"]["dc-01"]["since"] == "t1"
    assert s1["drained"]["dc-01"]["reasons"][0][0] == "gpu.xid" and s1["counters"] == {"drain": {"dc-01": 1}}
    # still failing: not drained twice, the window stays at 0
    p2 = rem.plan(s1, [xid79("dc-01"), *clean("pf-01")], FLEET, POLICY)
    assert not p2.drain and [(k.node, k.clean_audits) for k in p2.keep] == [("dc-01", 0)]
    s2 = rem.next_state(s1, p2, now="t2", drained_ok={}, returned_ok=[], counts={})
    # one clean audit, then an audit that could not check it (neither counts nor resets), then the second
    p3 = rem.plan(s2, clean(*ALL), FLEET, POLICY)
    assert [(k.node, k.clean_audits, k.checked) for k in p3.keep] == [("dc-01", 1, True)]
    s3 = rem.next_state(s2, p3, now="t3", drained_ok={}, returned_ok=[], counts={})
    gone = Finding.unknown("gpu.facts", "dc-01", "node", "GPU facts not gathered: unreachable",
                           details={"not_gathered": ["gpu.*"]})
    p4 = rem.plan(s3, [gone, *clean("pf-01")], FLEET, POLICY)
    assert [(k.node, k.clean_audits, k.checked) for k in p4.keep] == [("dc-01", 1, False)]
    s4 = rem.next_state(s3, p4, now="t4", drained_ok={}, returned_ok=[], counts={})
    p5 = rem.plan(s4, clean(*ALL), FLEET, POLICY)
    assert [(r.node, r.clean_audits) for r in p5.ret] == [("dc-01", 2)] and not p5.keep
    s5 = rem.next_state(s4, p5, now="t5", drained_ok={}, returned_ok=["dc-01"], counts={"return": {"dc-01": 1}})
    assert s5["drained"] == {} and s5["counters"] == {"drain": {"dc-01": 1}, "return": {"dc-01": 1}}
    # a return the router refused leaves it drained, window kept, to be retried
    s5b = rem.next_state(s4, p5, now="t5", drained_ok={}, returned_ok=[], counts={})
    assert s5b["drained"]["dc-01"]["clean_audits"] == 2


def test_a_failing_audit_inside_the_window_resets_it() -> None:
    s = {"drained": {"dc-01": {"since": "t0", "roles": ["decode"], "clean_audits": 1}}}
    p = rem.plan(s, [xid79("dc-01")], FLEET, POLICY)
    assert [(k.node, k.clean_audits) for k in p.keep] == [("dc-01", 0)]
    assert rem.next_state(s, p, now="t", drained_ok={}, returned_ok=[], counts={})["drained"]["dc-01"]["clean_audits"] == 0


def test_max_drained_per_role_and_never_the_last_of_a_role() -> None:
    # two decodes fail at once: max_drained 1 drains the first, holds the second
    p = rem.plan({}, [xid79("dc-01"), xid79("dc-02")], FLEET, POLICY)
    assert [d.node for d in p.drain] == ["dc-01"]
    assert [(h.node, "max_drained is 1" in h.why) for h in p.hold] == [("dc-02", True)]
    # with room for two, the second goes too, but never the third (the last decode in service)
    roomy = RemediationSettings(enabled=True, max_drained=5)
    p = rem.plan({}, [xid79("dc-01"), xid79("dc-02"), xid79("dc-03")], FLEET, roomy)
    assert [d.node for d in p.drain] == ["dc-01", "dc-02"]
    assert [(h.node, h.why) for h in p.hold] == [("dc-03", "it is the last decode node in service")]
    # a node already out of service counts against the limit, including one this run did not audit
    s = {"drained": {"pf-01": {"roles": ["prefill"], "clean_audits": 0}}}
    p = rem.plan(s, [xid79("pf-02")], FLEET, roomy)
    assert not p.drain and p.hold[0].why == "it is the last prefill node in service"
    # a node returning this run frees its slot first
    s = {"drained": {"dc-01": {"roles": ["decode"], "clean_audits": 1}}}
    p = rem.plan(s, [ok("dc-01"), xid79("dc-02")], FLEET, POLICY)
    assert [r.node for r in p.ret] == ["dc-01"] and [d.node for d in p.drain] == ["dc-02"]
    # a node with both roles counts for both
    both = [rem.NodeRoles("a", frozenset({"prefill", "decode"})), rem.NodeRoles("b", frozenset({"prefill", "decode"}))]
    p = rem.plan({}, [xid79("a"), xid79("b")], both, roomy)
    assert [d.node for d in p.drain] == ["a"] and "last decode" in p.hold[0].why


def test_counters_accumulate_across_runs() -> None:
    s = {"counters": {"drain": {"dc-01": 2}, "held": {"dc-02": 1}}}
    out = rem.next_state(s, rem.Plan(), now="t", drained_ok={}, returned_ok=[], counts={"drain": {"dc-01": 1, "dc-03": 1}})
    assert out["counters"] == {"drain": {"dc-01": 3, "dc-03": 1}, "held": {"dc-02": 1}}


def test_hook_argv_is_never_a_shell_line() -> None:
    reason = 'gpu.xid GPU2: XID 79 "fell off"; rm -rf / $(id)'
    argv = rem.hook_argv(["scontrol", "update", "NodeName={node}", "State=DRAIN", "Reason=inferctl: {reason}"],
                         node="dc-01", host="10.0.0.3", reason=reason)
    assert argv == ["scontrol", "update", "NodeName=dc-01", "State=DRAIN", f"Reason=inferctl: {reason}"]
    # no {node} element: the node is its own last argument
    assert rem.hook_argv(["/usr/local/sbin/drain-node"], node="dc-01", host="h", reason="r") == ["/usr/local/sbin/drain-node", "dc-01"]


def test_reason_text_is_bounded() -> None:
    text = rem.reason_text([xid79("dc-01")] * 5, limit=80)
    assert len(text) == 80 and text.endswith("...") and text.startswith("gpu.xid GPU2: XID 79")
