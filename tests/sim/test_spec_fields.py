"""The pure decoder of SGLang's speculative fields (`infer_ctl.core.routing.spec_fields`): shapes, errors,
the alpha estimate; and every name it reads checked against SGLang 0.5.23's own source (read as text
with `ast`, so nothing of SGLang runs), when the `sglang` package is installed."""

from __future__ import annotations

import ast
import importlib.util
import math
import random
from pathlib import Path

import pytest

from infer_ctl.core.routing import spec_fields as sf
from infer_ctl.core.sizing.spec import expected_tokens

META = {
    "id": "r1",
    "completion_tokens": 64,
    "spec_accept_rate": 0.6,
    "spec_accept_length": 64 / 20,
    "spec_num_correct_drafts": 36,
    "spec_num_proposed_drafts": 60,
    "spec_verify_ct": 20,
    "spec_correct_drafts_histogram": [4, 4, 4, 8],
}


def test_decode_meta_info_reads_every_field() -> None:
    f = sf.decode_meta_info(META)
    assert f == sf.SpecFields(20, 3.2, 0.6, 36, 60, (4, 4, 4, 8))
    assert f.drafts_per_verify == 3 and f.completion_tokens == 64
    # 36 accepted drafts, 12 steps stopped by a rejection (k < 3), 8 accepted all three
    assert f.alpha == pytest.approx(36 / (36 + 12))


@pytest.mark.parametrize("meta", [
    {"id": "r", "completion_tokens": 3},  # speculation off, or a non-final chunk, or a prefill's answer
    {**{k: 0 for k in sf.META_SCALARS}, "spec_correct_drafts_histogram": []},  # OpenAI SpecTokensDetails default
])
def test_no_spec_fields_is_none(meta: dict[str, object]) -> None:
    assert sf.decode_meta_info(meta) is None


@pytest.mark.parametrize(("meta", "message"), [
    ({"spec_verify_ct": 3}, "missing spec_accept_rate"),
    ({**META, "spec_verify_ct": "20"}, "spec_verify_ct must be a non-negative integer"),
    ({**META, "spec_accept_rate": math.nan}, "spec_accept_rate must be a non-negative number"),
    ({**META, "spec_correct_drafts_histogram": [1, -1]}, "must be a list of counts"),
    ({**META, "spec_correct_drafts_histogram": [1, 1]}, "histogram counts 2 steps"),
    ({"spec_accept_rate": 0.5}, "without spec_verify_ct"),
])
def test_malformed_fields_raise(meta: dict[str, object], message: str) -> None:
    with pytest.raises(sf.SpecFieldError, match=message):
        sf.decode_meta_info(meta)


def test_histogram_without_scalars_is_a_zero_step_server() -> None:
    """SGLang writes only the histogram when no draft was proposed (an adaptive server launched at 0)."""
    f = sf.decode_meta_info({"spec_correct_drafts_histogram": [7]})
    assert f is not None and f.verify_ct == 7 and f.num_proposed_drafts == 0 and f.alpha is None


@pytest.mark.parametrize(("alpha", "drafts"), [(0.88, 3), (0.42, 5), (0.7, 1)])
def test_alpha_estimates_recover_alpha_from_chain_draws(alpha: float, drafts: int) -> None:
    rng = random.Random(1)
    hist = [0] * (drafts + 1)
    for _ in range(50_000):
        k = 0
        while k < drafts and rng.random() < alpha:
            k += 1
        hist[k] += 1
    assert sf.alpha_from_histogram(hist, drafts) == pytest.approx(alpha, abs=0.006)
    mean = sum(k * n for k, n in enumerate(hist)) / sum(hist)
    assert sf.alpha_from_mean_correct(mean, drafts) == pytest.approx(alpha, abs=0.01)
    # SGLang's accept_rate is not alpha: E[accepted]/drafts is below it for chain drafts
    assert mean / drafts < alpha or drafts == 1


def test_mean_correct_inverse_and_edges() -> None:
    for a in (0.0, 0.3, 0.8, 0.99):
        assert sf.alpha_from_mean_correct(sf.expected_correct(a, 4), 4) == pytest.approx(a, abs=1e-9)
        assert sf.expected_correct(a, 4) + 1 == pytest.approx(expected_tokens(a, 4))
    assert sf.alpha_from_mean_correct(5.0, 4) == 1.0 and sf.alpha_from_mean_correct(-1, 4) == 0.0
    assert sf.alpha_from_mean_correct(1.0, 0) is None and sf.alpha_from_histogram([3], 0) is None


