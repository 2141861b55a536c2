"""`inferctl router serve|status|workers|prefixes`: the embedded router daemon and its admin API."""

from __future__ import annotations

import difflib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, get_args

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from infer_ctl.cli.common import (
    JsonOpt,
    ProfileOpt,
    RouterUrlOpt,
    finish,
    get_profile,
    router_base_url,
    seconds_parser,
    session,
)
from infer_ctl.core.report import Report
from infer_ctl.errors import UsageError
from infer_ctl.exitcodes import ExitCode
from infer_ctl.profile.router import PolicyName, RouterSettings

#: the settings' defaults, quoted in the flags' help (declared once, in profile/router.py)
_D = RouterSettings()

app = typer.Typer(help="The PD-aware, prefix-cache-aware router and its named prefixes.", no_args_is_help=True)

UrlOpt = RouterUrlOpt


@dataclass
class _Target:
    """The router a command asks, and what the report says about it: its URL and the profile it came
    from (None: --url without a profile), with the command's start time for duration_s."""

    client: Any
    url: str
    profile: str | None
    started: float = field(default_factory=time.monotonic)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        return self.client.call(method, path, body)


def _client(url: str | None, profile: str | None) -> _Target:
    from infer_ctl.router.control.client import AdminClient

    url = router_base_url(url)
    if url and profile is None:
        return _Target(AdminClient(url), url, None)
    # With -p, the profile names the token's environment variable, also when --url overrides the address.
    prof = get_profile(profile)
    url = url or f"http://{prof.router.listen}"
    return _Target(AdminClient(url, prof.router.admin_token_env), url, prof.name)


def _done(json: bool, command: str, data: dict[str, Any], render: Any, code: ExitCode = ExitCode.OK,
          target: _Target | None = None) -> None:
    sess = session(json)
    if target is not None:
        sess.started = target.started
        data = {**data, "router_url": target.url}
    report = Report(command=command, profile=target.profile if target else None, data=data,
                    exit_code_override=code)
    finish(sess, report, render)


def _asked(target: _Target) -> str:
    """Which router answered and why that one: on a shared machine the profile's address may be another
    user's router."""
    return f"router {target.url} (" + (f"profile {target.profile})" if target.profile else "from --url)")


#: the setting each `router serve` flag overrides (router.<key>), for naming the flag in an error
_FLAG_OF = {"policy": "--policy", "miss_placement": "--miss-placement", "balance_abs": "--balance-abs",
            "log_requests": "--log-requests", "kv_events.enabled": "--kv-events",
            "kv_events.replay_timeout_s": "--kv-replay-timeout", "kv_events.max_blocks": "--kv-max-blocks",
            "kv_events.max_batches_per_s": "--kv-max-batches-per-s", "coalesce.enabled": "--coalesce",
            "coalesce.processes": "--share-flights"}


