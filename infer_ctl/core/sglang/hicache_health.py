"""Judging a running server's HiCache from its `/metrics` and `GET /hicache/storage-backend` (pure).

The series are SGLang 0.5.23's (sglang/srt/observability/metrics_collector.py):
- `sglang:hicache_host_used_tokens` / `sglang:hicache_host_total_tokens` (gauges, only with
  --enable-hierarchical-cache), `sglang:evicted_tokens_total` (device slots freed by eviction, backed up
  or not: `RadixCacheMetricsCollector`);
- `sglang:hicache_backup_tokens_total{pool}` (GPU -> host copies), `sglang:hicache_dropped_tokens_total
  {reason, pool}` (device KV destroyed without a host copy: `host_pressure` = write-back failed for a
  full host pool, `write_through_unbacked_eviction` = the write-through copy had not finished when the
  page was evicted), `sglang:hicache_backup_dropped_tokens_total` (buffer_only backups that never
  reached storage);
- `sglang:storage_prefetch_hit_tokens_total` (storage-hit tokens an L3 query found),
  `sglang:storage_prefetch_unfulfilled_tokens_total{reason}` (of those, tokens that never became a usable
  prefetch, by reason), `sglang:storage_prefetch_deferred_tokens_total{reason}`,
  `sglang:prefetched_tokens_total` (tokens that arrived from storage).
Every scheduler rank reports its own series (`tp_rank`, `dp_rank` labels; "read one rank rather than
summing ranks" for the token counters): each DP rank's lowest TP rank is read, and DP ranks (separate
caches) are summed. Counters are since the server started.

The runtime endpoint (`hicache_storage_backend_status`, sglang/srt/entrypoints/http_server.py) answers
`{"hicache_storage_backend": ..., "hicache_storage_backend_extra_config": ...,
"hicache_storage_prefetch_policy": ..., "hicache_write_policy": ...}`; it needs the server's
--admin-api-key (400 "requires admin API key" when the server has none). A detach
(`DELETE /hicache/storage-backend`) leaves the backend None there while the storage metrics stay.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.sglang.instance import Instance

HOST_USED = "sglang:hicache_host_used_tokens"
HOST_TOTAL = "sglang:hicache_host_total_tokens"
EVICTED = "sglang:evicted_tokens_total"
BACKUP = "sglang:hicache_backup_tokens_total"
DROPPED = "sglang:hicache_dropped_tokens_total"
BACKUP_DROPPED = "sglang:hicache_backup_dropped_tokens_total"
PREFETCH_HIT = "sglang:storage_prefetch_hit_tokens_total"
PREFETCH_UNFULFILLED = "sglang:storage_prefetch_unfulfilled_tokens_total"
PREFETCH_DEFERRED = "sglang:storage_prefetch_deferred_tokens_total"
PREFETCHED = "sglang:prefetched_tokens_total"
NAMES = (HOST_USED, HOST_TOTAL, EVICTED, BACKUP, DROPPED, BACKUP_DROPPED, PREFETCH_HIT, PREFETCH_UNFULFILLED,
         PREFETCH_DEFERRED, PREFETCHED)  # fmt: skip
STORAGE_ENDPOINT = "/hicache/storage-backend"

#: a host pool this full, while HBM keeps evicting, pushes older prefixes out of host memory
HOST_FULL_FRACTION = 0.95
#: write-back losses above this share of the evicted tokens: the host tier is not doing its job
LOSS_FAIL_FRACTION = 0.10
#: storage-hit tokens that never became usable prefetches, above this share of the hits
UNFULFILLED_WARN_FRACTION = 0.5
#: what each unfulfilled reason means for the operator (the counter's documentation, SGLang 0.5.23)
REASON_HINTS = {
    "deadline": "the prefetch policy's deadline stopped reads before they completed (storage slower than the "
    "timeout allows: `inferctl plan tiers` says whether this tier pays; prefetch_policy wait_complete waits)",
    "host_capacity": "no host memory to stage the prefetch (raise the host pool: ratio / size_gb)",
    "device_capacity": "no HBM free to load the prefetched span",
    "storage_transfer": "reads from the storage backend failed (check the backend's health and logs)",
    "below_threshold": "prefixes shorter than the prefetch threshold are not fetched",
}


@dataclass(frozen=True)
class HiCacheMetrics:
    """The series of NAMES, reduced as the module docstring says; `by_reason` per labelled counter."""

    values: Mapping[str, float] = field(default_factory=dict)
    by_reason: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: series whose sample was NaN, +-Inf or negative (token counts and counters never are): name -> the text,
    #: left out of `values` so that a judge says it cannot tell instead of judging (or crashing on) it
    invalid: Mapping[str, str] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    def total(self, name: str) -> float:
        return self.values.get(name, 0.0)


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    while i < len(text):
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= len(text) or text[eq + 1] != '"':
            break
        key = text[i:eq].strip().lstrip(",").strip()
        j, value = eq + 2, []
        while j < len(text) and text[j] != '"':
            if text[j] == "\\" and j + 1 < len(text):
                j += 1
            value.append(text[j])
            j += 1
        out[key] = "".join(value)
        i = j + 1
    return out


def parse_metrics(text: str) -> HiCacheMetrics:
    """The HiCache series of a Prometheus exposition text."""
    # (name, labels without tp/pp/attn ranks) -> {dp_rank: (tp_rank, value)}: keep each DP rank's lowest TP rank
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, tuple[int, float]]] = {}
    wanted = set(NAMES)
    invalid: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        cut = line.find("{")
        if cut < 0:
            name, _, rest = line.partition(" ")
            labels: dict[str, str] = {}
        else:
            end = line.rfind("}")
            name, labels, rest = line[:cut], _labels(line[cut + 1 : end]), line[end + 1 :]
        if name not in wanted:
            continue
        try:
            raw = rest.split()[0]
            value = float(raw)
        except (IndexError, ValueError):
            continue
        if not math.isfinite(value) or value < 0:
            invalid.setdefault(name, raw)
            continue
        tp_text = labels.pop("tp_rank", "0")
        tp = int(tp_text) if tp_text.isdigit() else 0
        dp = labels.pop("dp_rank", "0")
        for rank_label in ("pp_rank", "attn_cp_rank", "attn_cp_size", "pp_size", "moe_ep_rank"):
            labels.pop(rank_label, None)
        key = (name, tuple(sorted(labels.items())))
        ranks = seen.setdefault(key, {})
        if dp not in ranks or tp < ranks[dp][0]:
            ranks[dp] = (tp, value)
    values: dict[str, float] = {}
    by_reason: dict[str, dict[str, float]] = {}
    for (name, labels_t), ranks in seen.items():
        total = sum(v for _, v in ranks.values())
        values[name] = values.get(name, 0.0) + total
        reason = dict(labels_t).get("reason")
        if reason is not None:
            by_reason.setdefault(name, {})
            by_reason[name][reason] = by_reason[name].get(reason, 0.0) + total
    return HiCacheMetrics(values, by_reason, invalid)


def _unusable(inst: Instance, check: str, m: HiCacheMetrics, names: Iterable[str]) -> Finding | None:
    bad = {n: m.invalid[n] for n in names if n in m.invalid}
    if not bad:
        return None
    return Finding.unknown(
        check, inst.node, inst.name,
        "/metrics reports " + ", ".join(f"{n} = {v}" for n, v in bad.items())
        + ": not a token count, so this cannot be judged",
        details={"invalid": bad},
        remedy="read the server's /metrics by hand; a NaN or negative HiCache series is a server-side bug "
        "(report it with the SGLang version)")  # fmt: skip


def _n(x: float) -> str:
    return f"{int(x):,}"


def judge_host(inst: Instance, m: HiCacheMetrics) -> Finding:
    if bad := _unusable(inst, "servers.hicache_host", m, (HOST_USED, HOST_TOTAL, EVICTED)):
        return bad
    used, total = m.get(HOST_USED), m.get(HOST_TOTAL)
    if used is None or not total:
        return Finding.unknown(
            "servers.hicache_host", inst.node, inst.name,
            f"no {HOST_USED} / {HOST_TOTAL} in /metrics although the profile runs HiCache here",
            remedy="check that the server runs --enable-hierarchical-cache and --enable-metrics "
            "(`inferctl check servers` servers.drift names a differing flag)")  # fmt: skip
    if used > total:
        return Finding.unknown(
            "servers.hicache_host", inst.node, inst.name,
            f"{HOST_USED} {_n(used)} exceeds {HOST_TOTAL} {_n(total)}: the counts are inconsistent",
            details={"used_tokens": used, "total_tokens": total},
            remedy="read each rank's /metrics by hand; check that the address serves one SGLang server")  # fmt: skip
    share, evicted = used / total, m.total(EVICTED)
    details = {"used_tokens": int(used), "total_tokens": int(total), "used_fraction": round(share, 4),
               "evicted_tokens": int(evicted)}  # fmt: skip
    if share >= HOST_FULL_FRACTION and evicted > 0:
        return Finding.warn(
            "servers.hicache_host", inst.node, inst.name,
            f"host pool {share:.0%} full ({_n(used)} of {_n(total)} tokens) while HBM evicts ({_n(evicted)} tokens "
            "evicted so far): each new backup pushes an older prefix out of host memory, so the tier is at capacity",
            details=details,
            remedy="raise sglang.hicache.ratio / size_gb if the nodes have the RAM (`inferctl plan tiers` sizes "
            "it), or add a storage tier for the prefixes that do not fit")  # fmt: skip
    return Finding.ok("servers.hicache_host", inst.node, inst.name,
                      f"host pool {share:.0%} full ({_n(used)} of {_n(total)} tokens)", details=details)


def judge_backup(inst: Instance, m: HiCacheMetrics) -> Finding:
    if bad := _unusable(inst, "servers.hicache_backup", m, (DROPPED, BACKUP_DROPPED, EVICTED, BACKUP)):
        return bad
    dropped = m.by_reason.get(DROPPED, {})
    pressure, unbacked = dropped.get("host_pressure", 0.0), dropped.get("write_through_unbacked_eviction", 0.0)
    staged = m.total(BACKUP_DROPPED)
    evicted, backed = m.total(EVICTED), m.total(BACKUP)
    details = {"evicted_tokens": int(evicted), "backup_tokens": int(backed), "host_pressure_lost": int(pressure),
               "unbacked_eviction_lost": int(unbacked), "buffer_backup_dropped": int(staged)}  # fmt: skip
    problems: list[str] = []
    remedies: list[str] = []
    if pressure:
        problems.append(f"{_n(pressure)} tokens evicted from HBM without a host copy under write_back because the "
                        "host pool was full (write-back losses)")
        remedies.append("raise the host pool (ratio / size_gb) or use write_through")
    if unbacked:
        problems.append(f"{_n(unbacked)} tokens evicted before their write-through copy to host finished (the "
                        "GPU->host copies lag the evictions)")
        remedies.append("check the host copy bandwidth (io_backend, pinned memory) or use write_through_selective")
    if staged:
        problems.append(f"{_n(staged)} buffer_only backup tokens never reached storage (the write path lags "
                        "device churn)")
        remedies.append("give the storage backend more bandwidth, or a larger staging ratio")
    if not problems:
        return Finding.ok("servers.hicache_backup", inst.node, inst.name,
                          f"no backup losses ({_n(backed)} tokens backed up to host, {_n(evicted)} evicted)",
                          details=details)
    lost = pressure + unbacked
    make = Finding.fail if evicted and lost / evicted >= LOSS_FAIL_FRACTION else Finding.warn
    share = f" ({lost / evicted:.0%} of the {_n(evicted)} evicted)" if evicted and lost else ""
    return make("servers.hicache_backup", inst.node, inst.name, "; ".join(problems) + share, details=details,
                remedy="; ".join(remedies))


@dataclass(frozen=True)
class StorageLaunch:
    """What the server's command line says about its storage tier (SGLang's defaults where unset), and
    how the controller reached the runtime endpoint."""

    backend: str
    extra_config: str | None = None
    prefetch_policy: str = "timeout"
    write_policy: str = "write_through"
    #: the controller's variable holding the admin key (sglang.hicache.admin_api_key_env), and whether set
    key_env: str | None = None
    key_set: bool = False


def _attach_remedy(inst: Instance, launch: StorageLaunch) -> str:
    body: dict[str, str] = {"hicache_storage_backend": launch.backend}
    if launch.extra_config is not None:
        body["hicache_storage_backend_extra_config_json"] = launch.extra_config
    body["hicache_storage_prefetch_policy"] = launch.prefetch_policy
    body["hicache_write_policy"] = launch.write_policy
    auth = f"Authorization: Bearer ${launch.key_env}" if launch.key_env else "Authorization: Bearer <admin key>"
    return (f"re-attach it when no request is running (SGLang refuses otherwise): curl -X PUT {inst.url}"
            f"{STORAGE_ENDPOINT} -H '{auth}' -H 'Content-Type: application/json' -d '{json.dumps(body)}'; "
            "or restart the server with `inferctl launch --rolling`")


def _unreadable(status: int | None, body: Any, launch: StorageLaunch) -> tuple[str, str] | None:
    """(why, remedy) when the runtime endpoint could not be read for a reason the operator can fix."""
    if status == 400 and isinstance(body, Mapping) and "admin API key" in str(body.get("error", "")):
        return ("the server runs without --admin-api-key, so SGLang does not answer it",
                "give the servers --admin-api-key (sglang.extra_args) and set sglang.hicache.admin_api_key_env")
    if status in (401, 403):
        if launch.key_env and not launch.key_set:
            return (f"HTTP {status}: ${launch.key_env} is not set in this environment",
                    f"export {launch.key_env} with the servers' --admin-api-key")
        if not launch.key_env:
            return (f"HTTP {status}: no admin key was sent",
                    "set sglang.hicache.admin_api_key_env to the variable holding the servers' --admin-api-key")
        return f"HTTP {status}, the admin key was refused", (
            f"set ${launch.key_env} to the servers' --admin-api-key (SGLang accepts only that key here when "
            "one is set)")
    return None


def judge_storage(inst: Instance, m: HiCacheMetrics, expected_backend: str | StorageLaunch, status: int | None,
                  body: Any) -> list[Finding]:
    """The storage tier: attached as launched (the runtime endpoint, when readable) and prefetching."""
    launch = expected_backend if isinstance(expected_backend, StorageLaunch) else StorageLaunch(expected_backend)
    expected = launch.backend
    out: list[Finding] = []
    check = "servers.hicache_storage"
    attached: str | None = None
    unread_note = ""
    if status == 200 and isinstance(body, Mapping):
        attached = body.get("hicache_storage_backend")
        if attached is None:
            out.append(Finding.fail(
                check, inst.node, inst.name,
                f"storage backend detached at runtime (the profile runs {expected}): no L3 reads or writes",
                details={"expected": expected, "runtime": dict(body)}, remedy=_attach_remedy(inst, launch)))  # fmt: skip
            return out
        if attached != expected:
            out.append(Finding.warn(
                check, inst.node, inst.name,
                f"storage backend {attached} attached at runtime, but the profile runs {expected}",
                details={"expected": expected, "runtime": dict(body)},
                remedy=f"detach it (DELETE {STORAGE_ENDPOINT}) and attach {expected}, or update the profile"))  # fmt: skip
        else:
            # a runtime attach to the same backend may change the policies (SGLang: "policies updated")
            drift = {k: (want, body.get(k)) for k, want in (("hicache_storage_prefetch_policy", launch.prefetch_policy),
                                                            ("hicache_write_policy", launch.write_policy))
                     if body.get(k) is not None and body.get(k) != want}  # fmt: skip
            if drift:
                what = ", ".join(f"{k} {got} (launched with {want})" for k, (want, got) in drift.items())
                out.append(Finding.warn(
                    check, inst.node, inst.name, f"storage {attached} attached, but a runtime attach changed {what}",
                    details={"runtime": dict(body)}, remedy=_attach_remedy(inst, launch)))  # fmt: skip
    else:
        unread = _unreadable(status, body, launch)
        if unread is not None and status in (401, 403):
            out.append(Finding.unknown(check, inst.node, inst.name, f"{STORAGE_ENDPOINT}: {unread[0]}",
                                       remedy=unread[1]))
        elif unread is not None:
            unread_note = f"; runtime state not read: {unread[0]}"
    if bad := _unusable(inst, check, m, (PREFETCH_HIT, PREFETCH_UNFULFILLED, PREFETCHED)):
        out.append(bad)
        return out
    hits, unfulfilled = m.total(PREFETCH_HIT), m.total(PREFETCH_UNFULFILLED)
    reasons = dict(sorted(m.by_reason.get(PREFETCH_UNFULFILLED, {}).items(), key=lambda kv: -kv[1]))
    details = {"prefetch_hit_tokens": int(hits), "unfulfilled_tokens": int(unfulfilled),
               "unfulfilled_by_reason": {k: int(v) for k, v in reasons.items() if v},
               "prefetched_tokens": int(m.total(PREFETCHED)), "runtime": attached}  # fmt: skip
    if hits and unfulfilled / hits >= UNFULFILLED_WARN_FRACTION:
        top = [r for r, v in reasons.items() if v][:2]
        why = "; ".join(f"{r}: {REASON_HINTS.get(r, 'see sglang:storage_prefetch_unfulfilled_tokens_total')}"
                        for r in top)
        out.append(Finding.warn(
            check, inst.node, inst.name,
            f"storage prefetches failing: {unfulfilled / hits:.0%} of {_n(hits)} storage-hit tokens never became "
            f"usable ({', '.join(f'{r} {_n(reasons[r])}' for r in top)})",
            details=details, remedy=why))  # fmt: skip
    elif not out:
        where = f"{attached} attached" if attached else f"{expected} (runtime state not read)"
        share = f", {unfulfilled / hits:.0%} unfulfilled" if hits else ""
        out.append(Finding.ok(check, inst.node, inst.name,
                              f"storage {where}; {_n(hits)} storage-hit tokens{share}{unread_note}", details=details))
    return out
