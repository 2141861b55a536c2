"""Rendering a bench summary: a rich table, and latency-CDF / hit-rate plots (matplotlib, optional)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from infer_ctl.bench.stats import RequestResult, hit_rate_over_time
from infer_ctl.errors import MissingExtraError


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:,.1f}"


def summary_table(s: dict[str, Any], title: str = "inferctl bench") -> Table:
    unit = "model ms" if s.get("time_scale", 1.0) != 1.0 else "ms"
    t = Table(title=title, title_justify="left")
    t.add_column("latency", style="bold")
    for col in ("mean", "p50", "p90", "p99"):
        t.add_column(f"{col} ({unit})", justify="right")
    for key, label in (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        d = s[key]
        t.add_row(label, _ms(d["mean"]), _ms(d["p50"]), _ms(d["p90"]), _ms(d["p99"]))
    return t


def totals_table(s: dict[str, Any]) -> Table:
    t = Table(show_header=False, title_justify="left")
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")
    per = "/s" if s.get("time_scale", 1.0) == 1.0 else "/model s"
    t.add_row("requests (ok / failed)", f"{s['completed']} / {s['failed']}")
    t.add_row("duration (wall s)", f"{s['duration_s']:.2f}")
    if s.get("time_scale", 1.0) != 1.0:
        t.add_row("time scale (wall s per model s)", f"{s['time_scale']:g}")
    t.add_row(f"request throughput (req{per})", f"{s['request_throughput']:.2f}")
    t.add_row(f"input tokens{per}", f"{s['input_token_throughput']:,.0f}")
    t.add_row(f"output tokens{per}", f"{s['output_token_throughput']:,.0f}")
    slo = s["slo"]
    t.add_row(
        f"goodput (req{per}, TTFT<={slo['ttft_s'] * 1000:g}ms, TPOT<={slo['tpot_s'] * 1000:g}ms)",
        f"{s['goodput']:.2f} ({s['slo_attainment']:.0%})",
    )
    t.add_row("cache hit rate (cached / prompt tokens)", f"{s['cache_hit_rate']:.1%}")
    spec = s.get("speculative")
    if spec:  # as SGLang's bench_serving prints it ("Accept length:"), plus the rate and the alpha behind it
        t.add_row("Accept length (completion tokens / verify steps)", f"{spec['accept_length']:.2f}")
        if spec.get("accept_rate") is not None:
            t.add_row("Accept rate (correct / proposed drafts)", f"{spec['accept_rate']:.2f}")
        if spec.get("alpha") is not None:
            t.add_row("alpha (per-draft acceptance, estimated)", f"{spec['alpha']:.2f}")
    for err, n in list(s.get("errors", {}).items())[:3]:
        t.add_row(f"error x{n}", err)  # whole: tables fold long cells (output/fit.py) rather than cut them
    if s.get("stopped"):
        t.add_row("stopped", f"{s['stopped']}; {s['not_sent']} requests not sent")
    return t


def render(console: Console, s: dict[str, Any], title: str = "inferctl bench") -> None:
    console.print(summary_table(s, title))
    console.print(totals_table(s))


def plot(results: list[RequestResult], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingExtraError("matplotlib", "plot", "bench --plot") from exc
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, values in (
        ("TTFT", [r.ttft for r in results if r.ok and r.ttft is not None]),
        ("E2E", [r.e2e for r in results if r.ok and r.e2e is not None]),
        ("ITL", [x for r in results if r.ok for x in r.itls]),
    ):
        if values:
            xs = sorted(values)
            ax1.plot([x * 1000 for x in xs], [(i + 1) / len(xs) for i in range(len(xs))], label=label)
    ax1.set_xscale("log")
    ax1.set_xlabel("latency (ms)")
    ax1.set_ylabel("CDF")
    ax1.legend()
    ax1.set_title("latency CDFs")
    series = hit_rate_over_time(results)
    ax2.plot([t for t, _ in series], [h * 100 for _, h in series], marker="o")
    ax2.set_xlabel("time since start (wall s)")
    ax2.set_ylabel("cache hit rate (%)")
    ax2.set_ylim(0, 100)
    ax2.set_title("prefix cache hit rate over time")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
