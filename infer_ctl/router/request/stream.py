"""What a client was sent of one /generate stream, and the rewriting that makes a continuation read as
the rest of it (mid-stream recovery, recovery.py).

SGLang's /generate stream events carry `text`, `output_ids` and `meta_info.completion_tokens`. By default
text and ids are cumulative (each event holds everything so far); with `--incremental-streaming-output`
both are deltas. The ids' mode shows in the events themselves: cumulative ids number completion_tokens,
deltas fewer after the first event. The text's mode follows the ids' in SGLang; a stream with delta ids
whose every text extends the one before (the simulator's shape: cumulative text, delta ids) is taken as
cumulative text.
"""

from __future__ import annotations

from typing import Any


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


class StreamTrack:
    """Fed every JSON event the client was sent (`seen`, in the client's terms); after a recovery,
    rewrites the continuation's events (`rewrite`) into those terms before they are sent."""

    __slots__ = ("_base_ids", "_base_k", "_base_text", "_first_id", "_text_extends", "_texts", "completion", "failed",
                 "ids", "ids_delta", "prompt_ids", "recoveries", "refused", "text")

    def __init__(self, refused: str | None = None) -> None:
        #: why this request cannot be continued (recovery.refusal); None: it can, and events are tracked
        self.refused = refused
        self.ids: list[int] = []
        #: the client's whole text so far, under the cumulative-text reading and the delta reading
        self.text = ""
        self._texts = ""
        self.completion = 0
        #: None until an event showed which: ids are deltas (True) or cumulative (False)
        self.ids_delta: bool | None = None
        self._text_extends = True
        self._first_id: Any = None
        self.prompt_ids: list[int] | None = None
        self.recoveries = 0
        self.failed: set[str] = set()
        #: after a recovery: what the client had before the continuation's first event
        self._base_ids: list[int] = []
        self._base_text = ""
        self._base_k = 0

    @property
    def active(self) -> bool:
        return self.refused is None

    # ---- what was sent ----------------------------------------------------------------------------
    def seen(self, obj: Any) -> None:
        if not isinstance(obj, dict) or "error" in obj:
            return
        meta = obj.get("meta_info")
        c = _count(meta.get("completion_tokens")) if isinstance(meta, dict) else None
        out = obj.get("output_ids")
        if c is None or not isinstance(out, list):
            self.refused = self.refused or "no_token_ids"  # a worker that does not send them: no recovery
            return
        if self._first_id is None and isinstance(meta, dict):
            self._first_id = meta.get("id")
        if not out:
            pass  # a finishing event with no new token: shows no mode
        elif len(out) == c and self.ids_delta is not True:
            self.ids = list(out)
            if c > 1 and self.ids_delta is None and self.completion > 0:
                self.ids_delta = False  # a second event that holds everything: cumulative
        else:
            if self.ids_delta is None and self.completion > 0:
                self.ids_delta = True
            self.ids.extend(out)
        text = obj.get("text")
        if isinstance(text, str):
            if self.completion > 0 and not (text.startswith(self.text) and (len(text) > len(self.text) or not out)):
                self._text_extends = False
            self.text = text
            self._texts += text
        self.completion = c

    def client_text(self) -> str:
        """The text the client has so far."""
        return self.text if self.cumulative_text() else self._texts

    def cumulative_text(self) -> bool:
        return self.ids_delta is False or (self.ids_delta is True and self._text_extends)

    def shape(self) -> tuple[bool, bool] | None:
        """(ids are deltas, text is cumulative) once two events showed them, else None."""
        return None if self.ids_delta is None else (self.ids_delta, self.cumulative_text())

    def assume(self, shape: tuple[bool, bool]) -> None:
        """A stream cut after its first event showed neither mode: take another stream's (`shape`).
        SGLang's modes are a server flag (--incremental-streaming-output), one for a fleet; one event
        reads the same in every mode (its ids and text are everything so far), so only the
        continuation's rewriting depends on it."""
        if self.ids_delta is None and self.ids and len(self.ids) == self.completion:
            self.ids_delta, self._text_extends = shape

    def not_resumable(self, default_max: int, sp: Any) -> str | None:
        """Why what was sent cannot be continued from (None: it can)."""
        if self.refused is not None:
            return self.refused
        if not self.ids or self.ids_delta is None:
            return "too_early"  # one event shows neither mode, and no stream before it did (`assume`)
        if len(self.ids) != self.completion:
            return "ids_inconsistent"
        mnt = sp.get("max_new_tokens", default_max) if isinstance(sp, dict) else default_max
        if not isinstance(mnt, int) or mnt - len(self.ids) <= 0:
            return "budget_spent"
        return None

    # ---- the continuation -------------------------------------------------------------------------
    def resumed(self) -> None:
        """A continuation starts: its events are rewritten relative to what the client has now."""
        self.recoveries += 1
        self._base_ids = list(self.ids)
        self._base_text = self.client_text()
        self._base_k = len(self.ids)

    @property
    def rewriting(self) -> bool:
        return self.recoveries > 0

    def rewrite(self, obj: Any) -> Any:
        """A continuation's event as the rest of the client's stream: counts over the whole output, the
        cumulative fields with what was sent before, the first stream's id; `prompt_tokens` is the
        client's prompt (the continuation's includes the tokens already sent)."""
        if not isinstance(obj, dict) or "error" in obj:
            return obj
        k = self._base_k
        meta = obj.get("meta_info")
        if isinstance(meta, dict):
            meta = obj["meta_info"] = dict(meta)
            if (c := _count(meta.get("completion_tokens"))) is not None:
                meta["completion_tokens"] = c + k
            if (p := _count(meta.get("prompt_tokens"))) is not None:
                meta["prompt_tokens"] = max(0, p - k)
                if (cached := _count(meta.get("cached_tokens"))) is not None:
                    meta["cached_tokens"] = min(cached, meta["prompt_tokens"])
            fr = meta.get("finish_reason")
            if isinstance(fr, dict) and fr.get("type") == "length" and _count(fr.get("length")) is not None:
                meta["finish_reason"] = {**fr, "length": fr["length"] + k}
            if self._first_id is not None:
                meta["id"] = self._first_id
        if self.ids_delta is False and isinstance(obj.get("output_ids"), list):
            obj["output_ids"] = self._base_ids + obj["output_ids"]
        if self.cumulative_text() and isinstance(obj.get("text"), str):
            obj["text"] = self._base_text + obj["text"]
        return obj
