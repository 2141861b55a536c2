"""GPU health rules: pure functions from `NodeGpuFacts` + `GpuPolicy` to findings.

One rule, one stable check id, and the remedy travels with the finding. XIDs and SXids (the kernel
log) are judged in core/gpu/xids.py. Thresholds follow DCGM health
watches (NVIDIA's own PASS/WARN/FAIL), with gpud/aznhc where DCGM is silent; the anchors and their
versions are in docs/reference/gpu-thresholds.md.
A rule whose fact was not reported (None: old driver, `N/A`, unsupported GPU) says nothing rather
than guessing; a node whose GPUs could not be read at all gets one UNKNOWN (or FAIL) `gpu.driver`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.gpu.board import (
    judge_fabric,
    judge_inforom,
    judge_memory_temp,
    judge_power_limit,
    judge_vbios,
    node_vbios,
)
from infer_ctl.core.gpu.facts import GpuFacts, NodeGpuFacts
from infer_ctl.core.gpu.fleet import judge_driver_consistency, judge_vbios_consistency
from infer_ctl.core.gpu.nvlink_rate import judge_nvlink_rate
from infer_ctl.core.gpu.replay import judge_pcie_replay
from infer_ctl.core.gpu.xids import RMA, judge_sxids, judge_xids, xid_rule
from infer_ctl.profile.gpu import GpuPolicy

HW_SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
# DCGM: uncorrectable row remaps >= 512 is a WARN (Ampere+); retired pages SBE+DBE >= 63 is a FAIL.
ROW_REMAP_UNC_WARN = 512
WARNING_RECOVERY = {"drain_p2p", "recover_imex_domain"}


# ---- node-level ------------------------------------------------------------------------------------
def judge_gather_error(node: str, facts: NodeGpuFacts, expected: int) -> list[Finding]:
    """The node's GPUs could not be read at all."""
    if facts.error is None:
        return []
    # no GPU was read: every per-GPU rule of this node went unchecked (the kernel log is read apart and
    # judged by gpu.xid/gpu.sxid, which say UNKNOWN themselves when it was not read)
    details = {"error_kind": facts.error_kind, "source": facts.source,
               "not_gathered": ["gpu.*", "!gpu.xid", "!gpu.sxid", "!gpu.driver"]}
    kind = facts.error_kind
    if kind == "no_driver":
        if expected == 0:
            return [Finding.skip("gpu.driver", node, "node", "no NVIDIA driver and no GPUs expected")]
        return [
            Finding.unknown(
                "gpu.driver",
                node,
                "node",
                f"no NVIDIA driver: {facts.error}",
                details=details,
                remedy="install the NVIDIA driver (provision the node), or set `gpus: 0` for a node "
                "without GPUs; check with `nvidia-smi` on the node",
            )
        ]
    if kind == "driver_not_loaded":
        # gpud and DCGM call this node unhealthy: the profile says it has GPUs and none can serve. The
        # common cause is a kernel upgrade the module was not built for (DKMS did not run or failed).
        if expected == 0:
            return [Finding.unknown(
                "gpu.driver", node, "node", f"{facts.error}; the profile declares no GPUs on this node",
                details=details,
                remedy="if the node has GPUs, set `gpus:` to their count and load the driver; if not, remove "
                "the NVIDIA driver packages",
            )]  # fmt: skip
        return [Finding.fail(
            "gpu.driver", node, "node", f"{facts.error}; the profile expects {expected} GPUs here",
            details=details,
            remedy="drain the node; the module is usually not built for the running kernel after a kernel "
            "upgrade: check `lsmod | grep nvidia`, `dmesg | grep -i -e nvrm -e nvidia` and `dkms status` "
            "against `uname -r`, then `sudo dkms autoinstall && sudo modprobe nvidia` (or reinstall the "
            "driver for this kernel), or reboot into the kernel the module was built for",
        )]  # fmt: skip
    if kind == "driver_mismatch":
        return [
            Finding.fail(
                "gpu.driver",
                node,
                "node",
                facts.error,
                details=details,
                remedy="the loaded kernel module and the user-space driver differ (usually after a driver "
                "upgrade): drain the node and reboot it",
            )
        ]
    if kind == "hardware":
        return [
            Finding.fail(
                "gpu.driver",
                node,
                "node",
                facts.error,
                details=details,
                remedy=f"run `nvidia-smi` and `dmesg | grep NVRM` on the node to find the GPU; {RMA} if it persists",
            )
        ]
    if kind == "no_permission":
        remedy = "give the SSH user access to /dev/nvidia* (video group) or enable `ssh.sudo`"
    elif kind == "hung":
        remedy = ("nvidia-smi hangs when the driver or a GPU is wedged: look at `gpu.xid` for this node, then "
                  "drain and reboot it; raise `gpu.timeout_s` only if the node is merely slow")
    else:
        remedy = "run `nvidia-smi -q -x` on the node to see the error; rerun the check with --json for details"
    return [Finding.unknown("gpu.driver", node, "node", facts.error, details=details, remedy=remedy)]