@app.command("serve")
def serve(
    profile: ProfileOpt = None,
    listen: Annotated[str | None, typer.Option("--listen", help="HOST:PORT (default: router.listen).")] = None,
    prefill: Annotated[list[str] | None, typer.Option("--prefill", help="Prefill URL[@BOOTSTRAP_PORT]; repeatable.")] = None,
    decode: Annotated[list[str] | None, typer.Option("--decode", help="Decode URL; repeatable.")] = None,
    mixed: Annotated[list[str] | None, typer.Option("--mixed", help="Mixed (collocated, non-PD) worker URL; repeatable.")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help=f"{', '.join(get_args(PolicyName))}.")] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning.")] = "info",
    log_requests: Annotated[bool | None, typer.Option("--log-requests/--no-log-requests", help="One structured log line per request (default: router.log_requests, off).")] = None,
    kv_events: Annotated[bool | None, typer.Option("--kv-events/--no-kv-events", help="Follow the workers' KV events (default: router.kv_events.enabled, on).")] = None,
    kv_tokenizer: Annotated[str | None, typer.Option("--kv-tokenizer", metavar="PATH", help="Target model directory (tokenizer.json) on this host, to tokenize prompts as the workers do (default: router.kv_events.tokenizer_path, else models.target).")] = None,
    kv_replay_timeout: Annotated[float | None, typer.Option("--kv-replay-timeout", metavar="S", help=f"Seconds (above 0, at most 300) a KV-event gap replay may take before it is asked again (twice, waiting 2x and 4x); then the worker is routed on the predicted index (default: router.kv_events.replay_timeout_s, {_D.kv_events.replay_timeout_s:g}).")] = None,
    kv_max_blocks: Annotated[int | None, typer.Option("--kv-max-blocks", help=f"Distinct KV blocks kept per worker stream, on any medium (a page in HBM and host counts once); more make it untrusted (default: router.kv_events.max_blocks, {_D.kv_events.max_blocks}).")] = None,
    kv_max_batches: Annotated[int | None, typer.Option("--kv-max-batches-per-s", help=f"KV-event batches a second per publisher before it counts as a flood (default: router.kv_events.max_batches_per_s, {_D.kv_events.max_batches_per_s}).")] = None,
    miss_placement: Annotated[str | None, typer.Option("--miss-placement", help=f"Where a prompt no worker holds goes: power_of_two (the emptier, less loaded of two random workers) or rendezvous (its home by a stable hash of its start; every process and replica agrees) (default: router.miss_placement, {_D.miss_placement}).")] = None,
    balance_abs: Annotated[int | None, typer.Option("--balance-abs", help=f"Load guard: a worker with more than N in-flight requests above the least-loaded one (and balance_rel times it) takes no cache hits; misses go to the least loaded (default: router.balance_abs, {_D.balance_abs}).")] = None,
    coalesce: Annotated[bool | None, typer.Option("--coalesce/--no-coalesce", help="In-flight prefix coalescing: hold a request whose prefix a request in flight on its worker computes (default: router.coalesce.enabled, on).")] = None,
    share_flights: Annotated[bool | None, typer.Option("--share-flights/--no-share-flights", help="With several router processes, coalesce across them: each process's in-flight prompts are seen by the others (the flight board; default: router.coalesce.processes, on).")] = None,
    processes: Annotated[int | None, typer.Option(
        "--processes", min=1, max=64,
        help="Router processes on the one address (SO_REUSEPORT); default: the cores, at most 8. One without "
             "the workers' KV events (cache_aware policy) or with tenants; the start-up log says why.")] = None,
) -> None:
    """Run the router in the foreground until SIGINT/SIGTERM (then drain in-flight requests)."""
    from infer_ctl.router.config import router_settings
    from infer_ctl.router.daemon.procs import serve as serve_processes
    from infer_ctl.router.kvindex.kv_settings import checked_tokenizer

    cfg = _serve_config(profile, listen, prefill or [], decode or [], mixed or [])
    # the flags as overrides of the profile's settings (None: not given), checked by the same model
    kv = {"enabled": kv_events, "replay_timeout_s": kv_replay_timeout, "max_blocks": kv_max_blocks,
          "max_batches_per_s": kv_max_batches}
    flags = {"policy": policy, "miss_placement": miss_placement, "balance_abs": balance_abs,
             "log_requests": log_requests, "kv_events": {k: v for k, v in kv.items() if v is not None},
             "coalesce": {k: v for k, v in {"enabled": coalesce, "processes": share_flights}.items() if v is not None}}
    try:
        cfg.settings = router_settings(cfg.settings, **{k: v for k, v in flags.items() if v is not None})
    except UsageError as exc:  # only a flag can be out of bounds here: the profile was checked on load
        named = [flag for key, flag in _FLAG_OF.items() if f"router.{key}:" in exc.message]
        raise UsageError(exc.message, remedy=f"fix {', '.join(named) or 'the flags'} (it overrides the profile's "
                                             "router setting of that name, and has its bounds)") from None
    if kv_tokenizer is not None:
        cfg.tokenizer_path = checked_tokenizer(kv_tokenizer, "--kv-tokenizer")
    cfg.validate()
    raise typer.Exit(serve_processes(cfg, processes, log_level))


