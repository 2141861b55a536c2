"""Three vocabulary numbers engines confuse: config vocab_size (embedding rows), len(tokenizer), max id.

SGLang and vLLM compare only the first; DeepSeek-V3 declares 129280 rows for a 128815-token tokenizer, so
equal sizes prove nothing and unequal ones may be harmless padding. What breaks is an id at or beyond the
rows of the model that must embed it, or an lm_head whose rows disagree with its config.
"""

from __future__ import annotations

from infer_ctl.core.findings import Finding, Status
from infer_ctl.core.tokenizer.model import TokenizerFacts
from infer_ctl.core.tokenizer.structure import Pair

CHECK = "tokenizer.vocab_size"


def _side_sizes(node: str, side: TokenizerFacts, tokenizer: TokenizerFacts) -> list[Finding]:
    """`tokenizer` is the side's own tokenizer, or the target's when the side ships none."""
    cfg = side.config
    if cfg is None:
        return []
    findings: list[Finding] = []
    max_id = tokenizer.max_id
    rows = cfg.vocab_size if cfg.vocab_size is not None else cfg.embed_rows
    details = {"config_vocab_size": cfg.vocab_size, "draft_vocab_size": cfg.draft_vocab_size,
               "tokenizer_length": tokenizer.length, "max_id": max_id,
               "lm_head_rows": cfg.lm_head_rows, "embed_rows": cfg.embed_rows,
               "tokenizer_from": tokenizer.label}
    if rows is not None and max_id is not None and max_id >= rows:
        findings.append(Finding.fail(
            CHECK, node, side.label,
            f"token id {max_id} ({'its' if tokenizer is side else 'the target'} tokenizer) is beyond the "
            f"{side.label}'s {rows} embedding rows: the model indexes out of range when it sees it",
            details=details,
            remedy=f"use a {side.label} checkpoint built for this tokenizer (vocab_size >= {max_id + 1})"))
    if cfg.embed_rows is not None and cfg.vocab_size is not None and cfg.embed_rows != cfg.vocab_size:
        findings.append(Finding.fail(
            CHECK, node, side.label,
            f"{cfg.embed_tensor} has {cfg.embed_rows} rows but config.json says vocab_size {cfg.vocab_size}",
            details=details, remedy="config.json does not describe these weights; fix vocab_size or the weights"))
    head_expected = cfg.draft_vocab_size if cfg.draft_vocab_size is not None else cfg.vocab_size
    if cfg.lm_head_rows is not None and head_expected is not None and cfg.lm_head_rows != head_expected:
        field = "draft_vocab_size" if cfg.draft_vocab_size is not None else "vocab_size"
        findings.append(Finding.fail(
            CHECK, node, side.label,
            f"{cfg.lm_head_tensor} has {cfg.lm_head_rows} rows but config.json says {field} {head_expected}",
            details=details,
            remedy="SGLang sizes the lm_head from config.json and fails or mis-maps on load; fix config.json"))
    if not findings:
        padding = (rows - (max_id + 1)) if rows is not None and max_id is not None else None
        findings.append(Finding.ok(
            CHECK, node, side.label,
            f"{rows} embedding rows hold ids up to {max_id}"
            + (f" ({padding} padding rows)" if padding else ""),
            details=details))
    return findings


def judge_sizes(p: Pair) -> list[Finding]:
    draft_tokenizer = p.draft if p.draft.has_tokenizer else p.target
    findings = _side_sizes(p.node, p.target, p.target) + _side_sizes(p.node, p.draft, draft_tokenizer)
    a = p.target.config.vocab_size if p.target.config else None
    b = p.draft.config.vocab_size if p.draft.config else None
    # A side that already fails explains the size difference; the padding warning would only repeat it.
    if a is not None and b is not None and a != b and not any(f.status is Status.FAIL for f in findings):
        findings.append(Finding.warn(
            CHECK, p.node, p.subject,
            f"config vocab_size differs: target {a}, draft {b} (padding: every id of the tokenizers fits both)",
            details={"target": a, "draft": b},
            remedy="a padding difference is harmless for EAGLE heads; STANDALONE drafts in SGLang refuse to "
            "start on unequal vocab_size"))
    return findings