def judge_count(node: str, facts: NodeGpuFacts, expected: int) -> Finding:
    count = facts.gpu_count if facts.gpu_count is not None else len(facts.gpus)
    details = {"found": count, "expected": expected}
    if count == expected:
        return Finding.ok("gpu.count", node, "node", f"{count} GPUs", details=details)
    return Finding.fail(
        "gpu.count",
        node,
        "node",
        f"{count} GPUs found, {expected} expected",
        details=details,
        remedy="compare `nvidia-smi -L` with `lspci | grep -i nvidia`: a GPU missing from the driver usually "
        f"fell off the bus (XID 79); reseat it or {RMA}. If the profile is wrong, fix `gpus`/`gpu.expected_count`",
    )


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def judge_driver(node: str, facts: NodeGpuFacts, policy: GpuPolicy) -> Finding:
    driver, cuda = facts.driver_version, facts.cuda_version
    details = {"driver_version": driver, "cuda_version": cuda, "source": facts.source}
    if driver is None:
        return Finding.unknown(
            "gpu.driver", node, "node", "driver version not reported", details=details,
            remedy="run `nvidia-smi` on the node; the driver may be half-installed",
        )
    upgrade = "install the profile's driver version on this node (provision), then reboot it"
    if policy.driver_version and driver != policy.driver_version:
        return Finding.fail(
            "gpu.driver", node, "node", f"driver {driver}, profile requires {policy.driver_version}",
            details=details, remedy=upgrade,
        )
    if policy.min_driver_version and _version_tuple(driver) < _version_tuple(policy.min_driver_version):
        return Finding.fail(
            "gpu.driver", node, "node", f"driver {driver} is older than the minimum {policy.min_driver_version}",
            details=details, remedy=upgrade,
        )
    if policy.cuda_version and cuda and cuda != policy.cuda_version:
        return Finding.warn(
            "gpu.driver", node, "node", f"driver supports CUDA {cuda}, profile expects {policy.cuda_version}",
            details=details, remedy=upgrade,
        )
    return Finding.ok("gpu.driver", node, "node", f"driver {driver}, CUDA {cuda or '?'}", details=details)


# ---- per GPU ---------------------------------------------------------------------------------------
def judge_nvml_errors(node: str, gpu: GpuFacts) -> Finding | None:
    if not gpu.errors:
        return None
    text = "; ".join(gpu.errors)
    lost = any("lost" in e.lower() for e in gpu.errors)
    reset = any("reset" in e.lower() or "restart" in e.lower() for e in gpu.errors)
    if lost:
        remedy = f"the GPU is gone from the driver: drain the node and reboot it; if it stays lost, reseat or {RMA}"
    elif reset:
        remedy = f"drain the GPU, then `nvidia-smi -r -i {gpu.index}` (or reboot the node)"
    else:
        remedy = f"run `nvidia-smi -q -i {gpu.index}` on the node to see which query fails"
    status = Finding.fail if (lost or reset) else Finding.warn
    return status("gpu.nvml", node, gpu.subject, f"NVML error: {text}", details={"errors": list(gpu.errors)}, remedy=remedy)


