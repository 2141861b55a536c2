"""`nvidia-smi -q -x`, `nvidia-smi nvlink -s` and `nvidia-smi nvlink -e`: the commands and pure parsers.

This is the fallback when NVML bindings are absent on a node (the NVML gatherer is preferred). Element
names drift between drivers (docs/reference/tool-output-formats.md), so every field is looked up under
each name it has had; `N/A`, `[N/A]`, `Not Supported` and NVML error strings read as "not reported".
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field

from infer_ctl.core.gpu.facts import GpuFacts, GpuProcess, NvLink, normalise_pci
from infer_ctl.remote.base import Command

NVIDIA_SMI_XML = Command("nvidia-smi", "-q", "-x")
NVIDIA_SMI_NVLINK_STATUS = Command("nvidia-smi", "nvlink", "-s")
NVIDIA_SMI_NVLINK_ERRORS = Command("nvidia-smi", "nvlink", "-e")

# nvidia-smi exit codes (NHC csc_nvidia_smi.nhc): what each means for the user.
EXIT_CODES: dict[int, tuple[str, str]] = {
    2: ("tool_failed", "nvidia-smi rejected its arguments"),
    4: ("no_permission", "nvidia-smi has no permission to query the GPUs"),
    8: ("hardware", "a GPU reports missing power cables"),
    # installed but not loaded ("couldn't communicate with the NVIDIA driver"): not a node without GPUs
    9: ("driver_not_loaded", "the NVIDIA kernel driver is not loaded"),
    10: ("hardware", "a GPU has an interrupt (IRQ) problem"),
    12: ("no_driver", "the NVML shared library (libnvidia-ml.so) was not found"),
    14: ("hardware", "a GPU's infoROM is corrupted"),
    15: ("hardware", "a GPU has fallen off the bus"),
}

_MISSING = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown", "none reported"}
# Values nvidia-smi prints in place of a reading when NVML returned an error for that GPU.
NVML_ERROR_TEXTS = (
    "gpu is lost",
    "gpu requires reset",
    "gpu requires restart",
    "unknown error",
    "rm has detected an nvml/rm version mismatch",
)
_INT = re.compile(r"^\s*(-?\d+)")


class NvidiaSmiParseError(ValueError):
    """The text is not nvidia-smi XML (truncated, an error message, or another tool's output)."""


class _Indexed:
    """One GPU's element with every child path looked up once: `find("pci/pci_bus_id")` is a dict hit
    instead of an ElementPath walk (a GPU has ~1000 elements and the parser asks ~100 paths of it;
    the walks were most of the parse). The first element of a path wins, as with Element.find."""

    def __init__(self, elem: ET.Element) -> None:
        self.elem = elem
        self.paths: dict[str, ET.Element] = {}
        self._fill(elem, "")

    def _fill(self, node: ET.Element, prefix: str) -> None:
        for child in node:
            path = prefix + child.tag
            if path not in self.paths:
                self.paths[path] = child
            if len(child):
                self._fill(child, path + "/")

    def find(self, path: str) -> ET.Element | None:
        return self.paths.get(path)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.elem.get(key, default)


Tree = ET.Element | _Indexed


def _text(elem: ET.Element | None) -> str | None:
    if elem is None:
        return None
    value = (elem.text or "").strip()
    if value.lower() in _MISSING or value.lower() in NVML_ERROR_TEXTS:
        return None
    if value.lower().startswith("requested functionality has been deprecated"):
        return None
    return value


def _find(root: Tree, *paths: str) -> str | None:
    """The first path that exists with a real value: element names drift between drivers."""
    for path in paths:
        value = _text(root.find(path))
        if value is not None:
            return value
    return None


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    m = _INT.match(value)
    return int(m.group(1)) if m else None


def _watts(value: str | None) -> float | None:
    """'700.00 W' -> 700.0."""
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value or "")
    return float(m.group(1)) if m else None


def _state(value: str | None) -> str | None:
    """'In Progress' -> 'in_progress'."""
    return None if value is None else re.sub(r"[^a-z0-9]+", "_", value.lower()).strip("_")


