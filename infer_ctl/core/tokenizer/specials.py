"""Special and stop tokens: bos/eos/pad/unk ids, add_bos/add_eos, generation_config eos lists.

Ids, not names, are compared: a draft whose eos *name* matches but sits at another id proposes the wrong
stop token. generation_config.json is compared separately because it, not tokenizer.eos_token, is what
stops Llama-3-style chat models (`<|eot_id|>`; vllm#4180).
"""

from __future__ import annotations

from infer_ctl.core.findings import Finding
from infer_ctl.core.tokenizer.structure import RETRAIN, Pair, show

# pad is never generated, so a different pad id cannot change what is proposed or accepted
_SEVERITY = {"bos_token": "fail", "eos_token": "fail", "unk_token": "fail", "pad_token": "warn"}


def _named(token: str | None, token_id: int | None) -> str:
    if token is None:
        return "has none"
    return f"{show(token)} (id {token_id})" if token_id is not None else f"{show(token)} (not in its vocabulary)"


def judge_special_ids(p: Pair) -> list[Finding]:
    findings: list[Finding] = []
    rank_files = [side.label for side in (p.target, p.draft) if side.source == "tiktoken"]
    if rank_files:
        # a .tiktoken rank file holds no special tokens (they live in the model's Python code)
        return [Finding.skip("tokenizer.special_ids", p.node, p.subject,
                             f"special token ids not compared: the {' and '.join(rank_files)} tokenizer is a "
                             "tiktoken rank file, whose special tokens are defined in code",
                             remedy="compare tokenizer.json files (convert with transformers' TikTokenConverter) "
                             "to have bos/eos/pad ids checked")]
    for name, severity in _SEVERITY.items():
        check = "tokenizer.special_ids"
        tn, dn = p.target.special_tokens.get(name), p.draft.special_tokens.get(name)
        tid, did = p.target.token_id(tn), p.draft.token_id(dn)
        for side, text, tok_id in ((p.target, tn, tid), (p.draft, dn, did)):
            if text is not None and tok_id is None:
                findings.append(Finding.fail(
                    check, p.node, f"{side.label} {name}",
                    f"the {side.label}'s {name} {show(text)} is not in its vocabulary",
                    details={"token": text},
                    remedy="fix tokenizer_config.json/special_tokens_map.json to name a token of the vocabulary"))
        if tn is None and dn is None:
            continue
        # an unreadable tokenizer_config.json is already a tokenizer.files failure; do not guess its tokens
        if any(name_ is None and "tokenizer_config.json" in side.problems
               for side, name_ in ((p.target, tn), (p.draft, dn))):
            continue
        if tid == did:
            findings.append(Finding.ok(check, p.node, name, f"{name} {show(tn)} is id {tid} on both sides"))
            continue
        message = f"{name} differs: target {_named(tn, tid)}, draft {_named(dn, did)}"
        details = {"target": {"token": tn, "id": tid}, "draft": {"token": dn, "id": did}}
        if severity == "fail":
            findings.append(Finding.fail(check, p.node, name, message, details=details, remedy=RETRAIN))
        else:
            findings.append(Finding.warn(check, p.node, name, message, details=details,
                                         remedy="pad is not generated; align it only for batched training/eval"))
    for flag in ("add_bos_token", "add_eos_token"):
        a, b = getattr(p.target, flag), getattr(p.draft, flag)
        if a is None or b is None or a == b:
            continue
        findings.append(Finding.fail(
            "tokenizer.special_ids", p.node, flag,
            f"{flag} is {a} in the target, {b} in the draft: the draft was trained on prompts "
            f"{'with' if b else 'without'} that token",
            details={"target": a, "draft": b},
            remedy="a BOS/EOS convention mismatch shifts every position the draft sees; " + RETRAIN))
    return findings


def judge_generation_eos(p: Pair) -> list[Finding]:
    check = "tokenizer.generation_eos"
    a, b = p.target.generation_eos, p.draft.generation_eos
    if a is None and b is None:
        return [Finding.ok(check, p.node, p.subject, "no generation_config.json on either side")]
    if b is None:
        return [Finding.ok(check, p.node, p.subject,
                           f"the draft has no generation_config.json; the target's stop ids {list(a or ())} apply")]
    if a is None:
        return [Finding.warn(check, p.node, p.subject,
                             f"only the draft has generation_config.json (stop ids {list(b)}); the target will stop "
                             "on its tokenizer's eos only",
                             remedy="copy generation_config.json into the target directory if the model needs "
                             "more than one stop id")]
    if set(a) == set(b):
        return [Finding.ok(check, p.node, p.subject, f"same stop ids {sorted(a)}")]
    only_t = sorted(set(a) - set(b))
    only_d = sorted(set(b) - set(a))
    return [Finding.fail(
        check, p.node, p.subject,
        f"generation_config eos lists differ: target {list(a)}, draft {list(b)}"
        + (f"; only in target: {only_t}" if only_t else "") + (f"; only in draft: {only_d}" if only_d else ""),
        details={"target": list(a), "draft": list(b), "only_in_target": only_t, "only_in_draft": only_d},
        remedy="stop ids must match or the draft keeps proposing past the end of a turn; " + RETRAIN)]


def judge_config_ids(p: Pair) -> list[Finding]:
    """bos/eos ids in the draft's config.json against the target's: an EAGLE head ships no tokenizer, but
    its config still records the ids of the model it was trained against."""
    cfg = p.draft.config
    if cfg is None or not (cfg.bos_token_id or cfg.eos_token_id):
        return []
    target_cfg = p.target.config
    target_eos = set(p.target.generation_eos or ())
    target_eos |= set(target_cfg.eos_token_id if target_cfg else ())
    eos = p.target.token_id(p.target.special_tokens.get("eos_token"))
    if eos is not None:
        target_eos.add(eos)
    bos = p.target.token_id(p.target.special_tokens.get("bos_token"))
    target_bos = {bos} if bos is not None else set(target_cfg.bos_token_id if target_cfg else ())
    problems: list[str] = []
    stray_eos = sorted(set(cfg.eos_token_id) - target_eos)
    if stray_eos and target_eos:
        problems.append(f"eos_token_id {stray_eos} is not a stop id of the target ({sorted(target_eos)})")
    stray_bos = sorted(set(cfg.bos_token_id) - target_bos)
    if stray_bos and target_bos:
        problems.append(f"bos_token_id {stray_bos} is not the target's bos ({sorted(target_bos)})")
    check = "tokenizer.config_ids"
    if not problems:
        return [Finding.ok(check, p.node, "draft config.json", "bos/eos ids agree with the target")]
    return [Finding.warn(
        check, p.node, "draft config.json",
        f"the draft's config.json {problems[0]}" + (f"; {problems[1]}" if len(problems) > 1 else ""),
        details={"draft_bos": list(cfg.bos_token_id), "draft_eos": list(cfg.eos_token_id),
                 "target_bos": sorted(target_bos), "target_eos": sorted(target_eos)},
        remedy="SGLang uses the target's ids at run time, but a head whose config names other ids was probably "
        "trained against another base model; confirm its provenance")]