def judge_persistence(node: str, gpu: GpuFacts, policy: GpuPolicy) -> Finding | None:
    if gpu.persistence_mode is None or not policy.require_persistence:
        return None
    if gpu.persistence_mode:
        return Finding.ok("gpu.persistence", node, gpu.subject, "persistence mode enabled")
    return Finding.warn(
        "gpu.persistence", node, gpu.subject, "persistence mode disabled",
        remedy="`systemctl enable --now nvidia-persistenced` (or `nvidia-smi -pm 1`): without it the driver "
        "tears down and re-initialises the GPU between jobs",
    )


def judge_ecc_mode(node: str, gpu: GpuFacts, policy: GpuPolicy) -> Finding | None:
    if gpu.ecc_current is None:
        return None
    details = {"current": gpu.ecc_current, "pending": gpu.ecc_pending}
    if gpu.ecc_pending is not None and gpu.ecc_pending != gpu.ecc_current:
        return Finding.warn(
            "gpu.ecc_mode", node, gpu.subject,
            f"ECC mode change pending ({'on' if gpu.ecc_pending else 'off'} after reset)", details=details,
            remedy=f"drain the GPU and reset it (`nvidia-smi -r -i {gpu.index}`) or reboot to apply the ECC mode",
        )
    if policy.require_ecc and not gpu.ecc_current:
        return Finding.warn(
            "gpu.ecc_mode", node, gpu.subject, "ECC is disabled", details=details,
            remedy=f"`nvidia-smi -i {gpu.index} -e 1` then reset the GPU; or set `gpu.require_ecc: false`",
        )
    return Finding.ok("gpu.ecc_mode", node, gpu.subject, "ECC enabled" if gpu.ecc_current else "ECC disabled",
                      details=details)


def judge_ecc_errors(node: str, gpu: GpuFacts) -> Finding | None:
    vol, agg = gpu.ecc_volatile_uncorrected, gpu.ecc_aggregate_uncorrected
    if vol is None and agg is None and gpu.sram_threshold_exceeded is None:
        return None
    details = {
        "volatile_uncorrected": vol,
        "aggregate_uncorrected": agg,
        "volatile_corrected": gpu.ecc_volatile_corrected,
        "aggregate_corrected": gpu.ecc_aggregate_corrected,
        "sram_threshold_exceeded": gpu.sram_threshold_exceeded,
    }
    if vol:
        return Finding.fail(
            "gpu.ecc_errors", node, gpu.subject, f"{vol} uncorrectable ECC errors since the last reset",
            details=details,
            remedy="drain the node: the GPU hit double-bit errors (XID 48). Reset it to trigger row remapping; "
            f"if errors return, {RMA}",
        )
    if gpu.sram_threshold_exceeded:
        return Finding.fail(
            "gpu.ecc_errors", node, gpu.subject, "SRAM ECC error threshold exceeded", details=details, remedy=RMA,
        )
    if agg:
        return Finding.warn(
            "gpu.ecc_errors", node, gpu.subject, f"{agg} uncorrectable ECC errors over the GPU's lifetime",
            details=details,
            remedy="none since the last reset; watch `gpu.row_remap`/`gpu.retired_pages` and the trend of this count",
        )
    return Finding.ok("gpu.ecc_errors", node, gpu.subject, "no uncorrectable ECC errors", details=details)


