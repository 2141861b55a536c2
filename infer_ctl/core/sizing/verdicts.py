"""Findings the plan commands attach to their numbers: what a plan's math says will not work.

Kept apart from the math modules, which the simulator's hot path imports without findings.
"""

from __future__ import annotations

from infer_ctl.core.findings import Finding, Status
from infer_ctl.core.sizing.roofline import RooflinePlan


def roofline_memory(plan: RooflinePlan, *, memory_gb_per_gpu: float | None, gpus: int,
                    accelerator: str) -> list[Finding]:
    """A WARN when the weights (plus the batch's KV read per step, which must be resident too) exceed
    the replica's GPU memory: the tokens/s of a replica that cannot load its model mean nothing."""
    if memory_gb_per_gpu is None:
        return []
    memory = memory_gb_per_gpu * 1e9 * gpus
    need = plan.weights_bytes + plan.kv_bytes_per_step
    if need <= memory:
        return []
    what = "weights" if not plan.kv_bytes_per_step else "weights + KV of the batch"
    short_gpus = -(-need // (memory_gb_per_gpu * 1e9))
    return [Finding(
        check="plan.roofline.memory_fit", node="local", subject=accelerator, status=Status.WARN,
        message=f"{what} ({need / 1e9:,.1f} GB) do not fit the GPU memory of {gpus} x {accelerator} "
                f"({memory / 1e9:,.1f} GB): this replica cannot load the model, so its tokens/s are moot "
                "(and SGLang also keeps memory back for activations and CUDA graphs)",
        details={"need_bytes": need, "memory_bytes": memory},
        remedy=f"use at least {int(short_gpus)} GPUs (--gpus), a smaller --weight-dtype, or a larger accelerator",
    )]