def _yes(value: str | None) -> bool | None:
    if value is None:
        return None
    low = value.lower()
    if low in {"yes", "enabled", "active", "true", "pending"}:
        return True
    if low in {"no", "disabled", "not active", "false", "none"}:
        return False
    return None


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ecc_uncorrected(gpu: Tree, scope: str) -> int | None:
    base = f"ecc_errors/{scope}"
    # v12+ (A100/H100...): SRAM parity + SECDED + DRAM; v11: sram_uncorrectable; pre-Ampere: double_bit/total
    modern = [
        _int(_find(gpu, f"{base}/{name}"))
        for name in ("sram_uncorrectable_parity", "sram_uncorrectable_secded", "sram_uncorrectable", "dram_uncorrectable")
    ]
    if any(v is not None for v in modern):
        return _sum(modern)
    return _int(_find(gpu, f"{base}/double_bit/total"))


def _ecc_corrected(gpu: Tree, scope: str) -> int | None:
    base = f"ecc_errors/{scope}"
    modern = [_int(_find(gpu, f"{base}/{n}")) for n in ("sram_correctable", "dram_correctable")]
    if any(v is not None for v in modern):
        return _sum(modern)
    return _int(_find(gpu, f"{base}/single_bit/total"))


def _clock_reasons(gpu: Tree) -> frozenset[str] | None:
    for group, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        elem = gpu.find(group)
        if elem is None or len(elem) == 0:
            continue
        active = set()
        for child in elem:
            if child.tag.startswith(prefix) and _yes(_text(child)):
                active.add(child.tag[len(prefix) :])
        return frozenset(active)
    return None


def _processes(gpu: Tree) -> tuple[GpuProcess, ...] | None:
    elem = gpu.find("processes")
    if elem is None:
        return None
    procs = []
    for p in elem.findall("process_info"):
        pid = _int(_find(p, "pid"))
        if pid is None:
            continue
        procs.append(GpuProcess(pid=pid, name=_find(p, "process_name"), used_mib=_int(_find(p, "used_memory"))))
    return tuple(procs)


def _nvml_errors(gpu: ET.Element) -> tuple[str, ...]:
    found: list[str] = []
    for elem in gpu.iter():
        value = (elem.text or "").strip()
        if value.lower() in NVML_ERROR_TEXTS and value not in found:
            found.append(value)
    return tuple(found)


def _recovery_action(gpu: Tree) -> str | None:
    """'None' / 'Gpu Reset' / 'Drain and Reset' -> 'none' / 'gpu_reset' / 'drain_and_reset'."""
    raw = _text(gpu.find("gpu_recovery_action"))
    return None if raw is None else re.sub(r"[^a-z0-9]+", "_", raw.lower()).strip("_")


