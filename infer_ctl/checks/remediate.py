"""`audit --remediate`: carry out core/remediation.py's plan.

Per node to drain: its workers (the router's registrations at the node's host and server ports) are
drained through the router's admin API (POST /admin/workers/drain: no new requests, the ones in flight
finish), the audit waits up to `remediation.drain_wait_s` for them to go idle, then the site's
`drain_hook` runs on the controller (argv from the profile, no shell). Returning a node undrains its
workers and runs `return_hook`. A router that cannot be reached fails the drain (reported, retried by the
next audit), and the hook does not run: a scheduler told "drained" while the router still routes to the
node would be worse than neither. A run with pair tests (`--pingpong`) also gives the router each prefill x
decode pair's verdict (POST /admin/pairs): a failed pair is avoided until a later run's test passes. Every step becomes a finding (`remediation.*`), a count in the history
line's `remediation.counters` and a Prometheus counter in the audit's textfile.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from infer_ctl.core import remediation as rem
from infer_ctl.core.findings import Finding
from infer_ctl.errors import InferctlError
from infer_ctl.launch.router_hook import router_url
from infer_ctl.profile import Node, Profile
from infer_ctl.router.control.client import AdminClient

_REMEDY_ROUTER = ("start the router (`inferctl router serve`), or set remediation.router_url; export the admin "
                  "token if it has one; the next audit retries")


@dataclass
class Outcome:
    findings: list[Finding] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    #: this run's actions: action -> node -> count
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, action: str, node: str) -> None:
        self.counts.setdefault(action, {})[node] = self.counts.get(action, {}).get(node, 0) + 1


class RouterWorkers:
    """The router's view of a node: which registered workers serve from it, and drain/undrain them."""

    def __init__(self, client: AdminClient, profile: Profile) -> None:
        self.client = client
        self.profile = profile

    def of_node(self, node: Node) -> list[dict[str, Any]]:
        doc = self.client.call("GET", "/admin/workers")
        ports = set(self.profile.server_ports(node).values())
        out = []
        for w in doc.get("workers", []):
            parts = urlsplit(str(w.get("url", "")))
            host = (parts.hostname or "").lower()
            if host == node.host.strip("[]").lower() and (parts.port in ports or not ports):
                out.append(w)
        return out

    def drain(self, urls: Sequence[str], wait_s: float) -> tuple[int, int]:
        """Drain every worker (POST /admin/workers/drain: the router stops routing to it and waits up to
        `wait_s` for its in-flight requests). All are marked first (timeout 0), so they finish in
        parallel, then each is waited for. Returns (in flight when marked, still in flight at the end)."""
        at_drain = sum(int(self.client.call("POST", "/admin/workers/drain", {"url": u, "timeout_s": 0})
                           .get("inflight", 0) or 0) for u in urls)
        deadline = time.monotonic() + wait_s
        left = 0
        for url in urls:
            budget = max(0.0, deadline - time.monotonic())
            doc = self.client.call("POST", "/admin/workers/drain", {"url": url, "timeout_s": round(budget, 3)})
            left += int(doc.get("inflight", 0) or 0)
        return at_drain, left

    def undrain(self, urls: Sequence[str]) -> None:
        for url in urls:
            self.client.call("POST", "/admin/workers/drain", {"url": url, "drain": False})


def run_hook(template: Sequence[str] | None, *, node: Node, reason: str, timeout_s: float) -> tuple[bool, str] | None:
    """(ok, what it said) of the site hook; None when none is configured."""
    if not template:
        return None
    argv = rem.hook_argv(template, node=node.name, host=node.host, reason=reason)
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return False, f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return False, f"{argv[0]} did not finish within {timeout_s:g}s"
    except OSError as exc:
        return False, f"{argv[0]}: {exc.strerror or exc}"
    said = (res.stdout + res.stderr).strip().splitlines()
    tail = said[-1] if said else ""
    return res.returncode == 0, (f"exit {res.returncode}" + (f": {tail}" if tail else ""))


