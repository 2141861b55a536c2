"""GPU facts of one node in ONE remote command: the node-side gatherer (nvml_node_script.py) is sent on
stdin to `python3 -`; it reads NVML (falling back to `nvidia-smi -q -x` + `nvlink -s/-e` when the NVML
bindings or library are absent) and the kernel log's NVRM lines, and prints one JSON document.

`parse_gatherer_output` turns that document into `NodeGpuFacts` (pure; tested on JSON from the real
script run against a fake `pynvml`, and on real nvidia-smi fixtures).
"""

from __future__ import annotations

import base64
import json
import zlib
from importlib import resources
from typing import Any

from infer_ctl.core.gpu.facts import (
    RECOVERY_ACTIONS,
    GpuFacts,
    GpuProcess,
    NodeGpuFacts,
    NvLink,
    reasons_from_mask,
)
from infer_ctl.facts.kernel_log import parse_sxids, parse_xids
from infer_ctl.facts.nvidia_smi import (
    EXIT_CODES,
    NvidiaSmiParseError,
    merge_nvlink,
    parse_nvidia_smi_xml,
    parse_nvlink_errors,
    parse_nvlink_status,
)
from infer_ctl.remote.base import Command

SOURCES = ("auto", "nvml", "nvidia-smi")
# NVML init errors that mean "no usable driver here" vs "driver present but broken".
_NVML_NO_DRIVER = {9, 12}  # DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND
#: NVMLError_DriverNotLoaded: the user-space driver is there, the kernel module is not (nvidia-smi exit 9)
_NVML_DRIVER_NOT_LOADED = 9
#: nvidia-smi's words when the kernel module is not loaded (printed with exit 9)
_SMI_NOT_LOADED = "couldn't communicate with the nvidia driver"
_NVML_MISMATCH = 18  # LIB_RM_VERSION_MISMATCH
_NVML_NO_PERMISSION = 4
#: nvidia-smi's exit code for a corrupted infoROM (NHC csc_nvidia_smi.nhc)
_SMI_INFOROM_CORRUPTED = 14


class GathererOutputError(ValueError):
    """The gatherer printed something that is not its JSON document (python3 missing, crashed, ...)."""


def gatherer_script() -> bytes:
    return resources.files("infer_ctl.facts").joinpath("nvml_node_script.py").read_bytes()


def gather_command(
    python: str = "python3", *, source: str = "auto", window_h: float = 24.0, budget_s: float | None = None
) -> Command:
    """`budget_s`: seconds the node-side tools may take in all; the script keeps some of it for the
    kernel log, so a hung nvidia-smi still leaves the XIDs readable. Pass less than the remote timeout."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}")
    argv = [python, "-", "--source", source, "--window-min", str(max(1, int(window_h * 60))), "--compress"]
    if budget_s is not None:
        argv += ["--budget", f"{max(1.0, budget_s):g}"]
    return Command(*argv)


#: NVML_GPU_FABRIC_STATE_* (0 = not supported: no fabric, no fact)
_FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}


def _fabric(info: Any) -> dict[str, str | None]:
    if not isinstance(info, dict) or info.get("state") not in _FABRIC_STATES:
        return {}
    status = info.get("status")
    return {"fabric_state": _FABRIC_STATES[info["state"]],
            "fabric_status": "success" if status == 0 else f"NVML error {status}"}


def _gpu_from_nvml(dev: dict[str, Any]) -> GpuFacts:
    known = set(GpuFacts.__dataclass_fields__)
    plain = {k: v for k, v in dev.items() if k in known and k not in {"processes", "nvlinks", "errors"}}
    plain.update(_fabric(dev.get("fabric")))
    mask = dev.get("clock_reasons_mask")
    code = dev.get("recovery_action_code")
    procs = dev.get("processes")
    links = dev.get("nvlinks")
    return GpuFacts(
        **plain,
        clock_reasons=None if mask is None else reasons_from_mask(int(mask)),
        recovery_action=None if code is None else RECOVERY_ACTIONS.get(int(code), f"code_{code}"),
        processes=None
        if procs is None
        else tuple(GpuProcess(int(p["pid"]), p.get("name"), p.get("used_mib")) for p in procs),
        nvlinks=None if links is None else tuple(NvLink(**link) for link in links),
        nvlink_note="no NVLink" if links == [] else None,
        errors=tuple(dev.get("errors") or ()),
    )


def _smi_failure(qx: dict[str, Any]) -> tuple[str, str]:
    rc = qx.get("rc")
    err = (qx.get("err") or qx.get("out") or "").strip()
    last = err.splitlines()[-1] if err else ""
    if rc is None and ("No such file" in err or "not found" in err):
        return "no_driver", "nvidia-smi is not installed (no NVIDIA driver on this node)"
    if rc is None and "timed out" in err:
        return "hung", f"nvidia-smi did not answer: {last} (a hung driver or GPU?)"
    if _SMI_NOT_LOADED in err.lower():
        return "driver_not_loaded", f"nvidia-smi exit {rc}: the NVIDIA kernel driver is not loaded ({last})"
    if "version mismatch" in err.lower():
        return "driver_mismatch", f"NVIDIA driver/library version mismatch: {last}"
    if isinstance(rc, int) and rc in EXIT_CODES:
        kind, meaning = EXIT_CODES[rc]
        return kind, f"nvidia-smi exit {rc}: {meaning}" + (f" ({last})" if last else "")
    return "tool_failed", f"nvidia-smi failed (exit {rc})" + (f": {last}" if last else "")


def _nvml_failure(err: dict[str, Any] | None) -> tuple[str, str] | None:
    """An NVML init error that nvidia-smi cannot work around either."""
    if not err:
        return None
    code = err.get("code")
    if code == _NVML_MISMATCH:
        return "driver_mismatch", f"NVML: {err.get('message')} (driver/library version mismatch)"
    if code == _NVML_DRIVER_NOT_LOADED:
        return "driver_not_loaded", f"NVML: {err.get('message')} (NVMLError_DriverNotLoaded: the NVIDIA kernel module is not loaded)"
    if code == _NVML_NO_PERMISSION:
        return "no_permission", f"NVML: {err.get('message')}"
    return None


def _klog(doc: dict[str, Any]) -> dict[str, Any]:
    """The NodeGpuFacts fields that come from the kernel log (XIDs, SXids, boot time)."""
    klog = doc.get("klog") or {}
    boot = klog.get("boot_time")
    boot_time = float(boot) if isinstance(boot, int | float) else None
    now = klog.get("now")
    common: dict[str, Any] = {"boot_time": boot_time, "gathered_at": float(now) if isinstance(now, int | float) else None}
    if klog.get("source") is None:
        return {**common, "xids": None, "sxids": None, "xid_source": None,
                "xid_error": klog.get("error") or "the kernel log was not read"}
    text = klog.get("out") or ""
    return {**common, "xids": tuple(parse_xids(text, boot_time)), "sxids": tuple(parse_sxids(text, boot_time)),
            "xid_error": None, "xid_source": klog["source"]}


def gatherer_document(line: str) -> Any:
    """The gatherer's last line: its JSON document, plain or `Z1 <base64 of zlib>` (--compress)."""
    if line.startswith("Z1 "):
        try:
            line = zlib.decompress(base64.b64decode(line[3:], validate=True)).decode("utf-8")
        except (ValueError, zlib.error) as exc:  # binascii.Error is a ValueError
            raise GathererOutputError(f"the GPU gatherer's compressed document is damaged ({exc})") from exc
    return json.loads(line)