def test_tally_pools_requests_and_step_counts() -> None:
    t = sf.SpecTally()
    t.extend([sf.decode_meta_info(META), None, sf.SpecFields(10, 2.0, 0.2, 10, 50, (2, 6, 2))])
    assert t.requests == 2 and t.verify_ct == 30 and t.num_correct_drafts == 46
    assert t.accept_rate == pytest.approx(46 / 110)
    assert t.accept_length == pytest.approx((64 + 20) / 30)
    # pooled MLE: (36 + 10 accepted) / (46 + 12 rejections + 10 rejections), each with its own step count
    assert t.alpha == pytest.approx(46 / (46 + 12 + 10))
    only_means = sf.SpecTally()
    only_means.add(sf.SpecFields(100, 0, 0, int(100 * sf.expected_correct(0.6, 3)), 300))
    assert only_means.alpha == pytest.approx(0.6, abs=0.01)
    assert sf.SpecTally().alpha is None and sf.SpecTally().accept_rate is None


def test_generate_and_openai_response_shapes() -> None:
    batch = [{"text": "a", "meta_info": META}, {"text": "b", "meta_info": {"id": "x"}}]
    assert [f is not None for f in sf.decode_generate_response(batch)] == [True, False]
    assert sf.decode_generate_response({"text": "a", "meta_info": META})[0] == sf.decode_meta_info(META)
    details = {k: v for k, v in META.items() if k.startswith("spec_")}
    (one,) = sf.decode_openai_response({"choices": [], "sglext": {"spec_tokens_details": details}})
    assert one == sf.decode_meta_info(META)
    assert len(sf.decode_openai_response({"sglext": {"spec_tokens_details": [details, details]}})) == 2
    assert sf.decode_openai_response({"choices": []}) == []


def test_metrics_loads_and_server_info() -> None:
    text = "\n".join([
        "# HELP sglang:spec_accept_length Mean acceptance length",
        "# TYPE sglang:spec_accept_length gauge",
        'sglang:spec_accept_length{model_name="m",engine_type="decode",tp_rank="0"} 2.75',
        'sglang:spec_accept_length{model_name="m",engine_type="decode",tp_rank="1"} 9',
        'sglang:spec_accept_rate{model_name="m"} 0.58',
        'sglang:spec_num_steps{model_name="m"} 5',
        'sglang:spec_verify_calls_total{model_name="m"} 1234',
        "sglang:spec_accept_lengthX 7",
    ])
    g = sf.decode_metrics_text(text)
    assert g == sf.SpecGauges(accept_length=2.75, accept_rate=0.58, num_steps=5, num_draft_tokens=None,
                              verify_calls_total=1234)
    info = {"internal_states": [{"avg_spec_accept_length": 2.4, "speculative_num_steps": 1,
                                 "speculative_num_draft_tokens": 2, "speculative_adaptive": True}, {}]}
    assert sf.decode_server_info(info) == [sf.SpecInternalState(2.4, 1, 2, True),
                                           sf.SpecInternalState(None, None, None, None)]


# -- the names, against SGLang 0.5.23's source ------------------------------------------------------------
def _sglang_src() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        pytest.skip("the sglang package is not installed")
    return Path(spec.origin).parent / "srt"


def _function(path: Path, name: str) -> ast.AST:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"{name} not found in {path}")


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_meta_info_keys_are_the_ones_sglang_writes() -> None:
    fn = _function(_sglang_src() / "managers/tokenizer_manager.py", "_calculate_spec_decoding_metrics")
    written = {
        n.slice.value
        for n in ast.walk(fn)
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)
        and isinstance(n.value, ast.Name) and n.value.id == "meta_info" and isinstance(n.slice, ast.Constant)
    }
    # DSpark's cap/block fields are the rest (not modelled: EAGLE-class drafts only)
    assert written == {*sf.META_FIELDS, "spec_cap_length", "spec_block_accept_length", "spec_cap_lens_histogram"}
    details = _function(_sglang_src() / "entrypoints/openai/protocol.py", "SpecTokensDetails")
    assert set(sf.META_FIELDS) <= _strings(details) | {
        t.target.id for t in ast.walk(details) if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)}
    assert sf.OPENAI_REQUEST_FLAG in (_sglang_src() / "entrypoints/openai/protocol.py").read_text()


def test_metric_loads_and_internal_state_names_exist_in_sglang() -> None:
    src = _sglang_src()
    collector = _strings(ast.parse((src / "observability/metrics_collector.py").read_text()))
    assert set(sf.METRIC_NAMES) <= collector
    snap = _function(src / "managers/load_snapshot.py", "SpeculativeMetrics")
    fields = tuple(t.target.id for t in ast.walk(snap) if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name))
    assert fields == sf.LOADS_FIELDS
    to_dict = _function(src / "managers/load_snapshot.py", "to_dict")
    assert {sf.LOADS_SECTION, sf.LOADS_INCLUDE} <= _strings(to_dict)
    assert sf.INTERNAL_AVG_ACCEPT_LENGTH in _strings(_function(
        src / "managers/scheduler_components/internal_state.py", "_add_speculative"))
    switch = ast.unparse(_function(src / "speculative/eagle_worker_v2.py", "apply_runtime_state"))
    assert f"{sf.INTERNAL_NUM_STEPS}=" in switch and f"{sf.INTERNAL_NUM_DRAFT_TOKENS}=" in switch
