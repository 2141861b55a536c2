"""What inferctl knows about one node's GPUs, whichever way it was gathered (NVML or nvidia-smi).

Pure data: the parsers in infer_ctl/facts/ produce it, the rules in core/gpu/rules.py judge it. Every
field is optional (None = "not reported"): drivers drift, fields read `N/A`, and a rule that cannot see
its fact says so instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# Clock event (throttle) reason bits, NVML nvmlClocksEventReason* (nvml.h).
CLOCK_REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}

# NVML_GPU_RECOVERY_ACTION_* values and the nvidia-smi strings for them.
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}


def reasons_from_mask(mask: int) -> frozenset[str]:
    return frozenset(name for name, bit in CLOCK_REASON_BITS.items() if mask & bit)


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool
    speed_gbps: float | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None
    crc_errors: int | None = None


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str | None = None
    used_mib: int | None = None


@dataclass(frozen=True)
class GpuFacts:
    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    persistence_mode: bool | None = None
    ecc_current: bool | None = None
    ecc_pending: bool | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    ecc_volatile_corrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    sram_threshold_exceeded: bool | None = None
    remap_correctable: int | None = None
    remap_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_sbe: int | None = None
    retired_dbe: int | None = None
    retired_pending: bool | None = None
    #: a RECOVERY_ACTIONS value, or the raw string if unknown
    recovery_action: str | None = None
    temp_c: int | None = None
    mem_temp_c: int | None = None
    #: absolute thresholds (older drivers, NVML)
    slowdown_temp_c: int | None = None
    shutdown_temp_c: int | None = None
    gpu_max_temp_c: int | None = None
    #: driver >= ~535 on newer GPUs report a margin to the T.Limit instead: slowdown happens when
    #: `tlimit_margin_c` falls to `tlimit_slowdown_c` (a small negative number such as -2)
    tlimit_margin_c: int | None = None
    tlimit_slowdown_c: int | None = None
    #: active clock event reasons (names of CLOCK_REASON_BITS); None = not reported
    clock_reasons: frozenset[str] | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    pcie_replays: int | None = None
    utilization_pct: int | None = None
    mig_current: bool | None = None
    mig_pending: bool | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    processes: tuple[GpuProcess, ...] | None = None
    #: None = not gathered; () = the GPU has no NVLink
    nvlinks: tuple[NvLink, ...] | None = None
    #: why links are absent: "all links inactive", "not supported in MIG mode", "no NVLink"
    nvlink_note: str | None = None
    vbios_version: str | None = None
    #: NVSwitch/NVLink fabric registration (fabric manager): "completed" | "in_progress" | "not_started";
    #: None on GPUs without a fabric ("Not Supported", N/A)
    fabric_state: str | None = None
    #: "success", or the error the registration ended with
    fabric_status: str | None = None
    #: enforced power limit and the board's default, in W
    power_limit_w: float | None = None
    default_power_limit_w: float | None = None
    #: HBM temperature limit (NVML threshold MEM_MAX; nvidia-smi gpu_temp_max_mem_threshold)
    mem_max_temp_c: int | None = None
    #: InfoROM checksums valid (nvmlDeviceValidateInforom); False = corrupted; None = not checked
    inforom_valid: bool | None = None
    #: NVML errors hit while reading this GPU ("GPU is lost", "GPU requires reset", ...)
    errors: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        return f"GPU{self.index}"

    def with_(self, **changes: object) -> GpuFacts:
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class XidEvent:
    xid: int
    #: PCI address as the kernel prints it ("0000:9b:00"), normalised lower-case
    pci: str | None
    message: str
    timestamp: str | None = None
    #: "fallen off the bus" lines carry no XID number; they are reported as XID 79
    synthetic: bool = False
    #: Unix time of the line on the node's clock (journal ISO stamps; dmesg's seconds since boot plus the
    #: boot time); None when the stamp has no zone or is missing (judged as "since the last boot")
    epoch: float | None = None


@dataclass(frozen=True)
class SxidEvent:
    """An NVSwitch error line: `nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 48 ...`."""

    sxid: int
    #: the NVSwitch's PCI address, lower-case
    pci: str | None
    #: "fatal" | "non-fatal", as the driver printed it
    severity: str
    message: str
    timestamp: str | None = None
    epoch: float | None = None


@dataclass(frozen=True)
class NodeGpuFacts:
    #: "nvml" | "nvidia-smi" | "none"
    source: str
    driver_version: str | None = None
    cuda_version: str | None = None
    #: GPUs the driver reports (attached_gpus / nvmlDeviceGetCount)
    gpu_count: int | None = None
    gpus: tuple[GpuFacts, ...] = ()
    #: node-level failure to read GPUs at all (no driver, NVML/RM mismatch, ...): judged UNKNOWN/FAIL
    error: str | None = None
    #: "no_driver" | "driver_not_loaded" | "driver_mismatch" | "no_permission" | "hardware" | "hung" | "tool_failed" | "unreachable"
    error_kind: str | None = None
    #: XIDs from the kernel log; None = the kernel log could not be read (see xid_error)
    xids: tuple[XidEvent, ...] | None = None
    xid_error: str | None = None
    xid_source: str | None = None
    #: NVSwitch SXid lines of the same kernel log (None when it was not read)
    sxids: tuple[SxidEvent, ...] | None = None
    #: the node's boot time and its clock when the facts were read (Unix seconds), for "since the last boot"
    boot_time: float | None = None
    gathered_at: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def gpu_for_pci(self, pci: str | None) -> GpuFacts | None:
        key = normalise_pci(pci)
        if key is None:
            return None
        for gpu in self.gpus:
            if normalise_pci(gpu.pci_bus_id) == key:
                return gpu
        return None


def normalise_pci(addr: str | None) -> str | None:
    """'00000000:9B:00.0', '0000:9b:00.0' and the kernel's '0000:9b:00' all become '0000:9b:00'."""
    if not addr:
        return None
    text = addr.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    parts = text.split(":")
    if len(parts) < 3:
        return None
    domain, bus, dev = parts[-3], parts[-2], parts[-1].split(".")[0]
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}"
    except ValueError:
        return None
