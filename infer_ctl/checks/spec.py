"""`check spec` (the audit's `spec` family, alias `speculative`): is speculative decoding paying on each
decode, judged from the measured acceptance with the speedup formula (core/spec/judge.py).

Where the acceptance comes from, in this order:
1. the router (`GET /admin/spec`): the rolling window of the last N finished requests per decode,
   measured from SGLang's per-request fields (router/observe/spec_stats.py) - the most precise source, with
   alpha estimated from the accepted-drafts histogram;
2. else each decode's own `/metrics` (`sglang:spec_accept_rate`, `sglang:spec_num_draft_tokens`) and
   `/server_info` (`internal_states[].speculative_num_steps`, the live step count): SGLang recomputes the
   gauges every `--decode-log-interval` (40) decode batches from that interval only, so they lag and are
   noisier; alpha is the value whose expected accepted drafts per step equals accept_rate x (drafts
   per step) (`spec_fields.alpha_from_mean_correct`).

Findings (`spec.acceptance`, one per decode): OK above the pool's alert threshold; WARN below it, naming
the recommended gamma; FAIL below the break-even alpha of the running step count (speculation is slower
than none); FAIL near alpha 0 with the advice to run `check tokenizer` for the pair and its last result
from the audit history (`--history`). `spec.source` says when nothing could be read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from infer_ctl.checks.history import records_newest_first
from infer_ctl.checks.registry import AuditContext, CheckFamily
from infer_ctl.core.findings import Finding
from infer_ctl.core.routing.spec_fields import (
    alpha_from_mean_correct,
    decode_metrics_text,
    decode_server_info,
)
from infer_ctl.core.sglang import Instance, instances
from infer_ctl.core.spec.judge import acceptance_finding, assess
from infer_ctl.core.spec.pools import Pool, base_limits, pool_of
from infer_ctl.errors import InferctlError
from infer_ctl.launch import probe
from infer_ctl.launch.router_hook import router_url
from infer_ctl.profile import Profile
from infer_ctl.router.control.client import AdminClient
from infer_ctl.router.observe.temperature import HIGH as HIGH_BAND

SOURCE_CHECK = "spec.source"
TEMPERATURE_CHECK = "spec.temperature"
#: a lookahead this long (draft steps per verify) is the seed's "long gamma" ...
LONG_GAMMA = 6
#: ... and more than this share of a pool's requests above temperature 1.2 is "high-temperature traffic":
#: a quarter of the traffic is where the wasted drafts become a visible share of the pool's decode compute
HOT_SHARE = 0.25


@dataclass(frozen=True)
class DecodeAcceptance:
    """One decode's measured acceptance, from the router or from the worker itself."""

    url: str
    alpha: float | None
    #: requests in the router's window (None: from the worker's interval gauges)
    requests: int | None
    num_steps: int | None
    adaptive: bool | None
    accept_length: float | None
    accept_rate: float | None
    target: str | None = None
    draft: str | None = None
    #: verify steps in the window (weights the pool's pooled alpha)
    verify_ct: int = 0
    source: str = "router"
    #: the router's count of the decode's last window of requests per temperature band (None: not known)
    temperature_bands: dict[str, int] | None = None

    @property
    def pair(self) -> str:
        return f"target {self.target or '?'} / draft {self.draft or '?'}" if self.target or self.draft else ""


# ---- gathering ----------------------------------------------------------------------------------------
def from_router(doc: dict[str, Any]) -> list[DecodeAcceptance]:
    out = []
    for d in doc.get("decodes") or []:
        win = d.get("window") or {}
        out.append(DecodeAcceptance(
            url=str(d.get("url", "")), alpha=win.get("alpha"), requests=int(win.get("requests") or 0),
            num_steps=d.get("num_steps"), adaptive=d.get("adaptive"), accept_length=win.get("accept_length"),
            accept_rate=win.get("accept_rate"), target=d.get("target"), draft=d.get("draft"),
            verify_ct=int(win.get("verify_ct") or 0), source="router",
            temperature_bands=(d.get("temperature_bands") or {}).get("window")))
    return out


def router_acceptance(profile: Profile, url: str | None = None) -> tuple[list[DecodeAcceptance] | None, str]:
    """(observations, where) from the router's admin API; None with the reason when it cannot be asked."""
    target = url or router_url(profile)
    try:
        doc = AdminClient(target, profile.router.admin_token_env, timeout=5.0).call("GET", "/admin/spec")
    except InferctlError as exc:
        return None, exc.message
    return from_router(doc), target


