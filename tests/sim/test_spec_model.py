"""The simulator's speculative pieces without a socket: the workload's domains and drift, the option
parsing of `sim serve`, and the adaptive controller against SGLang 0.5.23's own (`sglang` extra)."""

from __future__ import annotations

import ast
import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from infer_ctl.cli.main import main
from infer_ctl.sim import spec_adaptive
from infer_ctl.sim.spec_workload import (
    DEFAULT_DOMAIN,
    MISMATCH_ALPHA,
    DriftStep,
    SpecWorkload,
    domain_of,
    labels_from_header,
    parse_domain_alpha,
    parse_drift,
)
from infer_ctl.sim.specparse import fresh_workloads, parse_worker, spec_knobs


def test_domains_defaults_overrides_and_unknown_labels() -> None:
    w = SpecWorkload(domains={"Code": 0.9, "legal": 0.5})
    assert w.alpha("code", 0.8, 0.0, 1.0) == 0.9 and w.alpha("json", 0.8, 0.0, 1.0) == 0.88
    assert w.alpha(DEFAULT_DOMAIN, 0.8, 0.0, 1.0) == 0.8
    assert w.resolve("legal") == "legal" and w.resolve("poetry") == DEFAULT_DOMAIN and w.resolve(None) == DEFAULT_DOMAIN
    assert SpecWorkload(default_domain="Creative").resolve(None) == "creative"
    assert domain_of({"domain": " Summarization "}) == "summarisation" and domain_of({"team": "a"}) is None
    assert labels_from_header('{"domain": "chat", "n": 1}') == {"domain": "chat"}
    assert labels_from_header("not json") is None and labels_from_header("[1]") is None
    with pytest.raises(ValueError, match="alpha must be a number in"):
        SpecWorkload(domains={"code": 1.2})


def test_drift_schedule_and_shifts_latest_event_wins() -> None:
    w = SpecWorkload(drift=(DriftStep(20, "chat", 0.5), DriftStep(10, "chat", 0.6)), epoch=100.0)
    ts = 0.5  # wall seconds per model second: step at 10 model s = wall 105
    assert w.alpha("chat", 0.8, 104.9, ts) == 0.68
    assert w.alpha("chat", 0.8, 105.0, ts) == 0.6
    assert w.alpha("chat", 0.8, 111.0, ts) == 0.5
    w.shift("chat", 0.3, now=112.0)
    assert w.alpha("chat", 0.8, 112.0, ts) == 0.3 and w.alpha("code", 0.8, 112.0, ts) == 0.88
    later = SpecWorkload(drift=(DriftStep(20, "chat", 0.5),), epoch=100.0)
    later.shift("chat", 0.3, now=101.0)
    assert later.alpha("chat", 0.8, 111.0, ts) == 0.5, "a schedule step after the shift overrides it"
    w.start(now=999.0)
    assert w.epoch == 100.0, "the schedule's clock starts once (a restarted worker keeps it)"
    mismatch = SpecWorkload(draft_tokenizer_mismatch=True, domains={"code": 0.99})
    assert mismatch.alpha("code", 0.8, 0.0, 1.0) == MISMATCH_ALPHA


def test_option_syntax_and_errors() -> None:
    assert parse_domain_alpha("code=0.9") == ("code", 0.9)
    assert parse_drift("30:chat=0.4") == DriftStep(30.0, "chat", 0.4)
    for bad, why in (("code", "expected DOMAIN=ALPHA"), ("=0.3", "expected DOMAIN=ALPHA"),
                     ("code=x", "is not a number"), ("code=2", "in \\[0, 1\\]")):
        with pytest.raises(ValueError, match=why):
            parse_domain_alpha(bad)
    for bad, why in (("chat=0.4", "expected SECONDS"), ("x:chat=0.4", "not a number of seconds"),
                     ("-1:chat=0.4", ">= 0 seconds")):
        with pytest.raises(ValueError, match=why):
            parse_drift(bad)
    knobs = spec_knobs(domains=["code=0.95"], drift=["5:chat=0.2"], adaptive=True, gamma=5, decode_log_interval=8)
    specs = fresh_workloads([parse_worker("decode", **knobs), parse_worker("mixed", **knobs)])
    assert specs[0].spec_workload is not specs[1].spec_workload, "one workload per worker"
    assert specs[0].spec_workload.domains == {"code": 0.95} and specs[0].spec_gamma == 5
    assert specs[0].timing().spec_gamma == 5 and specs[1].decode_log_interval == 8


