"""The whole comparison: which rules run for which pair of directories, in a stable order."""

from __future__ import annotations

from collections.abc import Sequence

from infer_ctl.core.findings import Finding
from infer_ctl.core.tokenizer.chat import judge_chat_template
from infer_ctl.core.tokenizer.model import Encoder, TokenizerFacts
from infer_ctl.core.tokenizer.probes import judge_probes
from infer_ctl.core.tokenizer.sizes import judge_sizes
from infer_ctl.core.tokenizer.specials import judge_config_ids, judge_generation_eos, judge_special_ids
from infer_ctl.core.tokenizer.structure import (
    Pair,
    judge_added_tokens,
    judge_config,
    judge_merges,
    judge_model,
    judge_padding,
    judge_pipeline,
    judge_vocab,
)
from infer_ctl.core.tokenizer.vocab_map import judge_vocab_map

FILES_CHECK = "tokenizer.files"


def describe(side: TokenizerFacts) -> str:
    if not side.has_tokenizer:
        return "no tokenizer files"
    return f"{side.source}, {side.model_type}, {side.length} tokens"


def judge_files(p: Pair) -> list[Finding]:
    findings = [
        Finding.fail(FILES_CHECK, p.node, f"{side.label} {name}", f"{side.path}/{name}: {reason}",
                     remedy=f"restore {name} from the model's original release; the server cannot load it either")
        for side in (p.target, p.draft)
        for name, reason in side.problems.items()
    ]
    if not p.target.has_tokenizer:
        findings.append(Finding.fail(
            FILES_CHECK, p.node, "target",
            f"the target directory {p.target.path} has no tokenizer (tokenizer.json, tokenizer.model or *.tiktoken)",
            remedy="point models.target.tokenizer_path (or --target) at the directory with the tokenizer files"))
        return findings
    files = {"target": dict(p.target.files), "draft": dict(p.draft.files)}
    if not p.draft.has_tokenizer and p.draft.config is None and not p.draft.problems:
        findings.append(Finding.fail(
            FILES_CHECK, p.node, "draft",
            f"the draft directory {p.draft.path} has no tokenizer, no config.json and no weights: it is not a "
            "model directory, and SGLang cannot load a draft from it",
            details=files,
            remedy="point models.draft.path (or --draft) at the draft checkpoint; an EAGLE head holds at least "
            "config.json and *.safetensors"))
    elif unusable(p.draft):
        pass  # its tokenizer files are broken (reported above); "uses the target's" would be untrue
    elif not p.draft.has_tokenizer:
        findings.append(Finding.ok(
            FILES_CHECK, p.node, p.subject,
            f"the draft ships no tokenizer, so it uses the target's ({describe(p.target)}); "
            "its vocabulary sizes are still checked",
            details=files))
    else:
        findings += _aux_files(p)
        same = p.target.files.get("tokenizer.json") is not None and \
            p.target.files.get("tokenizer.json") == p.draft.files.get("tokenizer.json")
        findings.append(Finding.ok(
            FILES_CHECK, p.node, p.subject,
            f"target: {describe(p.target)}; draft: {describe(p.draft)}"
            + ("; tokenizer.json files are byte-identical" if same else ""),
            details=files))
    return findings


# Files the comparison does not read when tokenizer.json is there, but a slow tokenizer or tiktoken would.
_AUX = ("tokenizer.model",)


def _aux_files(p: Pair) -> list[Finding]:
    names = [n for n in _AUX if n in p.target.files and n in p.draft.files]
    names += sorted(n for n in p.target.files if n.endswith(".tiktoken") and n in p.draft.files)
    return [
        Finding.warn(FILES_CHECK, p.node, name,
                     f"{name} differs between target and draft (sha256 {p.target.files[name][:12]} vs "
                     f"{p.draft.files[name][:12]}); SGLang's fast tokenizer reads tokenizer.json, slow "
                     "tokenizers read this file",
                     remedy=f"copy the target's {name} to the draft, or remove it if unused")
        for name in names
        if p.target.files[name] != p.draft.files[name] and p.target.source == "tokenizer.json"
    ]


def unusable(side: TokenizerFacts) -> bool:
    """The side ships a tokenizer that cannot be read (bad JSON, a file the library refuses): comparing its
    half-read structure would bury the one finding that matters under consequences of it."""
    return any(name in side.problems for name in _TOKENIZER_SOURCES) or any(
        name.endswith(".tiktoken") for name in side.problems)


_TOKENIZER_SOURCES = ("tokenizer.json", "tokenizer.model")


def compare_tokenizers(
    target: TokenizerFacts,
    draft: TokenizerFacts,
    *,
    target_encoder: Encoder | None = None,
    draft_encoder: Encoder | None = None,
    user_probes: Sequence[str] = (),
    user_probes_name: str = "user probes",
    node: str = "local",
) -> list[Finding]:
    """Every finding for one target/draft pair. Encoders are optional: without them probes are skipped."""
    p = Pair(target, draft, node)
    findings = judge_files(p)
    if not target.has_tokenizer:
        return findings
    pairwise = draft.has_tokenizer and not unusable(draft) and not unusable(target)
    if pairwise:
        findings += judge_model(p)
        findings += judge_vocab(p)
        findings += judge_merges(p)
        findings += judge_added_tokens(p)
        findings += judge_pipeline(p)
        findings += judge_padding(p)
        findings += judge_config(p)
        findings += judge_special_ids(p)
        findings += judge_generation_eos(p)
        findings += judge_chat_template(p)
    broken = [side.label for side in (target, draft) if unusable(side)]
    if broken:
        findings.append(Finding.skip(
            "tokenizer.probes", node, p.subject,
            f"structure comparison and encode/decode probes skipped: the {' and '.join(broken)} tokenizer could "
            "not be loaded (see tokenizer.files)",
            remedy="fix the tokenizer file named in tokenizer.files, then rerun"))
    findings += judge_config_ids(p)
    findings += judge_sizes(p)
    findings += judge_vocab_map(p)
    if pairwise:
        findings += judge_probes(p, target_encoder, draft_encoder, user_probes, user_probes_name)
    return findings