def _serve_config(profile: str | None, listen: str | None, prefill: list[str], decode: list[str], workers: list[str]) -> Any:
    from infer_ctl.router.config import RouterConfig, from_profile, parse_listen, parse_prefill, worker

    specs = [parse_prefill(p) for p in prefill] + [worker(d, "decode") for d in decode]
    specs += [worker(w, "mixed") for w in workers]
    if profile is None and specs:
        host, port = parse_listen(listen or RouterConfig().settings.listen)
        import os

        cfg = RouterConfig(host=host, port=port, workers=specs)
        cfg.admin_token = os.environ.get(cfg.settings.admin_token_env)
        from infer_ctl.router.observe.tracing import config_from

        cfg.tracing = config_from(None, os.environ)  # without a profile: the standard OTEL_* environment
    else:
        cfg = from_profile(get_profile(profile), listen=listen, workers=specs or None)
    if not cfg.workers:
        raise UsageError("no workers to route to", remedy="give --prefill/--decode (or --mixed), or a profile with nodes")
    cfg.validate()
    return cfg


@app.command("status")
def status(url: UrlOpt = None, profile: ProfileOpt = None, json: JsonOpt = False) -> None:
    """Mode, policy, worker availability, index and prefix counts. Exit 1 if some worker is unavailable,
    2 if none is, 3 if the router is unreachable."""
    target = _client(url, profile)
    doc = target.call("GET", "/admin/status")
    w = doc["workers"]
    code = ExitCode.OK if w["available"] == w["total"] else ExitCode.WARN if w["available"] else ExitCode.FAIL

    # workers answering their checks but kept out by a flap hold-down (absent from an older router)
    held = f" ({w['held']} held down)" if w.get("held") else ""

    def render(c: Console) -> None:
        c.print(f"{_asked(target)}: listening on {doc['listen']}, mode {doc['mode']}, policy {doc['policy']}, "
                f"workers {w['available']}/{w['total']} available{held}, {doc['active_requests']} in flight, "
                f"index {doc['index']['blocks']} blocks, prefixes {doc['prefixes']['active']} active")
        store = doc.get("state_store")  # several replicas: where they share their state
        if store:
            c.print(f"  state store {store['url']}: {_store_state(store)}", highlight=False)
        spec = doc.get("speculative") or {}
        for url, d in (spec.get("decodes") or {}).items():
            c.print(f"  speculative {url}: {_spec_cells(d)}", highlight=False)

    _done(json, "router status", {"router": doc}, render, code, target)


def _store_state(store: dict[str, Any]) -> str:
    """The state store's line of `router status`: a store in use by another fleet is reachable, and the
    remedy is a rename, not the network (`another_fleet` is absent from an older router)."""
    if store["connected"]:
        return "connected"
    if store.get("another_fleet"):
        return (f"NOT USED, its namespace is another fleet's ({store['error']}): serving with this replica's "
                "own state, admin changes refused")
    return f"UNREACHABLE ({store['error']}): serving with the state held, admin changes refused"


WORKER_ACTIONS = ("list", "add", "remove", "drain", "undrain")
PREFIX_ACTIONS = ("list", "add", "expire", "warm", "remove")


