"""Judging live servers against the profile: drift, P/D agreement, queues, bootstrap reachability.

Pure: inputs are the instance, what the profile renders for it, and the JSON a server returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.sglang.argv import server_args
from infer_ctl.core.sglang.instance import Instance
from infer_ctl.core.sglang.settings import canonical_value, command_settings, dest
from infer_ctl.core.spec.pools import decode_steps_may_differ

#: settings prefill and decode must agree on, by their /server_info keys
PD_KEYS = (
    "model_path",
    "disaggregation_transfer_backend",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)
#: SGLang's defaults of settings the profile leaves unset but whose running value still matters
_SGLANG_DEFAULTS = {"disaggregation_mode": "null", "radix_eviction_policy": "lru"}


def expected_server_args(instance: Instance, argv: list[str]) -> dict[str, str]:
    """What /server_info should report, as canonical text, for EVERY flag of the effective command line
    (keys are ServerArgs fields: `--tp-size` -> `tp_size`), with SGLang's resolution of them applied
    where it rewrites what it was given: `canonical_value`'s aliases, and num_draft_tokens =
    num_steps + 1 when eagle_topk is 1 (`_handle_eagle_family`)."""
    settings = command_settings(server_args(argv))
    out = {dest(flag): canonical_value(dest(flag), value) for flag, value in settings.items() if flag.startswith("--")}
    for key, default in _SGLANG_DEFAULTS.items():
        out.setdefault(key, default)
    if out.get("speculative_eagle_topk") == "1" and str(out.get("speculative_num_steps", "")).isdigit():
        out["speculative_num_draft_tokens"] = str(int(out["speculative_num_steps"]) + 1)
    if instance.role != "prefill":
        out.pop("disaggregation_bootstrap_port", None)  # only the prefill's is a served port
    if settings.get("--disaggregation-transfer-backend") == "mooncake_tcp":
        out.pop("disaggregation_ib_device", None)  # SGLang clears it for TCP
    return out


def normalise(key: str, value: Any) -> str:
    return canonical_value(key, value)


def _drift_fail(instance: Instance, key: str, want: str | None, got: str | None, source: str) -> Finding:
    if want is None:
        message = f"{key} is {got} on the running server but the profile does not set it"
    elif got is None:
        message = f"{key} is not set on the running server but the profile says {want}"
    else:
        message = f"{key} is {got} but the profile says {want}"
    return Finding.fail(
        "servers.drift",
        instance.node,
        instance.name,
        message,
        details={"setting": key, "expected": want, "actual": got, "source": source},
        remedy=f"run `inferctl launch --nodes {instance.node}` to restart it with the profile's settings, "
        "or update the profile to what runs",
    )


def judge_drift(
    instance: Instance,
    expected: Mapping[str, str],
    info: Mapping[str, Any],
    *,
    launch_args: list[str] | None = None,
) -> list[Finding]:
    """Every setting of the running server against the profile. SGLang 0.5.23's /server_info carries
    `launch_command`, the server arguments as given (space-joined; sglang/srt/entrypoints/
    http_server.py `server_info`): with `launch_args` (the profile's server arguments) the two command
    lines are compared flag by flag, including flags only one side sets. Without it (an older server)
    each flag of the profile's command line is compared with the resolved value /server_info reports for
    it; a flag it does not report is left out."""
    launched = info.get("launch_command")
    # SGLang's is its server arguments (`--model-path ...`); a simulated worker names its own command
    if launch_args is not None and isinstance(launched, str) and launched.startswith("-"):
        # split both the same way: SGLang joined its argv with spaces, so a value holding one is split there too
        want = command_settings(" ".join(launch_args).split(" "))
        got = command_settings(launched.split(" "))
        keys = [*want, *(f for f in got if f not in want)]
        diffs = [
            (dest(f) if f.startswith("--") else f, want.get(f), got.get(f))
            for f in keys
            if canonical_value(dest(f), want.get(f)) != canonical_value(dest(f), got.get(f))
        ]
        compared, source = len(keys), "launch_command"
    else:
        reported = [k for k in expected if k in info]
        diffs = [(k, expected[k], canonical_value(k, info[k])) for k in reported
                 if canonical_value(k, info[k]) != expected[k]]  # fmt: skip
        compared, source = len(reported), "server_args"
    if not diffs:
        return [
            Finding.ok(
                "servers.drift",
                instance.node,
                instance.name,
                f"running settings match the profile ({compared} compared, from /server_info {source})",
            )
        ]
    return [_drift_fail(instance, key, want, got, source) for key, want, got in diffs]


def judge_env_drift(instance: Instance, rendered: Mapping[str, str], running: Mapping[str, str]) -> list[Finding]:
    """The environment of the running server (its /proc/PID/environ) against the env file the profile
    renders for it now (MC_GID_INDEX, NCCL_*, CUDA_VISIBLE_DEVICES, ...): one FAIL per variable."""
    return [
        _drift_fail(instance, f"env {name}", want, running.get(name), "environ")
        for name, want in rendered.items()
        if running.get(name) != want
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
