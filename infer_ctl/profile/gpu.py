"""GPU health expectations and thresholds (defaults follow DCGM health watches; see
../shared/reference/health-checks.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from infer_ctl.profile.base import StrictModel

# XIDs DCGM treats as fatal / needing a GPU reset or node drain (health-checks.md §1.2).
DEFAULT_FATAL_XIDS: tuple[int, ...] = (48, 61, 62, 63, 64, 69, 74, 79, 92, 94, 95, 119, 120, 140, 143)
DEFAULT_WARN_XIDS: tuple[int, ...] = (13, 31, 32, 43, 45, 68, 154)


class GpuPolicy(StrictModel):
    #: GPUs expected per node; None means "the node's `gpus`"
    expected_count: Annotated[int, Field(ge=0)] | None = None
    driver_version: str | None = None
    min_driver_version: str | None = None
    cuda_version: str | None = None
    require_persistence: bool = True
    require_ecc: bool = True
    max_temp_c: Annotated[int, Field(ge=30, le=120)] = 85
    #: warn this many degrees below the GPU's own slowdown threshold
    slowdown_margin_c: Annotated[int, Field(ge=0, le=50)] = 5
    fatal_xids: list[int] = Field(default_factory=lambda: list(DEFAULT_FATAL_XIDS))
    warn_xids: list[int] = Field(default_factory=lambda: list(DEFAULT_WARN_XIDS))
    ignore_xids: list[int] = Field(default_factory=list)
    #: look back this far in the kernel log for XIDs
    xid_window_h: Annotated[float, Field(gt=0)] = 24.0
    max_retired_pages: Annotated[int, Field(ge=0)] = 60
    expected_mig: Literal["disabled", "enabled", "any"] = "disabled"
    #: memory used on a GPU that should be idle, above which a stray process is reported
    idle_memory_mib: Annotated[int, Field(ge=0)] = 1024
    #: GPUs are expected idle (no serving processes) during the check
    expect_idle: bool = False
    nvlink_required: bool = True
    #: per-XID severity overrides, e.g. {94: warn, 13: ignore} (gpud PR #1244 style); beats the sets above
    xid_overrides: dict[int, Literal["fatal", "warn", "ignore"]] = Field(default_factory=dict)
    #: PCIe width the platform wires the GPUs with; None = each GPU's own maximum
    expected_pcie_width: Annotated[int, Field(ge=1, le=32)] | None = None
    #: GPU utilisation (%) above which the PCIe generation is judged (it drops legitimately at idle)
    pcie_gen_load_pct: Annotated[int, Field(ge=0, le=100)] = 50
    #: how GPU facts are read on the node: NVML first with nvidia-smi fallback, or only one of them
    facts_source: Literal["auto", "nvml", "nvidia-smi"] = "auto"
    #: interpreter that runs the gatherer on the node (the provisioned venv's python also works)
    python: str = "python3"
    #: seconds the whole gathering (NVML or nvidia-smi + kernel log) may take on one node
    timeout_s: Annotated[float, Field(gt=0)] = 60.0
