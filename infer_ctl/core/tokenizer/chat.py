"""Chat templates: compare by hash, then by what they render for one fixed conversation.

Rendering mirrors transformers' `apply_chat_template` environment (sandboxed Jinja2, `raise_exception`,
`strftime_now`, a `tojson` that keeps non-ASCII text), without importing transformers.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from infer_ctl.core.findings import Finding
from infer_ctl.core.tokenizer.model import TokenizerFacts
from infer_ctl.core.tokenizer.structure import Pair

CHECK = "tokenizer.chat_template"

SAMPLE_CONVERSATION: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Hi! Résumé in 中文, please 👋🏽"},
    {"role": "assistant", "content": "Sure.  Here it is:\n\t- 简历"},
    {"role": "user", "content": 'Now as JSON: {"a": [1, 2.5e3]}'},
)


class TemplateRenderError(Exception):
    pass


def _raise(message: str) -> None:
    raise TemplateRenderError(message)


@lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    """Compiling a real template costs ~50 ms and the comparison renders the same one up to three times."""
    # the same environment transformers builds: {% break %}/{% continue %} appear in real templates
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime(2026, 1, 1).strftime(fmt)  # fixed: renders comparable
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    return env.from_string(template)


def render_chat(template: str, facts: TokenizerFacts, messages: tuple[dict[str, str], ...] = SAMPLE_CONVERSATION,
                add_generation_prompt: bool = True) -> str:
    specials: dict[str, Any] = {k: v or "" for k, v in facts.special_tokens.items()}
    try:
        compiled = _compile(template)
        try:
            return compiled.render(messages=list(messages), add_generation_prompt=add_generation_prompt, **specials)
        except TemplateRenderError:
            # some templates refuse a system message; the comparison needs any rendering, not that one
            rest = tuple(m for m in messages if m["role"] != "system")
            return compiled.render(messages=list(rest), add_generation_prompt=add_generation_prompt, **specials)
    except (TemplateError, TemplateRenderError, TypeError, ValueError, KeyError) as exc:
        raise TemplateRenderError(f"{type(exc).__name__}: {exc}") from exc


def template_sha(template: str | None) -> str | None:
    return None if template is None else hashlib.sha256(template.encode()).hexdigest()


def first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def excerpt(text: str, at: int, width: int = 30) -> str:
    return repr(text[max(0, at - width // 2): at + width])


def rendered_diff(a: str, b: str) -> list[str]:
    """A unified diff of two renderings, line by line with whitespace made visible (a template that differs
    only in a space or newline is the common case, and invisible in plain text)."""
    lines = difflib.unified_diff([repr(x) for x in a.splitlines(keepends=True)],
                                 [repr(x) for x in b.splitlines(keepends=True)],
                                 "target", "draft", lineterm="", n=1)
    return list(lines)[:40]


def judge_chat_template(p: Pair) -> list[Finding]:
    t, d = p.target.chat_template, p.draft.chat_template
    details = {"target_sha256": template_sha(t), "draft_sha256": template_sha(d),
               "target_source": p.target.chat_template_source, "draft_source": p.draft.chat_template_source}
    if t is None and d is None:
        return [Finding.ok(CHECK, p.node, p.subject, "no chat template on either side", details=details)]
    if d is None:
        return [Finding.ok(CHECK, p.node, p.subject,
                           "the draft ships no chat template; SGLang renders prompts with the target's",
                           details=details)]
    if t is None:
        return [Finding.warn(CHECK, p.node, p.subject,
                             "only the draft has a chat template; chat requests to the target have none",
                             details=details,
                             remedy="give the target directory the chat template it was trained with")]
    if t == d:
        return [Finding.ok(CHECK, p.node, p.subject, "same chat template", details=details)]
    rendered: dict[str, str] = {}
    for side, template in ((p.target, t), (p.draft, d)):
        try:
            rendered[side.label] = render_chat(template, side)
        except TemplateRenderError as exc:
            return [Finding.warn(CHECK, p.node, p.subject,
                                 f"chat templates differ and the {side.label}'s fails to render: {exc}",
                                 details=details,
                                 remedy=f"fix the {side.label}'s chat template"
                                 + ("; SGLang would fail the same request" if side is p.target else
                                    " (SGLang serves with the target's, so only its provenance is in doubt)"))]
    rt, rd = rendered["target"], rendered["draft"]
    if rt == rd:
        return [Finding.warn(CHECK, p.node, p.subject,
                             "chat template text differs but renders the sample conversation identically",
                             details={**details, "rendered": rt},
                             remedy="harmless for this sample; copy the target's template to the draft to be sure")]
    at = first_difference(rt, rd)
    return [Finding.warn(
        CHECK, p.node, p.subject,
        f"chat templates render differently from character {at}: target {excerpt(rt, at)}, draft {excerpt(rd, at)}",
        details={**details, "target_rendered": rt, "draft_rendered": rd, "first_difference": at,
                 "rendered_diff": rendered_diff(rt, rd)},
        remedy="the draft was trained on another prompt format, so acceptance suffers; use the target's template "
        "or a draft trained on it")]