def judge_row_remap(node: str, gpu: GpuFacts) -> Finding | None:
    if gpu.remap_failure is None and gpu.remap_pending is None:
        return None
    details = {
        "correctable": gpu.remap_correctable,
        "uncorrectable": gpu.remap_uncorrectable,
        "pending": gpu.remap_pending,
        "failure": gpu.remap_failure,
    }
    if gpu.remap_failure:
        return Finding.fail(
            "gpu.row_remap", node, gpu.subject, "row remapping failed", details=details,
            remedy=f"the GPU cannot remap more rows: {RMA}",
        )
    if gpu.remap_pending:
        return Finding.fail(
            "gpu.row_remap", node, gpu.subject, "row remap pending", details=details,
            remedy=f"drain the node, then reset the GPU (`nvidia-smi -r -i {gpu.index}`) or reboot to apply the remap",
        )
    if (gpu.remap_uncorrectable or 0) >= ROW_REMAP_UNC_WARN:
        return Finding.warn(
            "gpu.row_remap", node, gpu.subject, f"{gpu.remap_uncorrectable} rows remapped for uncorrectable errors",
            details=details, remedy=f"the GPU's spare rows are running out; plan an RMA ({RMA})",
        )
    return Finding.ok("gpu.row_remap", node, gpu.subject, "no pending or failed row remaps", details=details)


def judge_retired_pages(node: str, gpu: GpuFacts, policy: GpuPolicy) -> Finding | None:
    if gpu.retired_sbe is None and gpu.retired_dbe is None and gpu.retired_pending is None:
        return None
    total = (gpu.retired_sbe or 0) + (gpu.retired_dbe or 0)
    details = {"sbe": gpu.retired_sbe, "dbe": gpu.retired_dbe, "pending": gpu.retired_pending}
    if total >= policy.max_retired_pages:
        return Finding.fail(
            "gpu.retired_pages", node, gpu.subject,
            f"{total} retired pages (limit {policy.max_retired_pages})", details=details, remedy=RMA,
        )
    if gpu.retired_pending:
        return Finding.warn(
            "gpu.retired_pages", node, gpu.subject, "page retirement pending", details=details,
            remedy=f"drain the node and reset the GPU (`nvidia-smi -r -i {gpu.index}`) or reboot to retire the pages",
        )
    return Finding.ok("gpu.retired_pages", node, gpu.subject, f"{total} retired pages", details=details)


def judge_recovery_action(node: str, gpu: GpuFacts) -> Finding | None:
    action = gpu.recovery_action
    if action is None:
        return None
    details = {"recovery_action": action}
    if action == "none":
        return Finding.ok("gpu.recovery_action", node, gpu.subject, "no recovery action pending", details=details)
    if action in WARNING_RECOVERY:
        return Finding.warn(
            "gpu.recovery_action", node, gpu.subject, f"driver requests recovery action {action}", details=details,
            remedy="drain peer-to-peer traffic from this GPU (stop the servers on this node) and reset it",
        )
    what = {
        "gpu_reset": f"drain the node and reset the GPU (`nvidia-smi -r -i {gpu.index}`)",
        "node_reboot": "drain the node and reboot it",
        "system_reboot": "drain the node and reboot it",
        "drain_and_reset": f"drain the node, then reset the GPU (`nvidia-smi -r -i {gpu.index}`)",
        "bus_reset": "drain the node and reboot it (the GPU needs a PCIe bus reset)",
    }.get(action, "drain the node and follow NVIDIA's XID catalog for this action")
    return Finding.fail(
        "gpu.recovery_action", node, gpu.subject,
        f"driver requests recovery action {action} (persists from a past XID)", details=details, remedy=what,
    )


