"""The text a request is routed on. For chat this is the whole rendered conversation, not only the first
message (sglang#26263: keying on the first message left 69 % hits where the conversation gave 96 %)."""

from __future__ import annotations

from typing import Any


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _ids_text(ids: list[Any]) -> str:
    # Prefix-preserving: the text of ids[:k] is a prefix of the text of ids. Token ids only: formatting
    # anything else recursed into it (a 1000-deep list raised RecursionError: a 500 for any client)
    if not all(type(t) is int for t in ids):
        return ""
    return "".join(f"{t}," for t in ids)


def render_chat(messages: list[Any]) -> str:
    parts = []
    for m in messages:
        if isinstance(m, dict):
            parts.append(f"{_content_text(m.get('content'))}\n<|{m.get('role', '')}|>\n")
    return "".join(parts)


def routing_text(endpoint: str, body: dict[str, Any]) -> str:
    """Deterministic, prefix-preserving text for the request's prompt ("" when it has none)."""
    if endpoint.endswith("/chat/completions"):
        msgs = body.get("messages")
        return render_chat(msgs) if isinstance(msgs, list) else ""
    if endpoint.endswith("/completions"):
        prompt = body.get("prompt")
    else:
        prompt = body.get("text")
        if prompt is None and body.get("input_ids") is not None:
            prompt = body.get("input_ids")
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return first
        if isinstance(first, list):
            return _ids_text(first)
        return _ids_text(prompt)
    return prompt if isinstance(prompt, str) else ""
