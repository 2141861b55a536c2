"""EAGLE3 draft vocabulary maps: `d2t` (draft id -> target id offset) and `t2d` (target id in draft?).

Trainers build them as `hot = sorted(used target ids)`, `d2t = hot - arange`, `t2d[hot] = True`; SGLang
loads `hot_token_id = d2t + arange(len(d2t))` and never checks it. A broken map makes every draft
proposal a different token than the draft meant, which shows up only as a collapsed acceptance rate.
"""

from __future__ import annotations

from collections.abc import Sequence

from infer_ctl.core.findings import Finding
from infer_ctl.core.tokenizer.model import TokenizerFacts
from infer_ctl.core.tokenizer.structure import Pair, show

CHECK = "tokenizer.vocab_map"
REBUILD = "rebuild d2t/t2d from the draft's training vocabulary (hot = sorted target ids; d2t = hot - arange)"

# end-of-turn / reasoning markers a chat model must be able to propose even when they are not stop ids
_TURN_MARKERS = ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<|EOT|>", "</think>",
                 "<|endoftext|>", "<｜end▁of▁sentence｜>")


def target_vocab_rows(target: TokenizerFacts, draft: TokenizerFacts) -> int | None:
    for cfg in (target.config, draft.config):
        if cfg is not None and cfg.vocab_size is not None:
            return cfg.vocab_size
    return (target.max_id + 1) if target.max_id is not None else None


def stop_ids(target: TokenizerFacts) -> dict[int, str]:
    """Ids the target stops on: generation_config eos list, its tokenizer eos, config.json eos."""
    ids: dict[int, str] = {}
    for i in target.generation_eos or ():
        ids[i] = "generation_config eos"
    eos = target.token_id(target.special_tokens.get("eos_token"))
    if eos is not None:
        ids.setdefault(eos, "eos_token")
    for i in target.config.eos_token_id if target.config else ():
        ids.setdefault(i, "config.json eos")
    return ids


def _first_break(hot: Sequence[int]) -> int | None:
    for i in range(1, len(hot)):
        if hot[i] <= hot[i - 1]:
            return i
    return None


def judge_missing_map(p: Pair) -> list[Finding]:
    """A draft lm_head smaller than the target vocabulary needs a map, or its ids are read as target ids."""
    cfg = p.draft.config
    rows = target_vocab_rows(p.target, p.draft)
    if cfg is None or cfg.draft_vocab_size is None or rows is None or cfg.draft_vocab_size >= rows:
        return []
    if cfg.weights_format == "pytorch":
        return [Finding.skip(CHECK, p.node, "d2t/t2d",
                             "the draft's weights are pickled (*.bin/*.pt), which inferctl does not load; "
                             "its d2t/t2d maps are not verified",
                             remedy="convert the checkpoint to safetensors to have the maps checked")]
    if cfg.weights_format is None:
        return [Finding.skip(CHECK, p.node, "d2t/t2d", "the draft directory has no weights; maps not verified")]
    unreadable = sorted(n for n in p.draft.problems if n.endswith((".safetensors", ".index.json")))
    if unreadable:
        return [Finding.unknown(CHECK, p.node, "d2t/t2d",
                                f"the draft's weights could not be read ({', '.join(unreadable)}; see tokenizer.files), "
                                "so whether a d2t map exists is not known",
                                remedy="restore the checkpoint files, then rerun")]
    return [Finding.fail(
        CHECK, p.node, "d2t",
        f"draft_vocab_size {cfg.draft_vocab_size} is smaller than the target vocabulary ({rows}) but the "
        "checkpoint has no d2t map: draft ids would be taken as target ids",
        remedy=REBUILD)]