def from_worker(url: str, metrics_text: str | None, info: Any) -> DecodeAcceptance:
    """One decode from its own /metrics and /server_info (see the module docstring)."""
    gauges = decode_metrics_text(metrics_text or "")
    states = decode_server_info(info)
    live = states[0] if states else None
    steps = live.num_steps if live and live.num_steps is not None else (
        int(gauges.num_steps) if gauges.num_steps else None)
    drafts = int(gauges.num_draft_tokens) - 1 if gauges.num_draft_tokens else steps
    alpha = None
    # a gauge of 0 before the first decode-log interval is "not measured yet", not "nothing accepted"
    if gauges.accept_rate is not None and gauges.accept_length and drafts:
        alpha = alpha_from_mean_correct(gauges.accept_rate * drafts, drafts)
    target = info.get("model_path") if isinstance(info, dict) else None
    draft = info.get("speculative_draft_model_path") if isinstance(info, dict) else None
    return DecodeAcceptance(url, alpha, None, steps, live.adaptive if live else None, gauges.accept_length or None,
                            gauges.accept_rate if gauges.accept_length else None, target, draft, source="metrics")


def worker_acceptance(profile: Profile, insts: Iterable[Instance]) -> tuple[list[DecodeAcceptance], list[Finding]]:
    out: list[DecodeAcceptance] = []
    problems: list[Finding] = []
    with probe.client(timeout=5.0) as http:
        for inst in insts:
            info = probe.server_info(http, inst)
            if not info.ok:  # its health is `check servers`' to judge: here there is just nothing to read
                problems.append(Finding.skip(SOURCE_CHECK, inst.node, inst.name,
                                             f"no acceptance to read: {inst.url}/server_info: {info.error}",
                                             remedy="`inferctl check servers` judges the server's health"))
                continue
            try:
                resp = http.get(inst.url + "/metrics")
                text = resp.text if resp.status_code == 200 else None
            except httpx.HTTPError:  # an unreadable /metrics is judged as "no gauges"
                text = None
            out.append(from_worker(inst.url, text, info.data))
    return out, problems


# ---- the audit history's last tokenizer result --------------------------------------------------------
def last_tokenizer_result(history: str | Path | None, profile_name: str) -> str | None:
    """'<status>: <message> (<ts>)' of the newest tokenizer finding that is not OK in the audit history,
    or 'ok (<ts>)' when the last run with the tokenizer family found nothing; None without one."""
    if not history:
        return None
    for rec in records_newest_first(history, profile_name):
        if rec.get("kind", "audit") != "audit":
            continue
        if "tokenizer" not in (rec.get("families") or []):
            continue
        rows = [r for r in rec.get("findings") or [] if isinstance(r, list) and len(r) == 5
                and str(r[0]).startswith("tokenizer.")]
        bad = [r for r in rows if r[3] in ("fail", "warn", "unknown")]
        order = {"fail": 0, "unknown": 1, "warn": 2}
        if bad:
            worst = sorted(bad, key=lambda r: order[r[3]])[0]
            return f"{worst[3]}: {worst[4]} ({rec.get('ts')})"
        return f"ok ({rec.get('ts')})"
    return None


# ---- judgement ----------------------------------------------------------------------------------------
def _decode_instances(profile: Profile) -> list[Instance]:
    role = "collocated" if profile.collocated else "decode"
    return [i for i in instances(profile) if i.role == role and i.is_leader]


def judge_acceptance(profile: Profile, observed: list[DecodeAcceptance], *, tokenizer_hint: str | None = None
                     ) -> list[Finding]:
    by_url = {i.url: i for i in _decode_instances(profile)}
    min_requests = profile.speculative.min_requests
    out: list[Finding] = []
    for d in observed:
        inst = by_url.get(d.url)
        node, subject = (inst.node, inst.name) if inst else ("router", d.url)
        pool: Pool | None = pool_of(profile, inst.node) if inst else None
        where = f" (pool {pool.name})" if pool and pool.name != node else ""
        if d.alpha is None or not d.num_steps:
            why = ("speculation is off or its step count is unknown" if not d.num_steps else
                   "no acceptance measured yet" + (" (SGLang's gauges start after 40 decode batches)"
                                                   if d.source == "metrics" else ""))
            out.append(Finding.skip("spec.acceptance", node, subject, f"{d.url}{where}: {why}"))
            continue
        if d.requests is not None and d.requests < min_requests:
            out.append(Finding.skip("spec.acceptance", node, subject,
                                    f"{d.url}{where}: {d.requests} requests in the window, fewer than "
                                    f"speculative.min_requests {min_requests}: not judged yet"))
            continue
        limits = pool.limits if pool else base_limits(profile)
        a = assess(d.alpha, d.num_steps, limits)
        f = acceptance_finding(node, subject, a, requests=d.requests if d.requests is not None else 0,
                               pair=d.pair, tokenizer_hint=tokenizer_hint if a.near_zero else None, source=d.source)
        details = {**f.details, "url": d.url, "pool": pool.name if pool else None, "adaptive": d.adaptive,
                   "accept_length": d.accept_length, "accept_rate": d.accept_rate}
        msg = f.message if not where else f"{f.message}{where}"
        if d.source == "metrics":
            msg = msg.replace(f"over {d.requests or 0} requests", "over SGLang's last decode-log interval")
        out.append(Finding.make(f.status, f.check, f.node, f.subject, msg, details=details, remedy=f.remedy))
    return out


