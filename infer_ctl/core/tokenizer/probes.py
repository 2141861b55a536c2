"""Encode/decode probes: the behavioural proof that two tokenizers turn the same text into the same ids.

Structure rules can miss interactions (a flipped lstrip leaves the vocabulary identical, yet
"a <eos>" encodes to [67, 223, 1] vs [67, 1]), so every added token is also probed with whitespace on each
side. Probes are encoded in one batch per side; a 129k-token pair with ~6k probes takes well under a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infer_ctl.core.findings import Finding
from infer_ctl.core.tokenizer.chat import TemplateRenderError, render_chat
from infer_ctl.core.tokenizer.model import Encoder, TokenizerFacts
from infer_ctl.core.tokenizer.structure import RETRAIN, Pair, show

CHECK = "tokenizer.probes"

BUILTIN_PROBES: tuple[str, ...] = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "double  space and   triple",
    "  \t tabs\tand\u00a0nbsp  ",
    "line\nbreak\r\nCRLF\n\n\nblank lines",
    "café",  # NFC
    "cafe\u0301",  # NFD: the same word, decomposed
    "Ａｌｐｈａ full-width ＡＢＣ１２３",
    "中文分词测试：今天天气很好。",
    "日本語のテキストとカタカナ",
    "한국어 문장입니다",
    "emoji 👋🏽 family 👨‍👩‍👧 flag 🇩🇪",
    "1234567890 3.14159 -42 1e-9 0x1F 100000000000000000",
    "def f(x):\n    return {'a': x ** 2}  # comment\n",
    '{"key": "value", "list": [1, 2, {"n": null}], "esc": "\\u00e9\\n"}',
    "<html><body class=\"x\">&amp;</body></html>",
    "https://example.com/path?query=1&b=%20",
    "ÄÖÜ äöü ß Ωμέγα Привет мир",
    "\u200bzero\u200dwidth\ufeff",
    "a" * 64,
    "   ",
    "",
)

# a space before shows lstrip, after shows rstrip, glued letters show single_word; normalized shows in all
_AROUND = ("a {}", "{} b", "a{}b")


def added_token_probes(sides: Sequence[TokenizerFacts]) -> tuple[list[str], int]:
    """Every added token of either side that both vocabularies hold, with whitespace around it
    (lstrip/rstrip/single_word show here), and how many tokens were left out because one side lacks them:
    those encode differently by construction and tokenizer.vocab already reports them."""
    seen: dict[str, None] = {}
    for side in sides:
        for tok in side.added_tokens:
            seen.setdefault(tok.content, None)
    held = [set(side.vocab) for side in sides]
    shared = [c for c in seen if all(c in vocab for vocab in held)]
    return [pattern.format(content) for content in shared for pattern in _AROUND], len(seen) - len(shared)


@dataclass(frozen=True)
class Divergence:
    text: str
    target_ids: list[int]
    draft_ids: list[int]
    position: int

    def example(self) -> dict[str, object]:
        """The probe and a few ids either side of where it diverges (whole id lists can be long)."""
        window = slice(max(0, self.position - 3), self.position + 4)
        return {"text": self.text, "position": self.position, "window_start": window.start,
                "target_ids": self.target_ids[window], "draft_ids": self.draft_ids[window]}


def _divergences(texts: Sequence[str], a: list[list[int]], b: list[list[int]]) -> list[Divergence]:
    out: list[Divergence] = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            pos = next((k for k, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), min(len(x), len(y)))
            out.append(Divergence(texts[i], x, y, pos))
    return out


def _token(facts: TokenizerFacts, ids: list[int], pos: int) -> str:
    if pos >= len(ids):
        return "(end)"
    i = ids[pos]
    tok = facts.vocab[i] if 0 <= i < len(facts.vocab) else None
    return f"{i} {show(tok)}"


def _probe_set(p: Pair, name: str, texts: Sequence[str], enc_t: Encoder, enc_d: Encoder,
               extra: dict[str, object] | None = None) -> list[Finding]:
    if not texts:
        return []
    extra = extra or {}
    ids_t = enc_t.encode_batch(texts)
    ids_d = enc_d.encode_batch(texts)
    diverged = _divergences(texts, ids_t, ids_d)
    if diverged:
        d = diverged[0]
        return [Finding.fail(
            CHECK, p.node, name,
            f"{len(diverged)} of {len(texts)} probe(s) encode differently; first: {show(d.text[:80])} "
            f"diverges at token {d.position}: target {_token(p.target, d.target_ids, d.position)}, "
            f"draft {_token(p.draft, d.draft_ids, d.position)}",
            details={"probes": len(texts), "diverged": len(diverged),
                     "examples": [x.example() for x in diverged[:5]], **extra},
            remedy=RETRAIN)]
    # Same ids everywhere: check the text each side prints for them (the decoder and `special` flags).
    dec_t = enc_t.decode_batch(ids_t)
    dec_d = enc_d.decode_batch(ids_d)
    text_diffs = [(texts[i], x, y) for i, (x, y) in enumerate(zip(dec_t, dec_d, strict=True)) if x != y]
    if text_diffs:
        text, x, y = text_diffs[0]
        return [Finding.warn(
            "tokenizer.decode", p.node, name,
            f"{len(text_diffs)} probe(s) encode the same but decode differently; first: {show(text[:60])} -> "
            f"target {show(x[:60])}, draft {show(y[:60])}",
            details={"diverged": len(text_diffs), **extra},
            remedy="only detokenised text differs (decoder settings); SGLang prints the target's")]
    # decode(encode(x)) != x on both sides alike (NFC normalizers, stripped spaces) is not a parity issue
    lossy = sum(1 for x, src in zip(dec_t, texts, strict=True) if x != src)
    return [Finding.ok(CHECK, p.node, name, f"{len(texts)} probe(s) encode and decode identically",
                       details={"probes": len(texts), "lossy_round_trips_on_both_sides": lossy, **extra})]


def judge_probes(p: Pair, enc_t: Encoder | None, enc_d: Encoder | None,
                 user_probes: Sequence[str] = (), user_probes_name: str = "user probes") -> list[Finding]:
    if enc_t is None or enc_d is None:
        missing = p.target if enc_t is None else p.draft
        why = ("it ships no tokenizer" if not missing.has_tokenizer
               else "its tokenizer.json could not be loaded (see tokenizer.files)" if missing.source == "tokenizer.json"
               else f"its vocabulary comes from {missing.source}, and probes need tokenizer.json")
        return [Finding.skip(CHECK, p.node, p.subject,
                             f"encode/decode probes skipped for the {missing.label}: {why}")]
    findings = _probe_set(p, "built-in corpus", BUILTIN_PROBES, enc_t, enc_d)
    texts, one_sided = added_token_probes((p.target, p.draft))
    findings += _probe_set(p, "added tokens", texts, enc_t, enc_d,
                           {"tokens_only_on_one_side_not_probed": one_sided} if one_sided else None)
    if user_probes:
        findings += _probe_set(p, user_probes_name, list(user_probes), enc_t, enc_d)
    findings += _chat_probe(p, enc_t, enc_d)
    return findings


def _chat_probe(p: Pair, enc_t: Encoder, enc_d: Encoder) -> list[Finding]:
    """The sample conversation as SGLang serves it (rendered by the target's template, or the draft's when
    only it has one), encoded by both sides: the special tokens and whitespace of a real prompt. A draft
    template that renders differently is tokenizer.chat_template's warning, not a tokenizer divergence."""
    template = p.target.chat_template or p.draft.chat_template
    if template is None:
        return []
    source = p.target if p.target.chat_template else p.draft
    try:
        text = render_chat(template, source)
    except TemplateRenderError as exc:
        return [Finding.unknown(CHECK, p.node, "chat conversation",
                                f"the {source.label}'s chat template does not render: {exc}",
                                remedy="fix the chat template; SGLang would fail to render the same conversation")]
    return _probe_set(p, "chat conversation", [text], enc_t, enc_d, {"rendered_by": f"{source.label} template"})