def _check_action(kind: str, action: str, valid: tuple[str, ...], remedy: str) -> None:
    """An unknown ACTION is a usage error before any profile is read or router asked: without a profile the
    user saw "no profile given" for a typo, and no "did you mean"."""
    if action in valid:
        return
    close = difflib.get_close_matches(action, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (one of {', '.join(valid)})"
    raise UsageError(f"bad {kind} action {action!r}{hint}", remedy=remedy)


@app.command("workers")
def workers(
    action: Annotated[str, typer.Argument(help="list, add, remove, drain or undrain.")] = "list",
    worker_url: Annotated[str | None, typer.Argument(metavar="URL", help="Worker URL (add/remove/drain/undrain).")] = None,
    role: Annotated[str | None, typer.Option("--role", help="prefill, decode or mixed (add).")] = None,
    bootstrap_port: Annotated[int | None, typer.Option("--bootstrap-port", help="Prefill bootstrap port (add).")] = None,
    url: UrlOpt = None, profile: ProfileOpt = None, json: JsonOpt = False,
) -> None:
    """List the router's workers (and the prefill x decode pairs it avoids), or add/remove/drain/undrain
    one at runtime (drain: no new requests, the ones in flight finish)."""
    _check_action("workers", action, WORKER_ACTIONS, _WORKERS_USE)
    if action != "list" and not worker_url:
        raise UsageError(f"workers {action} needs a worker URL", remedy=_WORKERS_USE)
    if action == "add" and role not in ("prefill", "decode", "mixed"):
        raise UsageError("workers add needs --role prefill|decode|mixed", remedy="e.g. --role decode")
    client = _client(url, profile)
    if action == "list":
        doc = client.call("GET", "/admin/workers")
        doc["speculative"] = _spec_doc(client)
        doc["pairs"] = _pairs_doc(client)
        _done(json, "router workers", doc, lambda c: _render_workers(c, doc), target=client)
    elif action in ("drain", "undrain"):
        body = {"url": worker_url, "timeout_s": 0} if action == "drain" else {"url": worker_url, "drain": False}
        doc = client.call("POST", "/admin/workers/drain", body)
        _done(json, f"router workers {action}", doc,
              lambda c: c.print(f"{action}: {worker_url} ({doc.get('inflight', 0)} in flight)"), target=client)
    else:  # add or remove
        body = {"url": worker_url, "role": role, "bootstrap_port": bootstrap_port}
        doc = client.call("POST", "/admin/workers" if action == "add" else "/admin/workers/remove", body)
        _done(json, f"router workers {action}", doc, lambda c: c.print(f"{action}: {worker_url}"), target=client)


_WORKERS_USE = "use: workers [list | add URL --role R | remove URL | drain URL | undrain URL]"
_PREFIXES_USE = "use: prefixes [list | add NAME --text T | expire NAME | warm NAME | remove NAME]"


def _pairs_doc(client: Any) -> list[dict[str, Any]]:
    """The router's /admin/pairs, or [] from a router that predates pair health."""
    from infer_ctl.errors import InferctlError

    try:
        return list(client.call("GET", "/admin/pairs").get("pairs", []))
    except InferctlError:
        return []


def _render_workers(c: Console, doc: dict[str, Any]) -> None:
    c.print(_workers_table(doc["workers"], doc["speculative"]))
    for w in doc["workers"]:  # the index of each worker that has one: one line each, the table has no room
        if w.get("index") is None:
            continue
        if w["role"] == "decode":  # a decode's radix cache, from its KV events (docs/router.md: not routed on)
            c.print(f"  {w['url']}: decode index {w['index']} ({w['index_reason']}), {w.get('kv_blocks', 0)} blocks",
                    markup=False, highlight=False)
            continue
        ct = w.get("cached_tokens")
        acc = (f"; cached tokens over {ct['requests']} reqs: exact {ct['exact']}, predicted {ct['predicted']}, "
               f"reported {ct['reported']}" if ct else "")
        blocks = f", {w['kv_blocks']} blocks{_tier_note(w.get('kv_media'))}" if "kv_blocks" in w else ""
        c.print(f"  {w['url']}: index {w['index']} ({w['index_reason']}){blocks}{acc}", markup=False, highlight=False)
    bad = [p for p in doc.get("pairs") or [] if p.get("degraded")]
    if bad:
        c.print(f"degraded pairs ({len(bad)}, avoided by the router):")
        for p in bad:  # one line each: two worker URLs and a reason do not fit a table in 80 columns
            why = p["reason"] + (f" ({p['pair_test_reason']})" if p.get("pair_test_reason") else "")
            kv = (f"; last KV transfer {_num(p.get('kv_transfer_speed_gb_s'))} GB/s, "
                  f"{_num(p.get('kv_transfer_latency_ms'), '.1f')} ms" if p.get("kv_transfer_speed_gb_s") is not None else "")
            probe = "back after a pair test passes" if p["reason"] == "pair_test" else \
                f"probe in {_num(p.get('probe_in_s'), '.0f')} s"
            c.print(f"  {p['prefill']} x {p['decode']}: {why}{kv}; {probe}", markup=False)


def _keep_cell(p: dict[str, Any]) -> str:
    """`keep`, with how many replicas whose tier the index knows sit in it ("hbm 1/2"); "-" without."""
    keep = p.get("keep")
    if not keep:
        return "-"
    known = [r["tier"] for r in p["replicas"] if r.get("tier") is not None]
    if not known or p["state"] != "active":
        return keep
    ok = ("hbm",) if keep == "hbm" else ("hbm", "host")
    return f"{keep} {sum(t in ok for t in known)}/{len(known)}"


#: SGLang's StorageMedium values as the tiers' names (docs/router.md "KV tiers")
_TIER_NAMES = {"GPU": "HBM", "CPU_PINNED": "host", "DISK": "disk", "EXTERNAL": "external"}


def _tier_note(media: dict[str, int] | None) -> str:
    """" (120 HBM, 300 host)" when a worker holds blocks below HBM; nothing for HBM only (as before)."""
    if not media or not any(n for m, n in media.items() if m != "GPU"):
        return ""
    return " (" + ", ".join(f"{n} {_TIER_NAMES.get(m, m)}" for m, n in media.items() if n or m == "GPU") + ")"


def _table(headers: list[str], first: list[str]) -> Table:
    """Compact enough for an 80-column terminal or a cron mail; identifiers (worker URLs, prefix names)
    are never truncated (a table of "http:…" rows is useless), the last column folds if it must."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True)  # 2 spaces apart
    for i, h in enumerate(headers):
        t.add_column(h, no_wrap=i < len(headers) - 1, overflow="fold",
                     min_width=max([len(h), *map(len, first)]) if i == 0 else None)
    return t


def _worker_state(w: dict[str, Any]) -> str:
    if not w["healthy"]:
        if w.get("held"):  # answers its checks, kept out by its flap hold-down (router/control/health.py)
            return f"[red]held {math.ceil(w['holddown_left_s'])}s[/red]"
        return "[red]unhealthy[/red]"
    if w.get("draining"):
        return "[yellow]drained[/yellow]"  # out of routing (in-flight ones finish); fits 80 columns
    cb = w["circuit_breaker"]
    return "ok" if cb == "closed" else f"[yellow]cb {cb}[/yellow]"


#: the index a prefill is routed on, in a few letters (80 columns): KV events trusted, being replayed,
#: or the predicted index; a decode's stream (no predicted index) may also be untrusted or down
_INDEX = {"exact": "exact", "replaying": "replay", "predicted": "pred", "untrusted": "untr", "down": "down"}


def _workers_table(rows: list[dict[str, Any]], spec: dict[str, Any] | None = None) -> Table:
    by_url = {d["url"]: d for d in (spec or {}).get("decodes", [])}
    # short headers: with a 22-character URL the table must fit 80 columns without losing a column
    cols = ["worker", "role", "state", "infl", "reqs", "err", "rst", "index"]
    t = _table(cols + (["spec (window)"] if by_url else []), [w["url"] for w in rows])
    for w in rows:
        cells = [w["url"], w["role"], _worker_state(w), str(w["inflight"]), str(w["requests"]), str(w["errors"]),
                 str(w["restarts"]), _INDEX.get(w.get("index", ""), "-")]
        d = by_url.get(w["url"])
        if by_url:
            cells.append(_spec_cells({"num_steps": d["num_steps"], "adaptive": d["adaptive"], **d["window"]})
                         if d else "-")
        t.add_row(*cells)
    return t


def _spec_doc(client: Any) -> dict[str, Any] | None:
    """The router's /admin/spec, or None from a router that predates it."""
    from infer_ctl.errors import InferctlError

    try:
        return dict(client.call("GET", "/admin/spec"))
    except InferctlError:
        return None


def _num(v: Any, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _spec_cells(d: dict[str, Any]) -> str:
    """One decode's window as SGLang names it: alpha (estimated), accept length, accept rate, steps."""
    steps = f"{d.get('num_steps')} steps" + (" (adaptive)" if d.get("adaptive") else "") if d.get("num_steps") is not None else "steps ?"
    return (f"alpha {_num(d.get('alpha'))}, accept length {_num(d.get('accept_length'))}, accept rate "
            f"{_num(d.get('accept_rate'))}, {d.get('requests', 0)} reqs, {steps}")


def _pair_model(name: str | None, field: str) -> str:
    """A pair's model, or why none is shown: the router reads both from the decode's /server_info, where
    an algorithm without a draft model (NGRAM) or a server that does not say leaves the field null."""
    return name if name is not None else f"none reported (no {field} in /server_info)"


@app.command("spec")
def spec(url: UrlOpt = None, profile: ProfileOpt = None, json: JsonOpt = False) -> None:
    """Speculative acceptance per decode and workload label (rolling window and EMA), per draft/target
    pair, and the controller's recent actions."""
    client = _client(url, profile)
    doc = client.call("GET", "/admin/spec")

    def render(c: Console) -> None:
        t = _table(["decode", "label", "reqs", "alpha", "ema", "acc len", "acc rate", "steps"],
                   [d["url"] for d in doc["decodes"]])
        for d in doc["decodes"]:
            steps = "-" if d["num_steps"] is None else f"{d['num_steps']}{' a' if d['adaptive'] else ''}"
            for label, r in (("all", d), *d["labels"].items()):
                win = r["window"]
                t.add_row(d["url"] if label == "all" else "", label, str(win["requests"]), _num(win["alpha"]),
                          _num(r["ema"]["alpha"]), _num(win["accept_length"]), _num(win["accept_rate"]),
                          steps if label == "all" else "")
        c.print(t)
        for p in doc["pairs"]:
            c.print(f"pair target {_pair_model(p['target'], 'model_path')} / draft "
                    f"{_pair_model(p['draft'], 'speculative_draft_model_path')}: {p['requests']} reqs, "
                    f"alpha {_num(p['alpha'])}, "
                    f"accept length {_num(p['accept_length'])}", highlight=False, markup=False)
        for a in doc["actions"][-5:]:
            c.print(f"action {a.get('ts', '')} {a['pool']} {a['action']}: {a.get('message', '')}",
                    highlight=False, markup=False)

    _done(json, "router spec", {"speculative": doc}, render, target=client)


#: --ttl: 0 is none; a plain float option took nan/inf and encoding the request failed
_ttl = seconds_parser(0, note=" (0: no TTL)")


@app.command("prefixes")
def prefixes(
    action: Annotated[str, typer.Argument(help="list, add, expire, warm or remove.")] = "list",
    name: Annotated[str | None, typer.Argument(help="Prefix name (add/expire/warm/remove).")] = None,
    text: Annotated[str | None, typer.Option("--text", help="Prefix text (add).")] = None,
    file: Annotated[Path | None, typer.Option("--file", help="Read the prefix text from a file (add).")] = None,
    ttl: Annotated[float | None, typer.Option("--ttl", parser=_ttl, metavar="S", help="Lifetime in seconds, 0 = none (add; default: the current version's, else none).")] = None,
    replicas: Annotated[int | None, typer.Option("--replicas", help="Warm on this many prefill workers (add; default: the current version's, else 1).")] = None,
    pin: Annotated[bool | None, typer.Option("--pin/--no-pin", help="Warm with high priority (add; default: the current version's, else no).")] = None,
    chat: Annotated[bool | None, typer.Option("--chat/--text-format", help="The prefix is a chat system prompt (add; default: the current version's, else text).")] = None,
    keep: Annotated[str | None, typer.Option("--keep", help="With HiCache: hbm (stay in HBM), host (warm while in host memory) or none (add; default: the current version's, else none).")] = None,
    url: UrlOpt = None, profile: ProfileOpt = None, json: JsonOpt = False,
) -> None:
    """Named shared prefixes: list them with their replicas and statistics, add (or supersede), expire, warm,
    remove (forget every version)."""
    _check_action("prefixes", action, PREFIX_ACTIONS, _PREFIXES_USE)
    if action != "list" and not name:
        raise UsageError(f"prefixes {action} needs a prefix NAME", remedy=_PREFIXES_USE)
    if replicas is not None and not 1 <= replicas <= 64:
        raise UsageError(f"--replicas must be 1 to 64, got {replicas}",
                         remedy="the number of prefill workers to warm the prefix on")
    client = _client(url, profile)
    if action == "list":
        doc = client.call("GET", "/admin/prefixes")
        _done(json, "router prefixes list", doc, lambda c: c.print(_prefix_table(doc["prefixes"])), target=client)
        return
    if action == "remove":
        gone = client.call("POST", f"/admin/prefixes/{name}/remove")
        _done(json, "router prefixes remove", gone,
              lambda c: c.print(f"remove: {name} (versions {', '.join(map(str, gone['versions']))})"), target=client)
        return
    if action == "add":
        if (text is None) == (file is None):
            raise UsageError("prefixes add needs exactly one of --text or --file", remedy="e.g. --file prompts/policy.txt")
        # Options not given are left out, so a new version keeps the current one's settings.
        body: dict[str, Any] = {"name": name, "text": text if text is not None else _read(file), "replicas": replicas,
                                "pin": pin, "format": None if chat is None else "chat" if chat else "text"}
        if ttl is not None:
            body["ttl_s"] = ttl or None
        if keep is not None:
            if keep not in ("hbm", "host", "none"):
                raise UsageError(f"--keep must be hbm, host or none, got {keep!r}",
                                 remedy="--keep hbm: stay in HBM; --keep host: warm while in host memory")
            body["keep"] = None if keep == "none" else keep
        doc = client.call("POST", "/admin/prefixes", body)
    else:
        doc = client.call("POST", f"/admin/prefixes/{name}/{action}")
    p = doc["prefix"]
    _done(json, f"router prefixes {action}", doc, lambda c: c.print(f"{action}: {p['name']} v{p['version']} ({p['state']})"),
          target=client)


def _read(file: Path | None) -> str:
    assert file is not None
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {file}: {exc.strerror}", remedy="check the --file path") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{file} is not UTF-8 text (byte {exc.start})", remedy="save the prompt as UTF-8") from None


def _prefix_table(rows: list[dict[str, Any]]) -> Table:
    # cached p/a: predicted / actual cached tokens of its traffic (prefix length in chars: --json)
    t = _table(["prefix", "ver", "state", "warm", "pin", "keep", "expires", "reqs", "hits", "cached p/a"],
               [p["name"] for p in rows])
    for p in rows:
        warm = sum(r["warm"] for r in p["replicas"])
        st = p["stats"]
        # an expired or superseded version is warm nowhere any more: no "2/2" for it
        t.add_row(p["name"], str(p["version"]), p["state"],
                  f"{warm}/{p['replicas_wanted']}" if p["state"] == "active" else "-",
                  "yes" if p["pin"] else "no", _keep_cell(p), "-" if p["expires_in_s"] is None else f"{p['expires_in_s']:.0f}s",
                  str(st["requests"]), f"{st['hit_rate']:.0%}",
                  f"{st['predicted_cached_tokens']}/{st['actual_cached_tokens']}")
    return t


@app.command("tenants")
def tenants(url: UrlOpt = None, profile: ProfileOpt = None, json: JsonOpt = False) -> None:
    """Per tenant: requests, in flight, input/cached/output tokens, errors, refusals by limit and cost
    (router.tenants, router.pricing). Exit 1 when some tenant was refused by a limit."""
    target = _client(url, profile)
    doc = target.call("GET", "/admin/tenants")
    rows = doc.get("tenants") or []
    refused = any(sum((t.get("rejected") or {}).values()) for t in rows)

    def render(c: Console) -> None:
        if doc.get("mode") == "off":
            c.print("no tenants or pricing configured (router.tenants, router.pricing)")
            return
        mode = {"key": "by API key", "header": f"by header {doc.get('header')}", "none": "none (pricing only)"}
        c.print(f"tenants {mode.get(doc['mode'], doc['mode'])}; unknown keys refused: {doc.get('unknown_rejected', 0)}")
        t = _table(["tenant", "reqs", "now", "input", "cached", "output", "err", "cost $", "refused"],
                   [r["tenant"] for r in rows])
        for r in rows:
            rej = r.get("rejected") or {}
            t.add_row(r["tenant"], str(r["requests"]), str(r["inflight"]), str(r["input_tokens"]),
                      str(r["cached_tokens"]), str(r["output_tokens"]), str(r["errors"]),
                      f"{sum((r.get('cost_usd') or {}).values()):.4f}",
                      ", ".join(f"{k} {v}" for k, v in rej.items()) or "0")
        c.print(t)

    _done(json, "router tenants", doc, render, ExitCode.WARN if refused else ExitCode.OK, target)


@app.command("tenant-key")
def tenant_key(json: JsonOpt = False) -> None:
    """A new random API key for a tenant and its SHA-256 for router.tenants[].key_sha256 (the key is
    printed once: give it to the tenant; the profile holds only the hash)."""
    import hashlib
    import secrets

    key = "ick_" + secrets.token_urlsafe(32)
    digest = hashlib.sha256(key.encode()).hexdigest()
    _done(json, "router tenant-key", {"key": key, "key_sha256": digest},
          lambda c: c.print(f"key:        {key}\nkey_sha256: {digest}", highlight=False))
