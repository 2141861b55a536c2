"""Findings the plan commands attach to their numbers: what a plan's math says will not work.

Kept apart from the math modules, which the simulator's hot path imports without findings.
"""

from __future__ import annotations

from infer_ctl.core.findings import Finding, Status
from infer_ctl.core.sizing.kv import KvPlan
from infer_ctl.core.sizing.roofline import RooflinePlan
from infer_ctl.core.sizing.tiers import TierPlan


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


def kv_memory(plan: KvPlan, *, mem_fraction: float) -> list[Finding]:
    """A WARN when the plan leaves SGLang no KV pool (the weights fill its share of HBM: it stops at start-up
    with "Not enough memory", model_runner's profile_max_num_token), or a pool smaller than one request
    of the planned context: its "max concurrent requests 0" is no capacity to plan with."""
    if plan.hbm_bytes is None or plan.kv_budget_bytes is None or plan.max_concurrent is None:
        return []
    usable = plan.hbm_bytes * mem_fraction
    if plan.kv_budget_bytes <= 0:
        return [Finding(
            check="plan.kv.memory_fit", node="local", subject="KV budget", status=Status.WARN,
            message=f"the weights ({(plan.weights_bytes or 0) / 1e9:,.1f} GB) fill all SGLang may use of the "
                    f"replica's HBM (mem fraction {mem_fraction:g} x {plan.hbm_bytes / 1e9:,.1f} GB = "
                    f"{usable / 1e9:,.1f} GB): no KV pool is left, and SGLang stops at start-up (not enough memory)",
            details={"weights_bytes": plan.weights_bytes, "usable_bytes": int(usable)},
            remedy="give the replica more GPUs (--hbm-gb, --tp), quantised weights (--weights-gb), or a higher "
                   "--mem-fraction",
        )]
    if plan.max_concurrent == 0:
        return [Finding(
            check="plan.kv.memory_fit", node="local", subject="KV budget", status=Status.WARN,
            message=f"the KV pool holds {plan.max_tokens or 0:,} tokens, fewer than one request of "
                    f"{plan.context:,} tokens: a request of the full context cannot be served",
            details={"max_tokens": plan.max_tokens, "context": plan.context},
            remedy="a shorter --context, an fp8 KV cache (--dtype fp8), or more HBM per replica (--hbm-gb)",
        )]
    return []


#: the GPUs of one HGX-class node: a TP beyond it spans nodes (the ranks-per-host warning only)
GPUS_PER_NODE = 8


def tiers_findings(plan: TierPlan, *, tp: int, ranks_per_host_given: bool) -> list[Finding]:
    """plan tiers' warnings: a host pool SGLang refuses or that is no larger than the device pool, and
    the host RAM split over every rank of a multi-node TP."""
    out = []
    for pool in (plan.host_explicit, plan.host_auto):
        if pool is not None and pool.fits is False:
            out.append(Finding(
                check="plan.tiers.host_fit", node="local", status=Status.WARN, subject=pool.source,
                message=f"host pool of {pool.bytes_per_rank:,} B per rank exceeds what SGLang lets a rank take "
                        f"({pool.budget_per_rank:,} B): it refuses to start" if pool.tokens else pool.note or "",
                remedy="lower --hicache-ratio / --hicache-size, or give the node more RAM",
            ))
    chosen = plan.host_chosen
    if chosen is not None and chosen.tokens and chosen.smaller_than_device:
        out.append(Finding(
            check="plan.tiers.host_small", node="local", status=Status.WARN, subject=chosen.source,
            message=f"host pool ({chosen.tokens:,} tokens) is not larger than the device pool: SGLang warns "
                    "that L2 cache effectiveness is reduced",
            remedy="a host tier pays only when it holds more than HBM: raise the ratio above 1",
        ))
    if not ranks_per_host_given and tp > GPUS_PER_NODE and plan.host_auto is not None:
        out.append(Finding(
            check="plan.tiers.ranks_per_host", node="local", status=Status.WARN, subject="--ranks-per-host",
            message=f"--ranks-per-host defaults to --tp {tp}, so the host RAM is split {tp} ways; a TP {tp} replica "
                    f"usually spans nodes of {GPUS_PER_NODE} GPUs, and SGLang splits each node's RAM over the ranks "
                    "on that node (launch world size // nodes, pool_host/base.py ranks_per_host)",
            remedy=f"give --ranks-per-host (e.g. {GPUS_PER_NODE} for {tp // GPUS_PER_NODE} nodes of "
                   f"{GPUS_PER_NODE} GPUs)",
        ))
    return out