def judge_temperature(node: str, gpu: GpuFacts, policy: GpuPolicy) -> Finding | None:
    if gpu.temp_c is None and gpu.tlimit_margin_c is None:
        return None
    details: dict[str, Any] = {
        "temp_c": gpu.temp_c,
        "memory_temp_c": gpu.mem_temp_c,
        "slowdown_temp_c": gpu.slowdown_temp_c,
        "tlimit_margin_c": gpu.tlimit_margin_c,
        "tlimit_slowdown_c": gpu.tlimit_slowdown_c,
        "max_temp_c": policy.max_temp_c,
    }
    cooling = "check airflow, fans and inlet temperature of the node; drain it if clocks are being cut"
    # headroom: degrees left before the GPU's own slowdown threshold
    headroom: int | None = None
    if gpu.tlimit_margin_c is not None and gpu.tlimit_slowdown_c is not None:
        headroom = gpu.tlimit_margin_c - gpu.tlimit_slowdown_c
    elif gpu.temp_c is not None and gpu.slowdown_temp_c is not None:
        headroom = gpu.slowdown_temp_c - gpu.temp_c
    details["headroom_c"] = headroom
    shown = f"{gpu.temp_c} C" if gpu.temp_c is not None else f"T.Limit margin {gpu.tlimit_margin_c} C"
    if headroom is not None and headroom <= 0:
        return Finding.fail("gpu.temperature", node, gpu.subject, f"{shown}: at the slowdown threshold",
                            details=details, remedy=cooling)
    if gpu.temp_c is not None and gpu.temp_c > policy.max_temp_c:
        return Finding.warn("gpu.temperature", node, gpu.subject, f"{shown} above the profile limit "
                            f"{policy.max_temp_c} C", details=details, remedy=cooling)
    if headroom is not None and headroom <= policy.slowdown_margin_c:
        return Finding.warn("gpu.temperature", node, gpu.subject, f"{shown}: {headroom} C from slowdown",
                            details=details, remedy=cooling)
    return Finding.ok("gpu.temperature", node, gpu.subject, shown, details=details)


def judge_throttle(node: str, gpu: GpuFacts) -> Finding | None:
    if gpu.clock_reasons is None:
        return None
    hw = sorted(r for r in gpu.clock_reasons if r in HW_SLOWDOWN_REASONS)
    details = {"active": sorted(gpu.clock_reasons)}
    if hw:
        return Finding.warn(
            "gpu.throttle", node, gpu.subject, f"hardware clock slowdown active: {', '.join(hw)}", details=details,
            remedy="thermal/power-brake slowdown: check cooling and PSUs/power cables; hw_slowdown alone "
            "often means an external power-brake signal from the chassis BMC",
        )
    return Finding.ok("gpu.throttle", node, gpu.subject, "no hardware slowdown", details=details)


def judge_pcie(node: str, gpu: GpuFacts, policy: GpuPolicy) -> Finding | None:
    width, max_width = gpu.pcie_width_current, policy.expected_pcie_width or gpu.pcie_width_max
    if width is None or max_width is None:
        return None
    details = {
        "width": width,
        "max_width": gpu.pcie_width_max,
        "expected_width": policy.expected_pcie_width,
        "gen": gpu.pcie_gen_current,
        "max_gen": gpu.pcie_gen_max,
        "utilization_pct": gpu.utilization_pct,
        "replays": gpu.pcie_replays,
    }
    if width < max_width:
        return Finding.fail(
            "gpu.pcie", node, gpu.subject, f"PCIe link x{width}, expected x{max_width}", details=details,
            remedy="the link trained narrower than the slot: reseat the GPU/riser and check the slot; if the "
            "platform wires GPUs narrower, set `gpu.expected_pcie_width`",
        )
    loaded = gpu.utilization_pct is not None and gpu.utilization_pct >= policy.pcie_gen_load_pct
    if loaded and gpu.pcie_gen_current and gpu.pcie_gen_max and gpu.pcie_gen_current < gpu.pcie_gen_max:
        return Finding.warn(
            "gpu.pcie", node, gpu.subject,
            f"PCIe Gen{gpu.pcie_gen_current} under load, GPU supports Gen{gpu.pcie_gen_max}", details=details,
            remedy="check BIOS PCIe speed settings and the riser/retimer; the generation should be max under load",
        )
    gen = f" Gen{gpu.pcie_gen_current}" if gpu.pcie_gen_current else ""
    note = "" if loaded else " (generation not judged at idle)"
    return Finding.ok("gpu.pcie", node, gpu.subject, f"PCIe x{width}{gen}{note}", details=details)


