"""Server-sent-event helpers for relaying SGLang streams (`data: {json}\\n\\n` ... `data: [DONE]\\n\\n`)."""

from __future__ import annotations

from typing import Any

from infer_ctl.router.http.jsonio import DecodeError, dumps, loads, openai_error_type

DONE = b"data: [DONE]\n\n"


class EventSplitter:
    """Feeds raw stream bytes, yields complete events (without the blank-line terminator)."""

    def __init__(self) -> None:
        self._buf = b""

    @property
    def pending(self) -> bool:
        """Whether an incomplete event is buffered (the last feed ended inside one)."""
        return bool(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data
        if b"\r\n" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        parts = buf.split(b"\n\n")
        self._buf = parts.pop()
        return [p for p in parts if p]


def is_done(event: bytes) -> bool:
    """Whether an event (as EventSplitter yields it) is the stream's `data: [DONE]`."""
    return any(line.startswith(b"data:") and line[5:].strip() == b"[DONE]" for line in event.split(b"\n"))


def event_json(event: bytes) -> Any | None:
    """The JSON of a `data:` event, or None for [DONE], comments and non-JSON data."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload == b"[DONE]" or not payload:
                return None
            try:
                return loads(payload)
            except DecodeError:
                return None
    return None


def first_event_json(stream: bytes) -> Any | None:
    for event in EventSplitter().feed(stream + b"\n\n"):
        obj = event_json(event)
        if obj is not None:
            return obj
    return None


def data_event(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def error_event(status: int, message: str) -> bytes:
    return data_event({"error": {"message": message, "type": openai_error_type(status), "code": status}}) + DONE


def error_message(body: bytes) -> str:
    """The message of an error answer's body, for an error event: the router's own documents and
    OpenAI-style ones (`{"error": {"message"}}`), SGLang's (`{"message"}`, `{"error": "..."}`), else its
    text (at most 500 characters)."""
    try:
        obj = loads(body) if body else None
    except (DecodeError, ValueError, UnicodeDecodeError):
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
        if isinstance(obj.get("message"), str):
            return obj["message"]
    return body[:500].decode(errors="replace")
