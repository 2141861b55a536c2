"""`inferctl plan pd`: the queueing formulas by hand, the seed's benchmark workload (8 x H100, 4,096 in /
512 out) and a chat workload pinned, the reference profile's pools read, and exit 64 for bad input."""

from __future__ import annotations

import json
import math

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.sizing.pd import (
    Hardware,
    Link,
    PdInputs,
    RequestClass,
    evaluate,
    plan_pd,
    server_model,
    spread_classes,
)
from infer_ctl.core.sizing.queueing import mg1_mean_wait, mg1_wait_at_most

H100_TP4 = Hardware("h100-sxm", 4)
SEED = ["--tp", "4", "--links", "4", "--input-tokens", "4096", "--output-tokens", "512"]
CHAT = ["--tp", "4", "--links", "4", "--input-tokens", "512", "--input-spread", "256", "--output-tokens", "256",
        "--output-spread", "128", "--rate", "8", "--ttft-ms", "500"]


def _doc(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 0) -> dict:  # type: ignore[type-arg]
    assert main(["plan", "pd", *argv, "--json"]) == code
    return json.loads(capsys.readouterr().out)


def test_md1_by_hand() -> None:
    # M/D/1, lambda 2/s, s = 0.3 s: rho 0.6, E[Wq] = 2 x 0.09 / (2 x 0.4) = 0.225 s
    assert mg1_mean_wait(2, 0.3, 0.09) == pytest.approx(0.225)
    # P(Wq <= 0.5) = 1 - 0.6 exp(-0.6 x 0.5 / 0.225)
    assert mg1_wait_at_most(0.5, 2, 0.3, 0.09) == pytest.approx(1 - 0.6 * math.exp(-0.6 * 0.5 / 0.225))
    assert mg1_wait_at_most(0.0, 2, 0.3, 0.09) == pytest.approx(0.4)  # PASTA: busy with probability rho
    assert mg1_wait_at_most(-0.1, 2, 0.3, 0.09) == 0.0
    assert mg1_mean_wait(4, 0.3, 0.09) == math.inf and mg1_wait_at_most(9, 4, 0.3, 0.09) == 0.0


def test_spread_classes_keep_mean_and_std() -> None:
    cls = spread_classes(512, 256, 256, 128)
    assert len(cls) == 4 and sum(c.weight for c in cls) == pytest.approx(1)
    mean_in = sum(c.weight * c.input_tokens for c in cls)
    var_in = sum(c.weight * (c.input_tokens - mean_in) ** 2 for c in cls)
    assert mean_in == 512 and var_in == pytest.approx(256**2)
    assert spread_classes(4096, 0, 512, 0) == (RequestClass(4096, 512, 1.0),)


