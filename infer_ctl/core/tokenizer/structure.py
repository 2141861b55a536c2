"""Rules on the tokenizer definition itself: model, vocabulary, merges, added tokens, pipeline.

Severity follows one question: can this difference make the two sides turn the same text into different
ids (or the same id into different text)? Then it is a failure. If it only changes what a decoder prints
or what a library does with padding, it is a warning.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from infer_ctl.core.findings import Finding
from infer_ctl.core.tokenizer.model import AddedTokenFacts, TokenizerFacts

RETRAIN = "use the draft that was trained with the target's tokenizer (same tokenizer files), or retrain it"


@dataclass(frozen=True)
class Pair:
    """The two sides and where the finding belongs."""

    target: TokenizerFacts
    draft: TokenizerFacts
    node: str = "local"

    @property
    def subject(self) -> str:
        return "target vs draft"


def show(token: str | None) -> str:
    """A token as the user should read it: quoted, whitespace and control characters visible."""
    return "(none)" if token is None else repr(token)


def judge_model(p: Pair) -> list[Finding]:
    t, d = p.target, p.draft
    check = "tokenizer.model"
    if t.model_type != d.model_type and "tiktoken" in (t.source, d.source) and "BPE" in (t.model_type, d.model_type):
        # a .tiktoken rank file is a byte-level BPE without its pipeline: only the vocabulary compares
        return [Finding.warn(
            check, p.node, p.subject,
            f"the target is {t.model_type} ({t.source}), the draft {d.model_type} ({d.source}): compared by "
            "vocabulary only (a rank file has no normalizer, pre-tokenizer or special tokens to compare)",
            details={"target": t.model_type, "draft": d.model_type},
            remedy="compare the same format on both sides (convert the .tiktoken file with transformers' "
            "TikTokenConverter) to have merges, pipeline and special tokens checked")]
    if t.model_type != d.model_type:
        return [
            Finding.fail(
                check, p.node, p.subject,
                f"tokenizer models differ: target {t.model_type} ({t.source}), draft {d.model_type} ({d.source})",
                details={"target": t.model_type, "draft": d.model_type},
                remedy=RETRAIN,
            )
        ]
    keys = sorted(set(t.model_settings) | set(d.model_settings))
    diff = {k: [t.model_settings.get(k), d.model_settings.get(k)] for k in keys
            if t.model_settings.get(k) != d.model_settings.get(k)}
    if diff:
        first = next(iter(diff))
        return [
            Finding.fail(
                check, p.node, p.subject,
                f"{t.model_type} settings differ: {first} is {diff[first][0]!r} in the target, "
                f"{diff[first][1]!r} in the draft" + (f" (+{len(diff) - 1} more)" if len(diff) > 1 else ""),
                details={"differences": diff},
                remedy=RETRAIN,
            )
        ]
    return [Finding.ok(check, p.node, p.subject, f"same model: {t.model_type}",
                       details={"model_type": t.model_type, "settings": dict(t.model_settings)})]


_BLOCK = 2048


def _differing_ids(a: Sequence[str | None], b: Sequence[str | None], common: int) -> Iterator[int]:
    """Ids below `common` where the vocabularies differ. Blocks of ids compare as list slices in C and only a
    differing block is walked: the DeepSeek pair differs in a few of 129k ids, so this is ~60 slice compares,
    not a 129k-step Python loop."""
    for lo in range(0, common, _BLOCK):
        hi = min(lo + _BLOCK, common)
        if a[lo:hi] != b[lo:hi]:
            yield from (i for i in range(lo, hi) if a[i] != b[i])


def judge_vocab(p: Pair) -> list[Finding]:
    """Same id -> same token on both sides; ids present on only one side."""
    a, b = p.target.vocab, p.draft.vocab
    check = "tokenizer.vocab"
    common = min(len(a), len(b))
    findings: list[Finding] = []
    mismatched: list[int] = []
    only_target: list[int] = []
    only_draft: list[int] = []
    for i in _differing_ids(a, b, common):
        x, y = a[i], b[i]
        if x is None:
            only_draft.append(i)
        elif y is None:
            only_target.append(i)
        else:
            mismatched.append(i)
    only_target.extend(i for i in range(common, len(a)) if a[i] is not None)
    only_draft.extend(i for i in range(common, len(b)) if b[i] is not None)
    details = {
        "target_tokens": p.target.length,
        "draft_tokens": p.draft.length,
        "same_id_different_token": len(mismatched),
        "only_in_target": len(only_target),
        "only_in_draft": len(only_draft),
    }
    if mismatched:
        i = mismatched[0]
        examples = [{"id": j, "target": a[j], "draft": b[j]} for j in mismatched[:10]]
        # "moved" is the common near-miss (a newer release re-numbering reasoning tokens): say where to
        token = a[i]
        moved = p.draft.find(token) if token is not None else None
        findings.append(
            Finding.fail(
                check, p.node, f"id {i}",
                f"{len(mismatched)} id(s) map to different tokens; first: id {i} is {show(a[i])} in the "
                f"target, {show(b[i])} in the draft"
                + (f" (the draft has {show(a[i])} at id {moved})" if moved is not None else ""),
                details={**details, "examples": examples},
                remedy=RETRAIN,
            )
        )
    for side, ids, vocab, other in (
        ("target", only_target, a, "draft"),
        ("draft", only_draft, b, "target"),
    ):
        if not ids:
            continue
        # A tail beyond the other side's last id is an extension (a newer version adding tokens);
        # a hole inside the other side's range means the two were built differently.
        other_len = len(b) if side == "target" else len(a)
        tail = all(i >= other_len for i in ids)
        message = (
            f"{len(ids)} id(s) exist only in the {side}; first: id {ids[0]} = {show(vocab[ids[0]])}"
            + (f" (the {side} extends the {other}'s vocabulary)" if tail else "")
        )
        extra = {**details, "side": side, "first_ids": ids[:10],
                 "first_tokens": [vocab[i] for i in ids[:10]]}
        if tail:
            findings.append(Finding.warn(
                check, p.node, f"ids only in {side}", message, details=extra,
                remedy=f"tokens the {other} has never seen get poor draft acceptance; pair tokenizers of the same "
                "version if these tokens occur in your traffic"))
        else:
            findings.append(Finding.fail(check, p.node, f"ids only in {side}", message, details=extra,
                                         remedy=RETRAIN))
    if not findings:
        findings.append(Finding.ok(check, p.node, p.subject,
                                   f"same {p.target.length} tokens at the same ids", details=details))
    return findings


def judge_merges(p: Pair) -> list[Finding]:
    t, d = p.target, p.draft
    check = "tokenizer.merges"
    if t.merges_sha256 is None or d.merges_sha256 is None:
        return []  # not two BPE tokenizer.json files: a model or format difference is judge_model's
    if t.merges_sha256 == d.merges_sha256:
        return [Finding.ok(check, p.node, p.subject, f"same {len(t.merges)} merges",
                           details={"sha256": t.merges_sha256, "count": len(t.merges)})]
    first = next((i for i, (x, y) in enumerate(zip(t.merges, d.merges, strict=False)) if x != y),
                 min(len(t.merges), len(d.merges)))
    at_t = t.merges[first] if first < len(t.merges) else None
    at_d = d.merges[first] if first < len(d.merges) else None
    return [
        Finding.fail(
            check, p.node, f"merge {first}",
            f"merges differ ({len(t.merges)} vs {len(d.merges)}); first difference at rank {first}: "
            f"target {show(at_t)}, draft {show(at_d)}",
            details={"target_sha256": t.merges_sha256, "draft_sha256": d.merges_sha256,
                     "target_count": len(t.merges), "draft_count": len(d.merges), "first_rank": first,
                     "target": at_t, "draft": at_d},
            remedy=RETRAIN,
        )
    ]


def judge_added_tokens(p: Pair) -> list[Finding]:
    """Flags of added tokens present on both sides at the same id (content differences are the vocabulary's)."""
    check = "tokenizer.added_tokens"
    by_id_d = {tok.id: tok for tok in p.draft.added_tokens}
    split_diffs: list[tuple[AddedTokenFacts, dict[str, list[bool]]]] = []
    special_diffs: list[tuple[AddedTokenFacts, dict[str, list[bool]]]] = []
    # `normalized` chooses whether the token is matched before or after the normalizer; with no normalizer
    # on either side both are the same text (a Llama-3 tokenizer.json), so the flag alone changes nothing
    inert = {"special"}
    if p.target.source == p.draft.source == "tokenizer.json" and \
            p.target.pipeline.get("normalizer") is None and p.draft.pipeline.get("normalizer") is None:
        inert.add("normalized")
    for tok in p.target.added_tokens:
        other = by_id_d.get(tok.id)
        if other is None or other.content != tok.content:
            continue
        ft, fd = tok.flags(), other.flags()
        changed = {k: [ft[k], fd[k]] for k in ft if ft[k] != fd[k]}
        if changed:
            (split_diffs if set(changed) - inert else special_diffs).append((tok, changed))

    def examples(diffs: list[tuple[AddedTokenFacts, dict[str, list[bool]]]]) -> list[dict[str, object]]:
        return [{"id": tok.id, "content": tok.content, "flags": changed} for tok, changed in diffs[:10]]

    findings: list[Finding] = []
    if split_diffs:
        tok, changed = split_diffs[0]
        flags = ", ".join(f"{k} {v[0]}->{v[1]}" for k, v in changed.items())
        findings.append(Finding.fail(
            check, p.node, f"id {tok.id}",
            f"{len(split_diffs)} added token(s) split text differently; first: {show(tok.content)} "
            f"(id {tok.id}): {flags} (target->draft)",
            details={"count": len(split_diffs), "examples": examples(split_diffs)},
            remedy="lstrip/rstrip/normalized/single_word change the ids of text next to the token; "
            + RETRAIN))
    if special_diffs:
        tok, changed = special_diffs[0]
        flags = ", ".join(f"{k} {v[0]}->{v[1]}" for k, v in changed.items())
        why = ("'special' changes only decode(skip_special_tokens=True) output"
               + ("; 'normalized' has no effect without a normalizer on either side" if "normalized" in inert else ""))
        findings.append(Finding.warn(
            check, p.node, f"id {tok.id}",
            f"{len(special_diffs)} added token(s) differ only in flags that do not change encoding; first: "
            f"{show(tok.content)} (id {tok.id}): {flags} (target->draft)",
            details={"count": len(special_diffs), "examples": examples(special_diffs), "why_harmless": why},
            remedy=f"{why} (the tokenizer.probes rows confirm it); align the flags to keep the files identical"))
    if not findings:
        findings.append(Finding.ok(check, p.node, p.subject,
                                   f"{len(p.target.added_tokens)} added tokens with the same flags"))
    return findings


# decoder differences change only the text printed from ids, which SGLang takes from the target anyway
_PIPELINE_SEVERITY = {"normalizer": "fail", "pre_tokenizer": "fail", "post_processor": "fail",
                      "decoder": "warn"}


def judge_pipeline(p: Pair) -> list[Finding]:
    findings: list[Finding] = []
    if p.target.source != "tokenizer.json" or p.draft.source != "tokenizer.json":
        return findings
    for section, severity in _PIPELINE_SEVERITY.items():
        check = f"tokenizer.{section}"
        a, b = p.target.pipeline.get(section), p.draft.pipeline.get(section)
        if a == b:
            findings.append(Finding.ok(check, p.node, p.subject, f"same {section}" if a else f"no {section} on either side"))
            continue
        message = f"{section} differs: target {_summary(a)}, draft {_summary(b)}"
        details = {"target": a, "draft": b}
        if severity == "fail":
            findings.append(Finding.fail(check, p.node, p.subject, message, details=details,
                                         remedy=f"the {section} changes the ids of the same text; " + RETRAIN))
        else:
            findings.append(Finding.warn(check, p.node, p.subject, message, details=details,
                                         remedy="only detokenised text differs; SGLang decodes with the target's "
                                         "tokenizer, so this matters only if draft text is shown"))
    return findings


def _summary(section: str | None) -> str:
    if section is None:
        return "(none)"
    return section if len(section) <= 120 else section[:117] + "..."


def judge_padding(p: Pair) -> list[Finding]:
    """Embedded padding/truncation: inferctl turns them off to compare, but users of raw encode get them."""
    findings: list[Finding] = []
    for side in (p.target, p.draft):
        for name, value in (("padding", side.padding), ("truncation", side.truncation)):
            if value is not None:
                findings.append(Finding.warn(
                    "tokenizer.padding", p.node, side.label,
                    f"the {side.label}'s tokenizer.json embeds {name} {_summary(value)}; raw encodes are "
                    f"{'padded' if name == 'padding' else 'truncated'} (compared here with it turned off)",
                    details={name: value},
                    remedy=f"remove the {name} section from tokenizer.json, or call no_{name}() before encoding"))
    return findings


def judge_config(p: Pair) -> list[Finding]:
    """tokenizer_config.json class and flags: transformers builds a different wrapper around the same
    tokenizer.json (LlamaTokenizerFast rewrites the post-processor from add_bos_token, `legacy` changes
    SentencePiece conversion, clean_up_tokenization_spaces changes decoded text)."""
    check = "tokenizer.config"
    diffs: dict[str, list[object]] = {}
    if p.target.tokenizer_class != p.draft.tokenizer_class and None not in (p.target.tokenizer_class,
                                                                           p.draft.tokenizer_class):
        diffs["tokenizer_class"] = [p.target.tokenizer_class, p.draft.tokenizer_class]
    for key in sorted(set(p.target.config_flags) & set(p.draft.config_flags)):
        a, b = p.target.config_flags[key], p.draft.config_flags[key]
        if a != b:
            diffs[key] = [a, b]
    if not diffs:
        return [Finding.ok(check, p.node, p.subject, "same tokenizer_config class and flags")]
    first = next(iter(diffs))
    return [Finding.warn(
        check, p.node, p.subject,
        f"tokenizer_config differs: {first} is {diffs[first][0]!r} in the target, {diffs[first][1]!r} in the draft"
        + (f" (+{len(diffs) - 1} more)" if len(diffs) > 1 else ""),
        details={"differences": diffs},
        remedy="the tokenizer.probes rows show whether encoding differs; align tokenizer_config.json with the target's "
        "to rule out library-dependent behaviour")]