def judge_temperature(profile: Profile, observed: list[DecodeAcceptance]) -> list[Finding]:
    """`spec.temperature` per pool whose decodes run gamma >= LONG_GAMMA (see the module docstring)."""
    by_url = {i.url: i for i in _decode_instances(profile)}
    pools: dict[str, tuple[str, int, dict[str, int]]] = {}  # pool -> (node, gamma, summed bands)
    for d in observed:
        if d.temperature_bands is None or not d.num_steps or d.num_steps < LONG_GAMMA:
            continue
        inst = by_url.get(d.url)
        pool = pool_of(profile, inst.node) if inst else None
        name = pool.name if pool else d.url
        node, gamma, bands = pools.get(name, (inst.node if inst else "router", 0, {}))
        for band, n in d.temperature_bands.items():
            bands[band] = bands.get(band, 0) + int(n)
        pools[name] = (node, max(gamma, d.num_steps), bands)
    out = []
    min_requests = profile.speculative.min_requests
    for name, (node, gamma, bands) in pools.items():
        total, hot = sum(bands.values()), bands.get(HIGH_BAND, 0)
        details = {"pool": name, "gamma": gamma, "requests": total, "bands": bands, "hot_share_limit": HOT_SHARE}
        if total < min_requests:
            out.append(Finding.skip(TEMPERATURE_CHECK, node, name,
                                    f"pool {name}: gamma {gamma}, {total} requests in the window, fewer than "
                                    f"speculative.min_requests {min_requests}: not judged yet", details=details))
            continue
        share = hot / total
        details["hot_share"] = round(share, 4)
        msg = (f"pool {name}: lookahead gamma {gamma} with {share:.0%} of its last {total} requests above "
               f"temperature 1.2 (limit {HOT_SHARE:.0%})")
        if share > HOT_SHARE:
            out.append(Finding.warn(TEMPERATURE_CHECK, node, name, msg, details=details, remedy=(
                f"shorten the pool's lookahead (speculative.pools[].num_steps or models.draft.num_steps, gamma <= "
                f"{LONG_GAMMA - 2}, or adaptive_steps), or send the high-temperature traffic to a pool with a short "
                f"lookahead or none: drafts past the first rejection are wasted at high temperature")))
        else:
            out.append(Finding.ok(TEMPERATURE_CHECK, node, name, msg, details=details))
    return out


def check_spec(profile: Profile, *, router: str | None = None, history: str | Path | None = None,
               use_router: bool = True) -> tuple[list[Finding], dict[str, Any]]:
    """Findings and what was read (`source`: the router's URL, or "workers")."""
    draft = profile.models.draft if profile.models else None
    if draft is None:
        return [Finding.skip("spec.acceptance", "controller", "speculative",
                             "the profile runs no speculative decoding (models.draft is not set)")], {"source": None}
    hint = last_tokenizer_result(history, profile.name)
    observed: list[DecodeAcceptance] | None = None
    why = ""
    if use_router:
        observed, why = router_acceptance(profile, router)
    if observed is not None:
        return (judge_acceptance(profile, observed, tokenizer_hint=hint) or [
            Finding.skip("spec.acceptance", "router", why, "the router has measured no speculative response yet")
        ]) + judge_temperature(profile, observed), {"source": why}
    found, problems = worker_acceptance(profile, _decode_instances(profile))
    findings = problems + judge_acceptance(profile, found, tokenizer_hint=hint)
    if not found:
        # nothing measured is UNKNOWN (exit 3), never OK: a cron check must not read "fine" off a fleet it could
        # not see. It does not fail a down cluster's audit twice: the servers' health is `check servers`' FAIL.
        what = "no decode server answered" if problems else "no decode server to read"
        findings.append(Finding.unknown(SOURCE_CHECK, "controller", "speculative",
                                        f"no acceptance could be read: no router ({why}) and {what}",
                                        remedy="start the router (`inferctl router serve`) or the servers"))
    return findings, {"source": "workers", "router_error": why or None}


def _run(ctx: AuditContext) -> list[Finding]:
    findings, _ = check_spec(ctx.profile, history=ctx.options.get("history"))
    names = {n.name for n in ctx.nodes}
    # the audit's node selection applies to decodes; router-side findings are kept
    return [f for f in findings if f.node in names or f.node in ("router", "controller")]


FAMILY = CheckFamily(
    name="spec",
    description="speculative decoding: measured acceptance per decode against the alert threshold and the "
                "break-even of the speedup formula",
    run=_run,
    needs_nodes=False,
)