def judge_nvlink(node: str, gpu: GpuFacts, policy: GpuPolicy) -> Finding | None:
    if gpu.nvlinks is None and gpu.nvlink_note is None:
        return None
    note = gpu.nvlink_note
    links = gpu.nvlinks or ()
    down_status = Finding.fail if policy.nvlink_required else Finding.warn
    remedy_down = "check the NVLink bridge/baseboard and fabric manager (`systemctl status nvidia-fabricmanager`); "\
        f"reset the GPU or reboot; {RMA} if links stay down"
    if note == "all links inactive":
        return down_status("gpu.nvlink", node, gpu.subject, "all NVLink links are inactive", remedy=remedy_down)
    if not links:
        return Finding.skip("gpu.nvlink", node, gpu.subject, f"NVLink not checked: {note or 'no NVLink'}")
    down = [link.link for link in links if not link.active]
    details: dict[str, Any] = {"links": len(links), "inactive": down}
    if down:
        return down_status("gpu.nvlink", node, gpu.subject,
                           f"{len(down)} of {len(links)} NVLink links inactive: {', '.join(map(str, down))}",
                           details=details, remedy=remedy_down)
    errs = {
        kind: sum(getattr(link, f"{kind}_errors") or 0 for link in links) for kind in ("replay", "recovery", "crc")
    }
    details["errors"] = errs
    if any(errs.values()):
        text = ", ".join(f"{v} {k}" for k, v in errs.items() if v)
        return Finding.warn(
            "gpu.nvlink", node, gpu.subject, f"NVLink error counters: {text}", details=details,
            remedy="counters are cumulative: if they grow between audits (`--since-last`), reset the GPU and "
            f"inspect the NVLink path; {RMA} if they keep growing",
        )
    return Finding.ok("gpu.nvlink", node, gpu.subject, f"{len(links)} NVLink links active", details=details)


def judge_mig(node: str, gpu: GpuFacts, policy: GpuPolicy) -> Finding | None:
    if gpu.mig_current is None:
        if policy.expected_mig == "enabled":
            return Finding.warn("gpu.mig", node, gpu.subject, "MIG expected but not supported by this GPU",
                                remedy="use MIG-capable GPUs or set `gpu.expected_mig`")
        return None
    cur = "enabled" if gpu.mig_current else "disabled"
    details = {"current": cur, "pending": None if gpu.mig_pending is None else
               ("enabled" if gpu.mig_pending else "disabled"), "expected": policy.expected_mig}
    if gpu.mig_pending is not None and gpu.mig_pending != gpu.mig_current:
        return Finding.warn("gpu.mig", node, gpu.subject, f"MIG mode change pending (now {cur})", details=details,
                            remedy=f"drain the GPU and reset it (`nvidia-smi -r -i {gpu.index}`) to apply the MIG mode")
    if policy.expected_mig != "any" and cur != policy.expected_mig:
        flag = 1 if policy.expected_mig == "enabled" else 0
        return Finding.fail("gpu.mig", node, gpu.subject, f"MIG {cur}, profile expects {policy.expected_mig}",
                            details=details,
                            remedy=f"`nvidia-smi -i {gpu.index} -mig {flag}` then reset the GPU; SGLang needs whole GPUs "
                            "unless the profile says otherwise")
    return Finding.ok("gpu.mig", node, gpu.subject, f"MIG {cur}", details=details)