def parse_gatherer_output(text: str) -> NodeGpuFacts:
    try:
        doc = gatherer_document(text.strip().splitlines()[-1]) if text.strip() else None
    except (json.JSONDecodeError, IndexError) as exc:
        raise GathererOutputError(f"the GPU gatherer printed no JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise GathererOutputError("the GPU gatherer printed an unexpected document")
    common = _klog(doc)
    nvml = doc.get("nvml")
    if nvml is not None:
        return NodeGpuFacts(
            source="nvml",
            driver_version=nvml.get("driver_version"),
            cuda_version=nvml.get("cuda_version"),
            gpu_count=nvml.get("gpu_count"),
            gpus=tuple(_gpu_from_nvml(d) for d in nvml.get("devices", [])),
            **common,
        )
    nvml_err = doc.get("nvml_error")
    fatal = _nvml_failure(nvml_err)
    smi = doc.get("smi")
    if smi is None or (fatal is not None and (smi or {}).get("qx", {}).get("rc") != 0):
        kind, msg = fatal or ("no_driver", f"NVML unavailable: {(nvml_err or {}).get('message')}")
        return NodeGpuFacts(source="none", error=msg, error_kind=kind, **common)
    qx = smi.get("qx") or {}
    # exit 14 is "a GPU's infoROM is corrupted": nvidia-smi still prints the document, and the GPU's
    # InfoROM is judged per GPU (gpu.inforom) instead of the whole node failing
    if qx.get("rc") != 0 and not (qx.get("rc") == _SMI_INFOROM_CORRUPTED and (qx.get("out") or "").strip()):
        kind, msg = _smi_failure(qx)
        return NodeGpuFacts(source="none", error=msg, error_kind=kind, **common)
    try:
        parsed = parse_nvidia_smi_xml((qx.get("out") or "") + "\n" + (qx.get("err") or ""))
    except NvidiaSmiParseError as exc:
        if qx.get("rc") != 0:
            kind, msg = _smi_failure(qx)
            return NodeGpuFacts(source="none", error=msg, error_kind=kind, **common)
        return NodeGpuFacts(source="none", error=str(exc), error_kind="tool_failed", **common)
    status = errors = None
    nvs = smi.get("nvlink_s")
    if nvs and (nvs.get("rc") == 0 or (nvs.get("out") or "").strip()):
        status = parse_nvlink_status(nvs.get("out") or "")
        nve = smi.get("nvlink_e")
        if nve and (nve.get("rc") == 0 or (nve.get("out") or "").strip()):
            errors = parse_nvlink_errors(nve.get("out") or "")
    notes: tuple[str, ...] = ()
    if nvml_err:
        notes = (f"NVML unavailable ({nvml_err.get('message')}); facts read with nvidia-smi",)
    return NodeGpuFacts(
        source="nvidia-smi",
        driver_version=parsed.driver_version,
        cuda_version=parsed.cuda_version,
        gpu_count=parsed.attached_gpus if parsed.attached_gpus is not None else len(parsed.gpus),
        gpus=merge_nvlink(parsed.gpus, status, errors),
        notes=notes,
        **common,
    )