def remediate(profile: Profile, findings: Sequence[Finding], previous: Mapping[str, Any] | None, *, now: str,
              client: AdminClient | None = None) -> Outcome:
    """Plan from this run's findings and the previous state, then drain, hold and return nodes."""
    policy = profile.remediation
    fleet = [rem.NodeRoles(n.name, frozenset(r.value for r in n.roles)) for n in profile.nodes]
    steps = rem.plan(previous, findings, fleet, policy)
    # a drain call waits on the router for in-flight requests: the HTTP timeout must outlast that wait
    client = client or AdminClient(policy.router_url or router_url(profile), profile.router.admin_token_env,
                                   timeout=policy.drain_wait_s + 10.0)
    router = RouterWorkers(client, profile)
    out = Outcome()
    drained_ok: dict[str, dict[str, Any]] = {}
    returned_ok: list[str] = []
    for d in steps.drain:
        node = profile.node(d.node)
        reason = rem.reason_text(d.reasons)
        try:
            workers = router.of_node(node)
            urls = [str(w["url"]) for w in workers]
            at_drain, left = router.drain(urls, policy.drain_wait_s)
        except InferctlError as exc:
            out.count("drain_failed", d.node)
            out.findings.append(Finding.fail(
                "remediation.drain", d.node, "node", f"should be drained ({reason}) but the router was not told: "
                f"{exc.message}", details={"reasons": _rows(d.reasons)}, remedy=_REMEDY_ROUTER))
            continue
        hook = run_hook(policy.drain_hook, node=node, reason=f"inferctl: {reason}", timeout_s=policy.hook_timeout_s)
        drained_ok[d.node] = {"workers": urls, "state": "draining" if left else "drained",
                              "hook": None if hook is None else {"ok": hook[0], "said": hook[1]}}
        out.count("drain", d.node)
        what = (f"{len(urls)} worker(s) drained from the router" if urls else "no worker of it is registered with "
                "the router")
        if left:
            what += f", {left} request(s) still finishing after {policy.drain_wait_s:g}s"
        out.findings.append(Finding.warn(
            "remediation.drain", d.node, "node", f"taken out of service: {what} ({reason})",
            details={"workers": urls, "inflight_at_drain": at_drain, "inflight_left": left, "reasons": _rows(d.reasons),
                     "hook": drained_ok[d.node]["hook"]},
            remedy=f"fix what the findings say, then let {policy.recovery_audits} clean audits return it "
                   "(or return it by hand: inferctl router workers undrain URL)"))
        _hook_finding(out, hook, d.node, "drain_hook")
    for h in steps.hold:
        out.count("held", h.node)
        out.findings.append(Finding.warn(
            "remediation.held", h.node, "node", f"should be drained ({rem.reason_text(h.reasons)}) but stays in "
            f"service: {h.why}", details={"reasons": _rows(h.reasons), "why": h.why},
            remedy="return or repair the nodes already out of service, or raise remediation.max_drained; "
                   "drain this one by hand if it must go now"))
    drained = rem.drained_of(previous)
    for k in steps.keep:
        urls = list(drained.get(k.node, {}).get("workers") or [])
        try:
            reasserted = _reassert(router, profile.node(k.node), urls) if k.node in {n.name for n in profile.nodes} else 0
        except InferctlError as exc:
            reasserted = 0
            out.findings.append(Finding.unknown(
                "remediation.router", k.node, "node", f"drained node: the router's drain could not be re-asserted: "
                f"{exc.message}", remedy=_REMEDY_ROUTER))
        if reasserted:
            out.count("reasserted", k.node)
        if k.reasons:
            msg = f"out of service, still failing: {rem.reason_text(k.reasons)}"
        elif not k.checked:
            msg = f"out of service; not checked this run ({k.clean_audits}/{k.needed} clean audits so far)"
        else:
            msg = f"out of service; clean audit {k.clean_audits}/{k.needed}"
        if reasserted:
            msg += f" (the router had put {reasserted} worker(s) back: drained again)"
        out.findings.append(Finding.warn("remediation.recovery", k.node, "node", msg,
                                         details={"clean_audits": k.clean_audits, "needed": k.needed,
                                                  "checked": k.checked, "since": drained.get(k.node, {}).get("since")},
                                         remedy="it returns by itself after the recovery window; undrain it by hand "
                                                "(inferctl router workers undrain URL) to return it now"))
    for r in steps.ret:
        node = profile.node(r.node)
        try:
            urls = [str(w["url"]) for w in router.of_node(node)]
            router.undrain(urls)
        except InferctlError as exc:
            out.count("return_failed", r.node)
            out.findings.append(Finding.unknown(
                "remediation.returned", r.node, "node", f"{r.clean_audits} clean audits, but the router could not "
                f"be told to route to it again: {exc.message}", remedy=_REMEDY_ROUTER))
            continue
        hook = run_hook(policy.return_hook, node=node, reason="inferctl: recovered", timeout_s=policy.hook_timeout_s)
        returned_ok.append(r.node)
        out.count("return", r.node)
        out.findings.append(Finding.ok(
            "remediation.returned", r.node, "node", f"returned to service after {r.clean_audits} clean audits: "
            f"{len(urls)} worker(s) undrained", details={"workers": urls, "hook": None if hook is None else
                                                         {"ok": hook[0], "said": hook[1]}}))
        _hook_finding(out, hook, r.node, "return_hook")
    _push_pairs(profile, router, findings, out)
    out.state = rem.next_state(previous, steps, now=now, drained_ok=drained_ok, returned_ok=returned_ok,
                               counts=out.counts)
    return out


