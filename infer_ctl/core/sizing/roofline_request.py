"""`plan roofline` from what it was given to its numbers and findings: the model (a preset or
--params-b), the accelerator (a preset, or --tflops and --tb-s), the KV read per step (plan kv's bytes
per token for the shape) planned and judged. The CLI (cli/plan_cmd.py) parses, calls
`roofline_outcome`, renders."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.inputs import InputError, kv_shape
from infer_ctl.core.sizing.roofline import RooflinePlan, plan_roofline
from infer_ctl.core.sizing.verdicts import roofline_memory


@dataclass(frozen=True)
class RooflineRequest:
    """The options of `plan roofline`, named as the flags (None: left out)."""

    model: str | None
    params_b: float | None
    accelerator: str | None
    tflops: float | None
    tb_s: float | None
    gpus: int
    weight_dtype: str
    batch: int
    context: int
    kv_dtype: str
    layers: int | None
    kv_heads: int | None
    head_dim: int | None


@dataclass(frozen=True)
class RooflineOutcome:
    plan: RooflinePlan
    accelerator: str  # the preset's name, or "custom"
    data: dict[str, Any]
    findings: list[Finding]


def roofline_outcome(r: RooflineRequest) -> RooflineOutcome:
    """Resolve, plan and judge; an impossible input raises ValueError (InputError: with its remedy)."""
    preset = presets.model_preset(r.model) if r.model else None
    if r.params_b is not None:
        if r.params_b <= 0:
            raise InputError(f"--params-b must be > 0, got {r.params_b:g}", remedy="e.g. --params-b 70")
        params = int(r.params_b * 1e9)
    elif preset is not None:
        params = preset.params
    else:
        raise InputError("give --model PRESET or --params-b N",
                         remedy="e.g. --model llama-3.1-70b (see plan kv --list-presets)")
    acc = presets.accelerator_preset(r.accelerator) if r.accelerator else None
    # `is not None`, not `or`: an explicit --tflops 0 is an input error, not "use the preset"
    peak = r.tflops if r.tflops is not None else (acc.fp16_tflops if acc else None)
    bw = r.tb_s if r.tb_s is not None else (acc.hbm_tb_s if acc else None)
    if peak is None or bw is None:
        raise InputError("give --accelerator or both --tflops and --tb-s", remedy="e.g. --accelerator h100-sxm")
    kvpt = 0
    if r.context:
        # the KV shape comes from the preset or --layers/--kv-heads/--head-dim, the bytes from plan kv's formula
        _, shape = kv_shape(r.model, r.layers, r.kv_heads, r.head_dim, needed_by="--context (KV read per step)")
        kvpt = shape.bytes_per_token(presets.dtype_bytes(r.kv_dtype))
    plan = plan_roofline(params=params, weight_dtype_bytes=presets.dtype_bytes(r.weight_dtype), peak_tflops=peak,
                         hbm_tb_s=bw, gpus=r.gpus, batch=r.batch, kv_bytes_per_token=kvpt, context=r.context)
    data = {
        "model": preset.name if preset else None,
        "accelerator": acc.name if acc else None,
        "params": params,
        "kv_dtype": r.kv_dtype if r.context else None,
        **asdict(plan),
    }
    findings = roofline_memory(plan, memory_gb_per_gpu=acc.hbm_gb if acc else None, gpus=r.gpus,
                               accelerator=acc.name if acc else "custom")
    return RooflineOutcome(plan, acc.name if acc else "custom", data, findings)
