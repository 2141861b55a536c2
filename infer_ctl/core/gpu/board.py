"""Board-level GPU rules that used to pass silently: NVSwitch fabric registration, the power limit, HBM
temperature, the InfoROM and the VBIOS of a node's GPUs. Pure; anchors in docs/reference/gpu-thresholds.md.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.gpu.facts import GpuFacts, NodeGpuFacts
from infer_ctl.profile.gpu import GpuPolicy

#: a fabric still "In Progress" this long after boot is stuck, not settling (fabric manager trains the
#: NVSwitch fabric within a minute or two of the driver loading)
FABRIC_SETTLE_S = 600.0
FABRIC_MANAGER = "`systemctl status nvidia-fabricmanager` and `journalctl -u nvidia-fabricmanager`"


def judge_fabric(node: str, facts: NodeGpuFacts) -> list[Finding]:
    """gpu.fabric: DCGM's health watch (DcgmHealthWatch.cpp MonitorFabricFields, DcgmFMStatus*): In Progress WARN, Not Started and
    a failed registration FAIL. Until the fabric manager finishes, CUDA fails to initialise on an NVSwitch
    system, so a node stuck In Progress long after boot is a FAIL too. GPUs without a fabric say nothing."""
    out = []
    uptime = (facts.gathered_at - facts.boot_time) if facts.gathered_at and facts.boot_time else None
    for gpu in facts.gpus:
        state, status = gpu.fabric_state, gpu.fabric_status
        if state is None:
            continue
        details = {"state": state, "status": status, "uptime_s": None if uptime is None else round(uptime)}
        if state == "completed" and status in (None, "success"):
            out.append(Finding.ok("gpu.fabric", node, gpu.subject, "NVSwitch fabric registration completed", details=details))
        elif state == "completed":
            out.append(Finding.fail("gpu.fabric", node, gpu.subject, f"NVSwitch fabric registration failed: {status}",
                                    details=details, remedy=f"CUDA cannot use this GPU's NVLink fabric: check {FABRIC_MANAGER}; "
                                    "restart the fabric manager, reboot the node if it fails again"))
        elif state == "in_progress" and (uptime is None or uptime < FABRIC_SETTLE_S):
            out.append(Finding.warn("gpu.fabric", node, gpu.subject,
                                    "NVSwitch fabric registration in progress: CUDA fails on this GPU until it completes",
                                    details=details, remedy=f"wait for the fabric manager to finish (minutes after boot); "
                                    f"if it stays In Progress, check {FABRIC_MANAGER}"))
        else:
            stuck = "stuck in progress" if state == "in_progress" else state.replace("_", " ")
            out.append(Finding.fail("gpu.fabric", node, gpu.subject,
                                    f"NVSwitch fabric registration {stuck}: CUDA cannot initialise on this GPU",
                                    details=details, remedy=f"start/restart the fabric manager (`systemctl enable --now "
                                    f"nvidia-fabricmanager`, its version must match the driver); check {FABRIC_MANAGER}"))
    return out


def judge_power_limit(node: str, gpu: GpuFacts, policy: GpuPolicy) -> Finding | None:
    """gpu.power_limit: an enforced limit below the board's default (`nvidia-smi -pl`, a BMC or site cap)
    silently costs throughput; gpud and DCGM only report the limit, so the floor is the profile's
    `min_power_limit_fraction` of the default (1.0: any lowering)."""
    limit, default = gpu.power_limit_w, gpu.default_power_limit_w
    if limit is None or not default:
        return None
    details = {"limit_w": limit, "default_w": default, "min_fraction": policy.min_power_limit_fraction}
    floor = default * policy.min_power_limit_fraction
    if limit < floor - 0.5:  # the limits are reported to the centiwatt; ignore rounding
        return Finding.warn(
            "gpu.power_limit", node, gpu.subject, f"power limit {limit:g} W, below the default {default:g} W",
            details=details,
            remedy=f"restore it with `nvidia-smi -i {gpu.index} -pl {default:g}` (and find what lowered it: a site "
            "script, the BMC, `nvidia-smi -pl` in a unit); if the cap is deliberate, lower "
            "`gpu.min_power_limit_fraction`",
        )
    return Finding.ok("gpu.power_limit", node, gpu.subject, f"power limit {limit:g} W (default {default:g} W)",
                      details=details)


def judge_memory_temp(node: str, gpu: GpuFacts, policy: GpuPolicy) -> Finding | None:
    """gpu.memory_temp: HBM temperature against the GPU's own memory limit (NVML threshold MEM_MAX; DCGM's
    diag fails above it, gpud marks it degraded), or the profile's `max_memory_temp_c` where the driver
    reports no absolute limit (nvidia-smi v13 gives a T.Limit margin only)."""
    temp = gpu.mem_temp_c
    if temp is None:
        return None
    limit = gpu.mem_max_temp_c or policy.max_memory_temp_c
    source = "the GPU's limit" if gpu.mem_max_temp_c else "the profile's gpu.max_memory_temp_c"
    details = {"memory_temp_c": temp, "limit_c": limit, "limit_from": "gpu" if gpu.mem_max_temp_c else "profile"}
    cooling = ("HBM runs hot before the core does: check airflow over the GPU baseboard and the fans; the GPU "
               "throttles memory and may raise XID 48/63 at the limit")
    if temp >= limit:
        return Finding.fail("gpu.memory_temp", node, gpu.subject, f"HBM at {temp} C, at or above {source} ({limit} C)",
                            details=details, remedy=f"drain the node; {cooling}")
    if temp >= limit - policy.slowdown_margin_c:
        return Finding.warn("gpu.memory_temp", node, gpu.subject, f"HBM at {temp} C, {limit - temp} C below {source} ({limit} C)",
                            details=details, remedy=cooling)
    return Finding.ok("gpu.memory_temp", node, gpu.subject, f"HBM {temp} C (limit {limit} C)", details=details)


def judge_inforom(node: str, gpu: GpuFacts) -> Finding | None:
    """gpu.inforom: DCGM's InfoROM health watch (DCGM_FR_CORRUPT_INFOROM, a WARN): the InfoROM holds the
    ECC counts and retired-page/row-remap records; when its checksum fails they are not trustworthy."""
    if gpu.inforom_valid is None:
        return None
    if gpu.inforom_valid:
        return Finding.ok("gpu.inforom", node, gpu.subject, "InfoROM valid")
    return Finding.warn(
        "gpu.inforom", node, gpu.subject, "InfoROM corrupted (checksum validation failed)",
        details={"inforom_valid": False},
        remedy="the GPU may still work, but its ECC and retired-page records are not reliable: plan a reflash "
        f"or RMA with the vendor (`nvidia-smi -q -i {gpu.index}` shows the InfoROM versions)",
    )


def _ranges(indices: list[int]) -> str:
    return ", ".join(f"GPU{i}" for i in sorted(indices))


def judge_vbios(node: str, facts: NodeGpuFacts) -> list[Finding]:
    """gpu.vbios: GPUs of one model in one node should run one VBIOS (Meta's GCM check_vbios_mismatch):
    a mixed baseboard is a half-applied firmware update, and bugs become GPU-specific."""
    by_model: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for gpu in facts.gpus:
        if gpu.vbios_version:
            by_model[gpu.name or "GPU"][gpu.vbios_version].append(gpu.index)
    out = []
    for model, versions in sorted(by_model.items()):
        details: dict[str, Any] = {"model": model, "versions": {v: sorted(i) for v, i in versions.items()}}
        if len(versions) == 1:
            (version,) = versions
            out.append(Finding.ok("gpu.vbios", node, "node", f"VBIOS {version} on every {model}", details=details))
            continue
        listing = "; ".join(f"{v} on {_ranges(i)}" for v, i in sorted(versions.items()))
        out.append(Finding.warn(
            "gpu.vbios", node, "node", f"{model} GPUs run {len(versions)} VBIOS versions: {listing}", details=details,
            remedy="finish the firmware update on this node (the vendor's GPU firmware bundle, e.g. nvfwupd) so every "
            "GPU runs the same VBIOS, then reboot",
        ))
    return out


def node_vbios(facts: NodeGpuFacts) -> dict[str, str]:
    """{model: VBIOS} of a node whose GPUs of each model agree (a mixed node is gpu.vbios's finding)."""
    seen: dict[str, set[str]] = defaultdict(set)
    for gpu in facts.gpus:
        if gpu.vbios_version:
            seen[gpu.name or "GPU"].add(gpu.vbios_version)
    return {model: next(iter(v)) for model, v in seen.items() if len(v) == 1}