def judge_stray_memory(node: str, gpu: GpuFacts, policy: GpuPolicy) -> Finding | None:
    if not policy.expect_idle or gpu.memory_used_mib is None:
        return None
    procs = [
        {"pid": p.pid, "name": p.name, "used_mib": p.used_mib} for p in (gpu.processes or ())
    ]
    details = {"used_mib": gpu.memory_used_mib, "limit_mib": policy.idle_memory_mib, "processes": procs}
    if gpu.memory_used_mib > policy.idle_memory_mib:
        who = ", ".join(f"{p['name'] or '?'} (pid {p['pid']})" for p in procs) or "no process visible"
        return Finding.warn(
            "gpu.stray_memory", node, gpu.subject,
            f"{gpu.memory_used_mib} MiB used on a GPU that should be idle: {who}", details=details,
            remedy="stop the stray processes (`nvidia-smi --query-compute-apps=pid,name --format=csv`); "
            "leftover workers hold memory SGLang needs for KV cache",
        )
    return Finding.ok("gpu.stray_memory", node, gpu.subject, f"{gpu.memory_used_mib} MiB used (idle)", details=details)


GpuRule = Callable[[str, GpuFacts, GpuPolicy], "Finding | None"]

PER_GPU_RULES: tuple[GpuRule, ...] = (
    lambda n, g, p: judge_nvml_errors(n, g),
    judge_persistence,
    judge_ecc_mode,
    lambda n, g, p: judge_ecc_errors(n, g),
    lambda n, g, p: judge_row_remap(n, g),
    judge_retired_pages,
    lambda n, g, p: judge_recovery_action(n, g),
    judge_temperature,
    lambda n, g, p: judge_throttle(n, g),
    judge_pcie,
    judge_nvlink,
    judge_mig,
    judge_stray_memory,
    judge_power_limit,
    judge_memory_temp,
    lambda n, g, p: judge_inforom(n, g),
)


# ---- everything for one node --------------------------------------------------------------------------
def judge_node(
    node: str, facts: NodeGpuFacts, policy: GpuPolicy, expected_count: int,
    memory: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Finding]:
    """All GPU findings of one node, in a stable order. `memory`: what earlier audits remembered for this
    node, per check id then subject (checks/audit.py `remembered`)."""
    memory = memory or {}
    replays = memory.get("gpu.pcie_replay") or {}
    findings = judge_gather_error(node, facts, expected_count)
    if facts.error is None:
        findings.append(judge_count(node, facts, expected_count))
        findings.append(judge_driver(node, facts, policy))
        findings.extend(judge_vbios(node, facts))
        for gpu in facts.gpus:
            findings.extend(f for rule in PER_GPU_RULES if (f := rule(node, gpu, policy)) is not None)
            previous = replays.get(gpu.subject)
            replay = judge_pcie_replay(node, gpu, facts, previous if isinstance(previous, Mapping) else None)
            if replay is not None:
                findings.append(replay)
            earlier = (memory.get("gpu.nvlink_rate") or {}).get(gpu.subject)
            nvlink = judge_nvlink_rate(node, gpu, facts, earlier if isinstance(earlier, Mapping) else None)
            if nvlink is not None:
                findings.append(nvlink)
        findings.extend(judge_fabric(node, facts))
    findings.extend(judge_xids(node, facts, policy, (memory.get("gpu.xid") or {}).values()))
    findings.extend(judge_sxids(node, facts, policy))
    return findings


def judge_fleet(results: Iterable[tuple[str, NodeGpuFacts]]) -> list[Finding]:
    read = [(n, f) for n, f in results if f.error is None]
    return [*judge_driver_consistency({n: (f.driver_version, f.cuda_version) for n, f in read}),
            *judge_vbios_consistency({n: node_vbios(f) for n, f in read})]


#: kept under its old name: tests and callers judge driver consistency alone
judge_fleet_consistency = judge_driver_consistency


__all__ = ["judge_fleet", "judge_node", "judge_sxids", "judge_xids", "xid_rule"]