def test_seed_workload_tight_itl_disaggregates(capsys: pytest.CaptureFixture[str]) -> None:
    d = _doc([*SEED, "--rate", "1.5", "--itl-ms", "20"], capsys)
    assert d["answer"] == "disaggregate" and d["gain_at_rate"] is None  # inf: collocated serves no request
    b, c = d["best"], d["collocated"]
    assert (b["prefill_servers"], b["decode_servers"], b["gpus"]) == (1, 1, 8)
    # prefill of 4,096 tokens on 4 x H100 at MFU 0.5: 2 x 70,553,706,496 x 4,096 + 80 x 16,384 x 4,096 x 4,097 FLOPs
    flops = 2 * 70_553_706_496 * 4096 + 80 * 16384 * 4096 * 4097
    s = flops / (989.4e12 * 4 * 0.5)
    assert b["prefill_class_s"] == [pytest.approx(s)] and s == pytest.approx(0.3032, abs=1e-4)
    # transfer: 4,096 x 327,680 B over 4 x 400 Gb/s + 5 us = 6.716 ms
    assert b["transfer_class_s"] == [pytest.approx(4096 * 327680 / 200e9 + 5e-6)]
    # M/D/1 at 1.5 req/s: rho = 0.4548, wait = 1.5 s^2 / (2 (1 - rho))
    rho = 1.5 * s
    wait = 1.5 * s * s / (2 * (1 - rho))
    assert b["prefill_utilisation"] == pytest.approx(rho) and b["mean_wait_s"] == pytest.approx(wait)
    assert b["attainment"] == pytest.approx(1 - rho * math.exp(-rho * (1.0 - s - b["transfer_class_s"][0]) / wait))
    assert b["attainment"] == pytest.approx(0.9620, abs=1e-4)
    # decode, bandwidth-bound: B = a x (W + B x ctx x kv) / (bw x eff) -> B = a W / (bw eff - a ctx kv)
    a, w, ctx, kv, bw = 1.5 * 512, 141_107_412_992, 4096 + 256, 327_680, 3.35e12 * 4
    batch = a * w / (bw * 0.7 - a * ctx * kv)
    assert b["decode_batch"] == pytest.approx(batch, rel=1e-6) and batch == pytest.approx(13.08, abs=0.01)
    assert b["itl_s"] == pytest.approx(batch / a, rel=1e-6) and b["itl_s"] == pytest.approx(0.01703, abs=1e-5)
    assert b["goodput_per_gpu"] == pytest.approx(1.5 * b["attainment"] / 8)
    assert b["capacity_rps"] == pytest.approx(1.994, abs=1e-3)
    # collocated, 2 x (4 x H100): each decodes a = 384 tokens/s in the 1 - rho/2 of its time prefill leaves
    rho_c = 0.75 * s
    a_c = 384 / (1 - rho_c)
    batch_c = a_c * w / (bw * 0.7 - a_c * ctx * kv)
    assert c["decode_batch"] == pytest.approx(batch_c, rel=1e-6)
    assert c["itl_s"] == pytest.approx(batch_c / a_c / (1 - rho_c), rel=1e-6)
    assert c["itl_s"] == pytest.approx(0.02106, abs=1e-5) and c["attainment"] == 0.0  # 21.06 ms > 20 ms
    assert c["capacity_rps"] == pytest.approx(1.301, abs=1e-3)
    assert d["gain_capacity"] == pytest.approx(1.533, abs=1e-3)
    assert any(step.startswith("ITL = step(B) / (1 - rho) = 21.06 ms") for step in c["steps"])


def test_seed_workload_loose_itl_collocates(capsys: pytest.CaptureFixture[str]) -> None:
    d = _doc([*SEED, "--rate", "1.5", "--itl-ms", "50"], capsys)
    assert d["answer"] == "collocate"
    # both serve 1.5 req/s nearly all within the objectives; collocated's two prefill queues keep more headroom
    assert d["best"]["capacity_rps"] == pytest.approx(1.994, abs=1e-3)
    assert d["collocated"]["capacity_rps"] == pytest.approx(3.670, abs=1e-3)


def test_chat_workload(capsys: pytest.CaptureFixture[str]) -> None:
    loose = _doc([*CHAT, "--itl-ms", "50"], capsys)
    assert loose["answer"] == "collocate"
    assert loose["best"]["capacity_rps"] == pytest.approx(24.26, abs=0.01)
    assert loose["collocated"]["capacity_rps"] == pytest.approx(32.72, abs=0.01)
    tight = _doc([*CHAT, "--itl-ms", "20"], capsys)
    assert tight["answer"] == "either at this rate"
    assert tight["gain_capacity"] == pytest.approx(2.09, abs=0.01)
    assert tight["best"]["attainment"] == pytest.approx(1.0, abs=1e-4)
    assert tight["collocated"]["attainment"] == pytest.approx(1.0, abs=1e-4)


