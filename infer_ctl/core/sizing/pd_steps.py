"""The arithmetic of one `plan pd` evaluation as lines a reader can redo by hand: every formula of
`pd.py` with its numbers, in the order they are computed."""

from __future__ import annotations

from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.pd import Evaluation, PdInputs, weights
from infer_ctl.core.sizing.roofline import prefill_flops


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:,.2f} ms"


def explain(p: PdInputs, e: Evaluation) -> tuple[str, ...]:
    m = presets.model_preset(p.model)
    pre_acc = presets.accelerator_preset(e.prefill_hw.accelerator)
    dec_acc = presets.accelerator_preset(e.decode_hw.accelerator)
    w = weights(p)
    coll = e.layout == "collocated"
    qk = m.attention_heads * (m.qk_head_dim or m.head_dim)
    v = m.attention_heads * m.head_dim
    wbytes = m.params * presets.dtype_bytes(p.weight_dtype)
    tp_p, tp_d = e.prefill_hw.tp, e.decode_hw.tp
    servers = (f"{e.prefill_servers} collocated servers of {e.prefill_hw.label}" if coll else
               f"{e.prefill_servers} prefill x {e.prefill_hw.label} + {e.decode_servers} decode x {e.decode_hw.label}")
    lines = [f"{servers} = {e.gpus} GPUs; {p.model}, weights {wbytes:,} B, KV {e.kv_bytes_per_token:,} B per token"]
    for c, wi, s, x in zip(p.classes, w, e.prefill_class_s, e.transfer_class_s, strict=True):
        flops = prefill_flops(params=m.flops_params, tokens=c.input_tokens, layers=m.layers, qk_dim=qk, v_dim=v)
        line = (f"class {c.input_tokens:,} in / {c.output_tokens:,} out (share {wi:.3f}): prefill s = "
                f"max({flops:.4g} FLOPs / ({pre_acc.fp16_tflops:g} TFLOP/s x {tp_p} x {p.prefill_mfu:g}), "
                f"{wbytes:.4g} B / ({pre_acc.hbm_tb_s:g} TB/s x {tp_p} x {p.decode_efficiency:g})) = {_ms(s)}")
        if not coll:
            line += (f"; transfer = {c.input_tokens * e.kv_bytes_per_token:,} B / ({p.link.bandwidth_gbps:g} Gb/s x "
                     f"{p.link.links} / 8) + {p.link.latency_us:g} us = {_ms(x)}")
        lines.append(line)
    lam = e.rate_rps / e.prefill_servers
    lines.append(f"prefill queue (M/G/1) per server: lambda = {e.rate_rps:g} / {e.prefill_servers} = {lam:.4g} req/s, "
                 f"E[s] = {_ms(e.mean_prefill_s)}, E[s^2] = {e.prefill_second_moment:.4g} s^2, "
                 f"rho = lambda x E[s] = {e.prefill_utilisation:.4f}")
    lines.append(f"mean wait = lambda x E[s^2] / (2 (1 - rho)) = {_ms(e.mean_wait_s)}; "
                 f"mean TTFT = wait + E[s]{' + E[transfer]' if not coll else ' + half a decode step'} = "
                 f"{_ms(e.mean_ttft_s)}")
    if e.link_utilisation:
        lines.append(f"NIC load per prefill server = lambda x E[KV bytes] / link B/s = {e.link_utilisation:.4f}")
    extra = " - half a decode step x (1 - rho)" if coll else " - transfer"
    for c, s, met in zip(p.classes, e.prefill_class_s, e.ttft_met, strict=True):
        lines.append(f"P(TTFT <= {_ms(p.ttft_slo_s)} | {c.input_tokens:,} in) = P(wait <= objective - {_ms(s)}{extra}) "
                     f"= 1 - rho exp(-rho t / mean wait) = {met:.4f}")
    share = f" x (1 - rho = {1 - e.prefill_utilisation:.4f})" if coll else ""
    lines.append(f"decode demand per server = {e.rate_rps:g} / {e.decode_servers} x E[output] = "
                 f"{e.decode_demand_tokens_s:,.1f} tokens/s; context per sequence = {e.decode_context:,.1f} tokens; "
                 f"KV room holds B <= {e.decode_batch_max:,.1f}")
    if e.decode_batch is None or e.decode_step_s is None:
        lines.append(f"B / step(B){share} < demand even at B = {e.decode_batch_max:,.1f}: the decode side cannot keep "
                     "up, no request meets the ITL objective")
    else:
        lines.append(f"B / step(B){share} = demand (Little's law) -> B = {e.decode_batch:.2f}; step(B) = "
                     f"max(({wbytes:.4g} B + B x {e.decode_context:,.0f} x {e.kv_bytes_per_token:,} B) / "
                     f"({dec_acc.hbm_tb_s:g} TB/s x {tp_d}), 2 x {m.params:.4g} x B / ({dec_acc.fp16_tflops:g} "
                     f"TFLOP/s x {tp_d})) / {p.decode_efficiency:g} = {_ms(e.decode_step_s)}")
        verdict = "met" if e.itl_met else "missed by every request"
        lines.append(f"ITL = step(B){' / (1 - rho)' if coll else ''} = {_ms(e.itl_s)} vs objective "
                     f"{_ms(p.itl_slo_s)}: {verdict}")
    lines.append(f"attainment = sum(share x P(TTFT met)) x [ITL met] = {e.attainment:.4f}; goodput = "
                 f"{e.rate_rps:g} x {e.attainment:.4f} = {e.goodput_rps:.4g} req/s / {e.gpus} GPUs = "
                 f"{e.goodput_per_gpu:.4g} req/s per GPU")
    lines.append(f"capacity (largest rate with attainment >= {p.attainment_target:.0%}) = {e.capacity_rps:.4g} req/s "
                 f"= {e.capacity_per_gpu:.4g} req/s per GPU")
    return tuple(lines)