def _parse_gpu(index: int, elem: ET.Element, errors_possible: bool = True) -> GpuFacts:
    gpu = _Indexed(elem)
    return GpuFacts(
        index=index,
        name=_find(gpu, "product_name"),
        uuid=_find(gpu, "uuid"),
        pci_bus_id=_find(gpu, "pci/pci_bus_id") or gpu.get("id"),
        persistence_mode=_yes(_find(gpu, "persistence_mode")),
        ecc_current=_yes(_find(gpu, "ecc_mode/current_ecc")),
        ecc_pending=_yes(_find(gpu, "ecc_mode/pending_ecc")),
        ecc_volatile_uncorrected=_ecc_uncorrected(gpu, "volatile"),
        ecc_aggregate_uncorrected=_ecc_uncorrected(gpu, "aggregate"),
        ecc_volatile_corrected=_ecc_corrected(gpu, "volatile"),
        ecc_aggregate_corrected=_ecc_corrected(gpu, "aggregate"),
        sram_threshold_exceeded=_yes(_find(gpu, "ecc_errors/aggregate/sram_threshold_exceeded")),
        remap_correctable=_int(_find(gpu, "remapped_rows/remapped_row_corr")),
        remap_uncorrectable=_int(_find(gpu, "remapped_rows/remapped_row_unc")),
        remap_pending=_yes(_find(gpu, "remapped_rows/remapped_row_pending")),
        remap_failure=_yes(_find(gpu, "remapped_rows/remapped_row_failure")),
        retired_sbe=_int(_find(gpu, "retired_pages/multiple_single_bit_retirement/retired_count")),
        retired_dbe=_int(_find(gpu, "retired_pages/double_bit_retirement/retired_count")),
        retired_pending=_yes(_find(gpu, "retired_pages/pending_retirement", "retired_pages/pending_blacklist")),
        recovery_action=_recovery_action(gpu),
        temp_c=_int(_find(gpu, "temperature/gpu_temp")),
        mem_temp_c=_int(_find(gpu, "temperature/memory_temp")),
        slowdown_temp_c=_int(_find(gpu, "temperature/gpu_temp_slow_threshold")),
        shutdown_temp_c=_int(_find(gpu, "temperature/gpu_temp_max_threshold")),
        gpu_max_temp_c=_int(_find(gpu, "temperature/gpu_temp_max_gpu_threshold")),
        tlimit_margin_c=_int(_find(gpu, "temperature/gpu_temp_tlimit")),
        tlimit_slowdown_c=_int(_find(gpu, "temperature/gpu_temp_slow_tlimit_threshold")),
        clock_reasons=_clock_reasons(gpu),
        pcie_gen_current=_int(_find(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
        pcie_gen_max=_int(
            _find(
                gpu,
                "pci/pci_gpu_link_info/pcie_gen/max_device_link_gen",
                "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
            )
        ),
        pcie_width_current=_int(_find(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width")),
        pcie_width_max=_int(_find(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width")),
        pcie_replays=_int(_find(gpu, "pci/replay_counter")),
        utilization_pct=_int(_find(gpu, "utilization/gpu_util")),
        mig_current=_yes(_find(gpu, "mig_mode/current_mig")),
        mig_pending=_yes(_find(gpu, "mig_mode/pending_mig")),
        memory_used_mib=_int(_find(gpu, "fb_memory_usage/used")),
        memory_total_mib=_int(_find(gpu, "fb_memory_usage/total")),
        processes=_processes(gpu),
        errors=_nvml_errors(elem) if errors_possible else (),
        vbios_version=_find(gpu, "vbios_version"),
        fabric_state=_state(_find(gpu, "fabric/state")),
        fabric_status=_state(_find(gpu, "fabric/status")),
        # v13 (driver >= ~535 on newer GPUs): gpu_power_readings/current_power_limit; older: power_readings
        power_limit_w=_watts(_find(gpu, "gpu_power_readings/current_power_limit", "power_readings/enforced_power_limit",
                                   "power_readings/power_limit")),
        default_power_limit_w=_watts(_find(gpu, "gpu_power_readings/default_power_limit",
                                           "power_readings/default_power_limit")),
        mem_max_temp_c=_int(_find(gpu, "temperature/gpu_temp_max_mem_threshold")),
    )


@dataclass(frozen=True)
class SmiDocument:
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    gpus: tuple[GpuFacts, ...] = field(default_factory=tuple)
    #: PCI addresses nvidia-smi warned "infoROM is corrupted at gpu ..." for (it then exits 14)
    inforom_corrupted: tuple[str, ...] = ()


# nvidia-smi prints this line around its output (and exits 14) for a GPU whose InfoROM checksum fails
_INFOROM_WARNING = re.compile(r"^WARNING: infoROM is corrupted at gpu ([0-9A-Fa-f:.]+)\s*$", re.M)
_XML_START = re.compile(r"<\?xml|<!DOCTYPE|<nvidia_smi_log")


def parse_nvidia_smi_xml(text: str) -> SmiDocument:
    """Parse `nvidia-smi -q -x` output (DTD v10..v13). GPUs are indexed in document order, which is
    nvidia-smi's index order (PCI bus order unless CUDA_DEVICE_ORDER is set). Warning lines around the
    XML (a corrupted InfoROM) are read and removed first."""
    corrupted: tuple[str, ...] = ()
    if "infoROM is corrupted" in text:  # rare: the regexes scan the whole document
        corrupted = tuple(m.group(1).lower() for m in _INFOROM_WARNING.finditer(text))
        text = _INFOROM_WARNING.sub("", text)
    start = _XML_START.search(text)
    if start is not None:
        text = text[start.start():]
    end = text.find("</nvidia_smi_log>")
    if end >= 0:
        text = text[: end + len("</nvidia_smi_log>")]
    # The DOCTYPE names an external DTD that is never fetched; ElementTree ignores it.
    try:
        root = ET.fromstring(text.strip().encode("utf-8"))
    except ET.ParseError as exc:
        raise NvidiaSmiParseError(f"not valid nvidia-smi XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiParseError(f"not nvidia-smi XML: root element is <{root.tag}>")
    # an NVML error string anywhere is rare; when none is in the text, no GPU needs the element walk
    low = text.lower()
    errors_possible = any(e in low for e in NVML_ERROR_TEXTS)
    gpus = tuple(_parse_gpu(i, g, errors_possible) for i, g in enumerate(root.findall("gpu")))
    bad = {normalise_pci(p) for p in corrupted}
    gpus = tuple(g.with_(inforom_valid=False) if normalise_pci(g.pci_bus_id) in bad else g for g in gpus)
    return SmiDocument(
        driver_version=_find(root, "driver_version"),
        cuda_version=_find(root, "cuda_version"),
        attached_gpus=_int(_find(root, "attached_gpus")),
        gpus=gpus,
        inforom_corrupted=corrupted,
    )


# ---- nvlink -s / -e ----------------------------------------------------------------------------
_GPU_LINE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?\s*$")
_LINK_STATUS = re.compile(r"^\s*Link (\d+): (.*?)\s*$")
_LINK_ERROR = re.compile(r"^\s*Link (\d+): (Replay|Recovery|CRC) Errors: (\d+)\s*$")
_SPEED = re.compile(r"^([\d.]+) GB/s$")


@dataclass(frozen=True)
class NvLinkStatus:
    links: tuple[NvLink, ...]
    #: set when nvidia-smi printed a reason instead of links
    note: str | None = None


def _note_for(line: str) -> str | None:
    low = line.lower()
    if "all links are inactive" in low:
        return "all links inactive"
    if "mig mode" in low:
        return "not supported in MIG mode"
    if "does not have or support nvlink" in low:
        return "no NVLink"
    return None


def parse_nvlink_status(text: str) -> dict[int, NvLinkStatus]:
    """`nvidia-smi nvlink -s`: per GPU index, its links (active with GB/s, or `<inactive>`), or a note
    (all links inactive, MIG mode, no NVLink). Empty output (GPUs without NVLink) gives {}."""
    result: dict[int, tuple[list[NvLink], str | None]] = {}
    current: int | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _GPU_LINE.match(line)
        if m:
            current = int(m.group(1))
            result[current] = ([], None)
            continue
        if current is None:
            continue
        links = result[current][0]
        lm = _LINK_STATUS.match(line)
        if lm:
            state = lm.group(2)
            speed = _SPEED.match(state)
            if speed:
                links.append(NvLink(int(lm.group(1)), True, float(speed.group(1))))
            elif "inactive" in state.lower():
                links.append(NvLink(int(lm.group(1)), False))
            # other forms ("Remote Device ...") belong to `nvlink -R`: not a state, skip
            continue
        found = _note_for(line)
        if found:
            result[current] = (links, found)
    return {gpu: NvLinkStatus(tuple(links), note) for gpu, (links, note) in result.items()}


def parse_nvlink_errors(text: str) -> dict[int, dict[int, dict[str, int]]]:
    """`nvidia-smi nvlink -e`: {gpu: {link: {"replay": n, "recovery": n, "crc": n}}}."""
    result: dict[int, dict[int, dict[str, int]]] = {}
    current: int | None = None
    for raw in text.splitlines():
        m = _GPU_LINE.match(raw.rstrip())
        if m:
            current = int(m.group(1))
            result[current] = {}
            continue
        em = _LINK_ERROR.match(raw)
        if em and current is not None:
            result[current].setdefault(int(em.group(1)), {})[em.group(2).lower()] = int(em.group(3))
    return result


def merge_nvlink(
    gpus: Iterable[GpuFacts],
    status: dict[int, NvLinkStatus] | None,
    errors: dict[int, dict[int, dict[str, int]]] | None,
) -> tuple[GpuFacts, ...]:
    """Attach nvlink -s/-e results to the GPUs from -q -x. `status is None` means "not gathered"."""
    merged = []
    for gpu in gpus:
        if status is None:
            merged.append(gpu)
            continue
        st = status.get(gpu.index)
        if st is None:
            # nvidia-smi prints nothing at all for GPUs without NVLink (e.g. A10)
            merged.append(gpu.with_(nvlinks=(), nvlink_note="no NVLink"))
            continue
        errs = (errors or {}).get(gpu.index, {})
        links = tuple(
            NvLink(
                link.link,
                link.active,
                link.speed_gbps,
                replay_errors=errs.get(link.link, {}).get("replay"),
                recovery_errors=errs.get(link.link, {}).get("recovery"),
                crc_errors=errs.get(link.link, {}).get("crc"),
            )
            for link in st.links
        )
        merged.append(gpu.with_(nvlinks=links, nvlink_note=st.note))
    return tuple(merged)