def _push_pairs(profile: Profile, router: RouterWorkers, findings: Sequence[Finding], out: Outcome) -> None:
    """The run's pair-test verdicts to the router (POST /admin/pairs), so it avoids a prefill x decode pair
    whose test failed and takes it back when one passes (router/fleet/pair_health.py)."""
    verdicts = rem.pair_verdicts(findings)
    if not verdicts:
        return
    names = {n.name for n in profile.nodes}
    try:
        urls: dict[str, dict[str, list[str]]] = {}
        for node in {n for pair in verdicts for n in pair if n in names}:
            for w in router.of_node(profile.node(node)):
                urls.setdefault(node, {}).setdefault(str(w.get("role")), []).append(str(w["url"]))
        for (server, client), (status, why) in sorted(verdicts.items()):
            for pre in urls.get(server, {}).get("prefill", []):
                for dec in urls.get(client, {}).get("decode", []):
                    router.client.call("POST", "/admin/pairs", {"prefill": pre, "decode": dec, "status": status,
                                                                "reason": why})
                    out.count(f"pair_{status}", f"{server}>{client}")
    except InferctlError as exc:
        out.findings.append(Finding.unknown(
            "remediation.router", "controller", "pairs", f"pair-test verdicts not given to the router: {exc.message}",
            remedy=_REMEDY_ROUTER))


def _reassert(router: RouterWorkers, node: Node, recorded: Sequence[str]) -> int:
    """Drain again whatever of the node the router routes to (a restarted router forgot the drain)."""
    live = [w for w in router.of_node(node) if not w.get("draining")]
    urls = [str(w["url"]) for w in live]
    if urls:
        router.drain(urls, 0)
    return len(urls)


def _hook_finding(out: Outcome, hook: tuple[bool, str] | None, node: str, which: str) -> None:
    if hook is None or hook[0]:
        return
    out.count("hook_failed", node)
    out.findings.append(Finding.fail(
        "remediation.hook", node, which, f"remediation.{which} failed: {hook[1]}",
        remedy=f"run the hook by hand for {node} and fix it; the router side of the step is done"))


def _rows(reasons: Sequence[Finding]) -> list[list[str]]:
    return [[f.check, f.subject, f.status.value, f.message] for f in reasons]