def test_sim_serve_bad_speculative_options_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "serve", "--decode", "1", "--spec-drift", "soon:chat=0.4"]) == 64
    assert "bad drift step" in capsys.readouterr().err
    assert main(["sim", "serve", "--decode", "1", "--speculative-adaptive", "--speculative-num-steps", "4"]) == 64
    assert "candidate_steps" in capsys.readouterr().err


def test_sim_serve_process_takes_the_speculative_options() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "infer_ctl", "sim", "serve", "--mixed", "1", "--time-scale", "0.01", "--json",
         "--spec-domain", "code=0.95", "--spec-default-domain", "code", "--draft-tokenizer-mismatch",
         "--speculative-adaptive", "--speculative-num-steps", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        (worker,) = json.loads(proc.stdout.readline())["workers"]
        snap = httpx.get(worker["url"] + "/sim/spec").json()
        info = httpx.get(worker["url"] + "/server_info").json()
    finally:
        proc.terminate()
        proc.wait(20)
    assert snap["default_domain"] == "code" and snap["configured"]["code"] == 0.95
    assert snap["alpha"]["code"] == MISMATCH_ALPHA and snap["launch_steps"] == 5
    assert info["speculative_adaptive"] is True and info["speculative_num_steps"] == 5


# -- the adaptive controller against SGLang's --------------------------------------------------------
def _sglang_file(rel: str) -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        pytest.skip("the sglang package is not installed")
    return Path(spec.origin).parent / rel


def test_adaptive_defaults_are_sglangs() -> None:
    path = _sglang_file("srt/speculative/adaptive_spec_params.py")
    tree = ast.parse(path.read_text())
    default = next(
        n.value for n in ast.walk(tree)
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "DEFAULT_ADAPTIVE_CONFIG"
    )
    assert ast.literal_eval(default) == spec_adaptive.DEFAULT_ADAPTIVE_CONFIG
    slot = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "AdaptiveStepSlot")
    knobs = {
        c.args[0].value: ast.literal_eval(c.args[1])
        for c in ast.walk(slot)
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "get"
        and len(c.args) == 2 and isinstance(c.args[0], ast.Constant)
    }
    assert knobs == spec_adaptive.SLOT_DEFAULTS


def test_config_validation_and_launch_steps() -> None:
    assert spec_adaptive.candidate_steps(None) == [0, 1, 3, 5, 7]
    assert spec_adaptive.launch_steps(None, None) == 3  # SGLang: the middle candidate
    assert spec_adaptive.launch_steps(7, None) == 7
    with pytest.raises(ValueError, match="candidate_steps must be a list of non-negative ints"):
        spec_adaptive.load_adaptive_config({"1": {"candidate_steps": [-1]}})
    with pytest.raises(ValueError, match="at least one integer-string BS key"):
        spec_adaptive.load_adaptive_config({"ema_alpha": 0.5})
    with pytest.raises(ValueError, match="cannot read"):
        spec_adaptive.load_adaptive_config("/nonexistent/adaptive.json")


@pytest.mark.sglang
def test_adaptive_controller_decides_exactly_as_sglangs(tmp_path: Path) -> None:
    """The same accepted-draft sequences through SGLang's AdaptiveSpeculativeParams and ours: the same
    step count after every verify, for mixed batch sizes and acceptance that drifts."""
    mod = pytest.importorskip("sglang.srt.speculative.adaptive_spec_params", reason="the sglang extra is not installed")
    config = {"1": {"candidate_steps": [1, 2, 4, 6], "down_hysteresis": -0.1, "ceiling_coeff": 1.5},
              "16": {"candidate_steps": [0, 1, 3]}, "ema_alpha": 0.3, "warmup_batches": 4, "update_interval": 3}
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(config))
    for cfg in (None, config):
        theirs_src = str(path) if cfg is not None else None
        for seed in range(4):
            rng = random.Random(seed)
            theirs = mod.AdaptiveSpeculativeParams(initial_steps=1 if cfg else 3, cfg_path=theirs_src)
            ours = spec_adaptive.AdaptiveSpeculativeParams(1 if cfg else 3, str(path) if cfg else None)
            for i in range(1500):
                bs = rng.choice([1, 3, 8, 20, 40, 70])
                steps = theirs.get_steps_for_batch(bs)
                assert ours.steps_for_batch(bs) == steps, (seed, i)
                alpha = (0.95, 0.5, 0.15)[(i // 200) % 3]
                correct = []
                for _ in range(bs):
                    k = 0
                    while k < steps and rng.random() < alpha:
                        k += 1
                    correct.append(k)
                assert ours.on_verify_complete(correct, bs) == theirs.on_verify_complete(correct, bs), (seed, i)
            assert ours.switches > 5, "the sequences exercise switching"