def test_reference_profile_pools(capsys: pytest.CaptureFixture[str]) -> None:
    d = _doc(["-p", "builtin:reference-h100-h200", "--rate", "10", "--itl-ms", "6"], capsys)
    i = d["inputs"]
    assert i["gpus"] == 64 and i["model"] == "llama-3.1-70b"
    assert i["prefill"] == {"accelerator": "h100-sxm", "tp": 8} and i["decode"] == {"accelerator": "h200", "tp": 8}
    assert i["link"] == {"bandwidth_gbps": 400.0, "links": 4, "latency_us": 5.0}
    assert len(d["splits"]) == 7  # 1P:7D .. 7P:1D
    assert d["answer"] == "disaggregate"
    assert (d["best"]["prefill_servers"], d["best"]["decode_servers"]) == (4, 4)


def test_capacity_is_where_attainment_crosses_the_target() -> None:
    p = PdInputs((RequestClass(4096, 512),), 1.5, 1.0, 0.02, 8, H100_TP4, H100_TP4, link=Link(400, 4))
    plan = plan_pd(p)
    assert plan.best is not None
    sm = server_model(p, H100_TP4)
    cap = plan.best.capacity_rps
    assert evaluate(p, "disaggregated", 1, 1, sm, sm, cap).attainment >= 0.9 - 1e-9
    assert evaluate(p, "disaggregated", 1, 1, sm, sm, cap * 1.001).attainment < 0.9


def test_no_room_for_a_split_collocates(capsys: pytest.CaptureFixture[str]) -> None:
    d = _doc(["--rate", "1", "--gpus", "8", "--tp", "8"], capsys)
    assert d["best"] is None and d["splits"] == [] and d["answer"] == "collocate"


def test_rate_beyond_the_gpus_warns(capsys: pytest.CaptureFixture[str]) -> None:
    d = _doc([*SEED, "--rate", "5"], capsys, code=1)
    assert d["findings"][0]["check"] == "plan.pd.attainment"


@pytest.mark.parametrize("argv, text", [
    (["--rate", "0"], "--rate must be a finite number > 0"),
    (["--rate", "1", "--prefill-tp", "0"], "--prefill-tp must be >= 1, got 0"),  # was --tp's, exit 0
    (["--rate", "1", "--tp", "0"], "--tp must be >= 1, got 0"),  # was named --prefill-tp
    (["--rate", "1", "--class", "100:100:inf"], "the weight a finite number > 0"),  # was NaN shares, exit 1
    (["--rate", "1", "--gpus", "100000000"], "--gpus must be in [1, 4,096]"),  # was hours of enumerating splits
    (["--rate", "1", "--latency-us", "nan"], "--latency-us a finite number >= 0"),  # was planned on, exit 0
    (["--rate", "1", "--bandwidth-gbps", "inf"], "--bandwidth-gbps must be a finite number > 0"),
    # the objective is quoted in the ms the user typed, not the seconds it is held in
    (["--rate", "1", "--itl-ms", "-5"], "--itl-ms must be a finite number > 0, got -5\n"),
    (["--rate", "1", "--ttft-ms", "-250"], "--ttft-ms must be a finite number > 0, got -250\n"),
    (["--rate", "1", "--class", "4096"], "expected IN:OUT"),
    (["--rate", "1", "--input-tokens", "100", "--input-spread", "100"], "must be below --input-tokens"),
    (["--rate", "1", "--tp", "1"], "not one request"),
    (["--rate", "1", "--accelerator", "h900"], "unknown accelerator preset"),
])
def test_bad_input_exits_64(argv: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "pd", *argv]) == 64
    assert text in capsys.readouterr().err


def test_too_few_gpus_names_the_tp_once(capsys: pytest.CaptureFixture[str]) -> None:
    # both pools at tp 8 read "holds no server of tp 8 or 8"
    args = ["plan", "pd", "--rate", "5", "--ttft-ms", "800", "--itl-ms", "40", "--gpus", "1", "-m", "llama-3.1-70b"]
    assert main(args) == 64
    assert "--gpus 1 holds no server of tp 8\n" in capsys.readouterr().err