def judge_vocab_map(p: Pair) -> list[Finding]:
    vm = p.draft.vocab_map
    if vm is None:
        return judge_missing_map(p)
    node = p.node
    findings: list[Finding] = [
        Finding.fail(CHECK, node, "d2t/t2d", f"cannot read the vocabulary map: {problem}",
                     remedy="re-export the draft checkpoint; d2t must be int64 and t2d bool") for problem in vm.problems
    ]
    rows = target_vocab_rows(p.target, p.draft)
    cfg = p.draft.config
    draft_vocab = cfg.draft_vocab_size if cfg and cfg.draft_vocab_size is not None else None
    hot: list[int] | None = None
    if vm.d2t is not None:
        hot = [d + i for i, d in enumerate(vm.d2t)]
        problems: list[str] = []
        if vm.d2t_dtype in ("BOOL", "U8"):
            problems.append(f"d2t has dtype {vm.d2t_dtype}; expected an integer offset per draft id (I64)")
        if vm.d2t_shape is not None and len(vm.d2t_shape) != 1:
            problems.append(f"d2t has shape {list(vm.d2t_shape)}; expected 1-D: SGLang adds "
                            "arange(shape[0]) to it, which broadcasts a non-1-D map into garbage")
        if (brk := _first_break(hot)) is not None:
            problems.append(f"d2t + arange is not strictly increasing at draft id {brk} "
                            f"({hot[brk - 1]} then {hot[brk]}): the map has duplicates or is unsorted")
        bad = [(i, h) for i, h in enumerate(hot) if h < 0 or (rows is not None and h >= rows)]
        if bad:
            problems.append(f"{len(bad)} draft id(s) map outside the target vocabulary [0, {rows}); first: "
                            f"draft id {bad[0][0]} -> {bad[0][1]}")
        if draft_vocab is not None and len(hot) != draft_vocab:
            problems.append(f"d2t has {len(hot)} entries but config.json draft_vocab_size is {draft_vocab}")
        if cfg and cfg.lm_head_rows is not None and len(hot) != cfg.lm_head_rows:
            problems.append(f"d2t has {len(hot)} entries but the draft lm_head has {cfg.lm_head_rows} rows")
        if problems:
            findings.append(Finding.fail(CHECK, node, "d2t", problems[0],
                                         details={"problems": problems, "entries": len(hot)}, remedy=REBUILD))
        else:
            findings.append(Finding.ok(CHECK, node, "d2t",
                                       f"{len(hot)} draft ids map to unique, increasing target ids below {rows}"))
    if vm.t2d is not None:
        popcount = sum(vm.t2d)
        problems = []
        if vm.t2d_dtype != "BOOL":
            problems.append(f"t2d has dtype {vm.t2d_dtype}; expected BOOL")
        if vm.t2d_shape is not None and len(vm.t2d_shape) != 1:
            problems.append(f"t2d has shape {list(vm.t2d_shape)}; expected 1-D (one flag per target id)")
        if rows is not None and len(vm.t2d) != rows:
            problems.append(f"t2d has {len(vm.t2d)} entries but the target vocabulary has {rows}")
        expected = len(hot) if hot is not None else draft_vocab
        if expected is not None and popcount != expected:
            problems.append(f"t2d marks {popcount} target ids but the draft vocabulary has {expected}")
        if problems:
            findings.append(Finding.fail(CHECK, node, "t2d", problems[0],
                                         details={"problems": problems, "popcount": popcount}, remedy=REBUILD))
        else:
            findings.append(Finding.ok(CHECK, node, "t2d", f"{len(vm.t2d)} entries, {popcount} marked"))
        if hot is not None:
            marked = [i for i, v in enumerate(vm.t2d) if v]
            if marked != hot:
                first = next((i for i, (x, y) in enumerate(zip(marked, hot, strict=False)) if x != y),
                             min(len(marked), len(hot)))
                findings.append(Finding.fail(
                    CHECK, node, "d2t/t2d",
                    f"d2t and t2d disagree from draft id {first}: d2t says target id "
                    f"{hot[first] if first < len(hot) else '(none)'}, t2d says "
                    f"{marked[first] if first < len(marked) else '(none)'}",
                    details={"first_draft_id": first}, remedy=REBUILD))
            else:
                findings.append(Finding.ok(CHECK, node, "d2t/t2d", "d2t and t2d describe the same target ids"))
    if hot is not None:
        findings.extend(_judge_stop_tokens(p, set(hot)))
    return findings


def _judge_stop_tokens(p: Pair, hot: set[int]) -> list[Finding]:
    stops = stop_ids(p.target)
    missing = {i: why for i, why in stops.items() if i not in hot}
    markers = {p.target.token_id(m): m for m in _TURN_MARKERS}
    missing_markers = {i: m for i, m in markers.items() if i is not None and i not in hot and i not in stops}
    findings: list[Finding] = []
    vocab = p.target.vocab
    if missing:
        first = next(iter(missing))
        findings.append(Finding.fail(
            CHECK, p.node, "stop tokens",
            f"the target's stop id {first} {show(vocab[first] if first < len(vocab) else None)} "
            f"({missing[first]}) is outside the draft vocabulary: the draft can never propose the end of a turn",
            details={"missing": {str(i): w for i, w in missing.items()}}, remedy=REBUILD + ", adding the stop ids"))
    if missing_markers:
        first = next(iter(missing_markers))
        findings.append(Finding.warn(
            CHECK, p.node, "turn markers",
            f"{show(missing_markers[first])} (id {first}) is outside the draft vocabulary; the draft cannot "
            "propose it and acceptance drops around it",
            details={"missing": {str(i): m for i, m in missing_markers.items()}},
            remedy=REBUILD + ", adding the chat/reasoning markers"))
    if not findings and stops:
        findings.append(Finding.ok(CHECK, p.node, "stop tokens",
                                   f"stop ids {sorted(stops)} are inside the draft vocabulary"))
    return findings
