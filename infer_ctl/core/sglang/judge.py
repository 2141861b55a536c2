"""Judging live servers against the profile: drift, P/D agreement, queues, bootstrap reachability.

Pure: inputs are the instance, what the profile renders for it, and the JSON a server returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.sglang.consistency import effective_args
from infer_ctl.core.sglang.instance import Instance
from infer_ctl.core.spec.pools import decode_steps_may_differ

#: /server_info keys compared with the profile: a canonical flag's name with dashes as underscores
DRIFT_KEYS = (
    "model_path",
    "served_model_name",
    "tp_size",
    "dp_size",
    "port",
    "context_length",
    "mem_fraction_static",
    "disaggregation_mode",
    "disaggregation_transfer_backend",
    "disaggregation_bootstrap_port",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "radix_eviction_policy",
)
PD_KEYS = (
    "model_path",
    "disaggregation_transfer_backend",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)
_SGLANG_DEFAULTS = {"disaggregation_mode": "null", "radix_eviction_policy": "lru"}


def expected_server_args(instance: Instance, argv: list[str]) -> dict[str, str]:
    """What /server_info should report, as strings, from the effective command line."""
    args = effective_args(argv)
    out: dict[str, str] = {}
    for key in DRIFT_KEYS:
        flag = "--" + key.replace("_", "-")
        if flag in args and args[flag] is not None:
            out[key] = str(args[flag])
        elif key in _SGLANG_DEFAULTS:
            out[key] = _SGLANG_DEFAULTS[key]
    if instance.role != "prefill":
        out.pop("disaggregation_bootstrap_port", None)  # only the prefill's is a served port
    return {k: normalise(k, v) for k, v in out.items()}


def normalise(key: str, value: Any) -> str:
    text = "None" if value is None else str(value)
    if key == "speculative_algorithm":
        text = text.upper()
        return "EAGLE" if text == "NEXTN" else text  # SGLang resolves the NEXTN alias to EAGLE
    if key == "disaggregation_transfer_backend" and text == "mooncake_tcp":
        return "mooncake"  # SGLang rewrites mooncake_tcp to mooncake + MC_FORCE_TCP
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return text


def judge_drift(instance: Instance, expected: Mapping[str, str], info: Mapping[str, Any]) -> list[Finding]:
    diffs = {
        key: (want, normalise(key, info[key]))
        for key, want in expected.items()
        if key in info and normalise(key, info[key]) != want
    }
    if not diffs:
        return [
            Finding.ok(
                "servers.drift",
                instance.node,
                instance.name,
                f"running settings match the profile ({len([k for k in expected if k in info])} compared)",
            )
        ]
    return [
        Finding.fail(
            "servers.drift",
            instance.node,
            instance.name,
            f"{key} is {got} but the profile says {want}",
            details={"setting": key, "expected": want, "actual": got},
            remedy=f"run `inferctl launch --nodes {instance.node}` to restart it with the profile's settings, "
            "or update the profile to what runs",
        )
        for key, (want, got) in diffs.items()
    ]


def judge_pd_agreement(infos: Mapping[Instance, Mapping[str, Any]]) -> list[Finding]:
    """Every decode agrees with the first prefill on model, transfer backend and speculative settings."""
    prefills = [i for i in infos if i.role == "prefill"]
    if not prefills:
        return []
    ref = prefills[0]
    out: list[Finding] = []
    for inst, info in infos.items():
        if inst is ref or inst.role not in ("prefill", "decode"):
            continue
        # a decode pool may run its own step count (speculative.pools; core/spec/pools.py says why)
        own_steps = inst.role == "decode" and decode_steps_may_differ({
            "--speculative-algorithm": str(info.get("speculative_algorithm") or ""),
            "--speculative-eagle-topk": None if info.get("speculative_eagle_topk") is None
            else str(info.get("speculative_eagle_topk"))})
        bad = [
            (k, normalise(k, infos[ref].get(k)), normalise(k, info.get(k)))
            for k in PD_KEYS
            if k in info and k in infos[ref] and normalise(k, info[k]) != normalise(k, infos[ref][k])
            and not (own_steps and k in ("speculative_num_steps", "speculative_num_draft_tokens"))
        ]
        for key, want, got in bad:
            out.append(
                Finding.fail(
                    "servers.pd_agreement",
                    inst.node,
                    inst.name,
                    f"{key} is {got} here but {want} on prefill {ref.name}; KV transfers between them fail",
                    details={"setting": key, "reference": ref.name, "expected": want, "actual": got},
                    remedy="relaunch both roles from one profile (`inferctl launch`)",
                )
            )
        if not bad:
            out.append(Finding.ok("servers.pd_agreement", inst.node, inst.name, f"agrees with {ref.name}"))
    return out


def judge_loads(instance: Instance, doc: Mapping[str, Any]) -> list[Finding]:
    """A queue with work waiting while nothing runs and nothing is generated is stuck."""
    out: list[Finding] = []
    for load in doc.get("loads") or []:
        rank = load.get("dp_rank", 0)
        waiting = int(load.get("num_waiting_reqs") or 0)
        running = int(load.get("num_running_reqs") or 0)
        dis = load.get("disaggregation") or {}
        pd_queued = sum(
            int(dis.get(k) or 0)
            for k in (
                "prefill_bootstrap_queue_reqs",
                "decode_prealloc_queue_reqs",
                "decode_transfer_queue_reqs",
            )
        )
        throughput = float(load.get("gen_throughput") or 0.0)
        if (waiting or pd_queued) and not running and throughput == 0.0:
            out.append(
                Finding.warn(
                    "servers.queues",
                    instance.node,
                    f"{instance.name}/dp{rank}",
                    f"{waiting} waiting and {pd_queued} in PD queues but nothing running",
                    details={"waiting": waiting, "pd_queued": pd_queued, "running": running},
                    remedy="check the peer role's health and the KV transfer path (`inferctl check fabric`); "
                    "see `inferctl logs`",
                )
            )
    if not out:
        out.append(Finding.ok("servers.queues", instance.node, instance.name, "no stuck queues"))
    return out


def judge_bootstrap(decode: Instance, prefill: Instance, rc: int | None) -> Finding:
    subject = f"{decode.node}->{prefill.node}:{prefill.bootstrap_port}"
    if rc == 0:
        return Finding.ok("servers.bootstrap", decode.node, subject, "bootstrap port reachable")
    if rc in (None, 127):
        return Finding.unknown(
            "servers.bootstrap",
            decode.node,
            subject,
            "could not test: no bash, python3 or nc on the decode node",
            remedy="install bash or python3 on the node",
        )
    return Finding.fail(
        "servers.bootstrap",
        decode.node,
        subject,
        f"cannot connect to {prefill.host}:{prefill.bootstrap_port} (prefill {prefill.name}'s bootstrap server)",
        remedy="check that the prefill runs and binds a routable --host, and that firewalls allow the port",
    )
