"""GPU health expectations and thresholds (defaults follow DCGM health watches; the anchors, their
upstream sources and versions are in docs/reference/gpu-thresholds.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from infer_ctl.profile.base import StrictModel

# The default XID severities: DCGM's health watch where it classifies an XID (FAIL -> fatal, WARN -> warn:
# DCGM modules/health/DcgmHealthWatch.cpp BuildXidMappings), gpud's XID catalog where DCGM is silent
# (fatal event type -> fatal; gpud components/accelerator/nvidia/xid/xid.go). docs/reference/gpu-thresholds.md
# lists every XID with both anchors. 61/62/63/94 are DCGM warnings: the thermal micro-controller XIDs, a
# pending remap (gpu.row_remap judges the remap itself) and a contained ECC error (restart the application).
DEFAULT_FATAL_XIDS: tuple[int, ...] = (48, 64, 68, 69, 74, 79, 95, 119, 120, 140, 143)
DEFAULT_WARN_XIDS: tuple[int, ...] = (
    13, 31, 32, 38, 39, 42, 43, 45, 54, 56, 57, 58, 60, 61, 62, 63, 67, 73, 78, 92, 94, 121, 137, 154,
)


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
    # How an XID found in the kernel log is judged (core/gpu/xids.py xid_rule), first match wins:
    #   xid_overrides[xid] -> ignore_xids (not reported) -> fatal_xids (FAIL: drain/reset) ->
    #   warn_xids (WARN) -> any other XID: WARN, with a remedy asking to classify it in one of the lists
    #   (an XID NVIDIA adds later should be looked at, but must not drain a node by default).
    # Giving only some of the lists moves XIDs out of the others' defaults: `warn_xids: [79]` alone makes
    # XID 79 a warning (it leaves the default fatal list). Listing one XID in both fatal_xids and
    # warn_xids yourself is an error: say which you mean, or use xid_overrides (in nodes[i].overrides.gpu
    # the fleet's lists count as given, so move single XIDs there with xid_overrides).
    fatal_xids: list[int] = Field(default_factory=lambda: list(DEFAULT_FATAL_XIDS))
    warn_xids: list[int] = Field(default_factory=lambda: list(DEFAULT_WARN_XIDS))
    ignore_xids: list[int] = Field(default_factory=list)
    #: look back this far in the kernel log for XIDs; only XIDs since the node's last boot count "now"
    xid_window_h: Annotated[float, Field(gt=0)] = 24.0
    #: a fatal XID seen again on the same GPU after this many earlier boots with it is escalated from
    #: "reboot" to "inspect the hardware" (gpud's rebootThreshold, whose default is 2)
    xid_reboot_threshold: Annotated[int, Field(ge=1)] = 1
    max_retired_pages: Annotated[int, Field(ge=0)] = 60
    expected_mig: Literal["disabled", "enabled", "any"] = "disabled"
    #: memory used on a GPU that should be idle, above which a stray process is reported
    idle_memory_mib: Annotated[int, Field(ge=0)] = 1024
    #: GPUs are expected idle (no serving processes) during the check
    expect_idle: bool = False
    nvlink_required: bool = True
    #: per-XID severity overrides, e.g. {94: warn, 13: ignore} (gpud PR #1244 style); beats the lists above
    xid_overrides: dict[int, Literal["fatal", "warn", "ignore"]] = Field(default_factory=dict)
    #: PCIe width the platform wires the GPUs with; None = each GPU's own maximum
    expected_pcie_width: Annotated[int, Field(ge=1, le=32)] | None = None
    #: GPU utilisation (%) above which the PCIe generation is judged (it drops legitimately at idle)
    pcie_gen_load_pct: Annotated[int, Field(ge=0, le=100)] = 50
    #: an enforced power limit below this fraction of the board's default warns (1.0: any lowering)
    min_power_limit_fraction: Annotated[float, Field(gt=0, le=1)] = 1.0
    #: HBM temperature limit when the GPU reports none of its own (nvidia-smi v13 reports a T.Limit margin only)
    max_memory_temp_c: Annotated[int, Field(ge=50, le=120)] = 95
    #: how GPU facts are read on the node: NVML first with nvidia-smi fallback, or only one of them
    facts_source: Literal["auto", "nvml", "nvidia-smi"] = "auto"
    #: interpreter that runs the gatherer on the node (the provisioned venv's python also works)
    python: str = "python3"
    #: seconds the whole gathering (NVML or nvidia-smi + kernel log) may take on one node
    timeout_s: Annotated[float, Field(gt=0)] = 60.0

    @model_validator(mode="before")
    @classmethod
    def _defaults_yield_to_given_xid_lists(cls, data: Any) -> Any:
        """A list left at its default drops the XIDs the user put into another list, so moving one XID
        takes one line (`warn_xids: [79]`) instead of restating the whole fatal list."""
        if not isinstance(data, dict):
            return data
        given = {
            k: set(data[k])
            for k in ("fatal_xids", "warn_xids", "ignore_xids")
            if isinstance(data.get(k), list) and all(isinstance(x, int) for x in data[k])
        }
        if not given:
            return data
        data = dict(data)
        for key, default in (("fatal_xids", DEFAULT_FATAL_XIDS), ("warn_xids", DEFAULT_WARN_XIDS)):
            if key not in data:
                taken = set().union(*(v for k, v in given.items() if k != key))
                data[key] = [x for x in default if x not in taken]
        return data

    @model_validator(mode="after")
    def _xid_lists_do_not_overlap(self) -> GpuPolicy:
        both = sorted(set(self.fatal_xids) & set(self.warn_xids) - set(self.xid_overrides))
        if both:
            listed = ", ".join(map(str, both))
            raise ValueError(
                f"XID {listed} is in both fatal_xids and warn_xids: remove it from one of them, or set "
                f"xid_overrides: {{{both[0]}: warn}} (or fatal)"
            )
        return self
