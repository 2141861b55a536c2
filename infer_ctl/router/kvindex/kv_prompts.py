"""The prompt as a worker sees it: its text in the worker's chat template, and the worker's tokenizer.

The exact index (core/routing/anchors.py) needs a prompt's token ids as the worker computes them. Which
tokenizer a fleet uses is read from a prefill's `/server_info`:

- a simulated worker (`sim.tokenizer` "builtin"): the simulator's own tokenizer and Llama-3-style
  template (core/kvevents/sim_tokenizer.py, the code the simulator runs), special tokens never added;
- a simulated worker with a `tokenizer.json` (`sim.tokenizer` a path): that file, no special tokens
  (sim/tokenizer.py `FileTokenizer`), the simulator's template;
- a real SGLang worker: the target model's fast tokenizer (`tokenizer.json` in the directory the router
  is given, `tokenizer_path`, by default the profile's `models.target.path`) with its chat template from
  `tokenizer_config.json`; `/generate` text gets the special tokens HF's `encode` adds (SGLang's
  tokenizer manager calls `tokenizer.encode(text)`), a chat prompt none beyond its template's.
  Not verified against a live SGLang server here (no GPU): the anchors' resume check and the reported
  cached tokens (`inferctl router workers`: exact vs predicted) are where a mismatch would show.

Without a usable tokenizer the fleet stays on the predicted index, and the start-up log says why.

`view(endpoint, body, routing_text)` gives the worker's text and, for chat, where each routing-text
block's knowledge ends in it. The router's routing text renders a message as its content followed by
its role (core/routing/prompt.py) while a template puts the role first, so a chat's blocks are keyed
with the roles of the messages so far (`ChatKeys`): block k inside message i then determines the
worker's text up to as far into message i's content.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from infer_ctl.core.kvevents.sim_tokenizer import BuiltinTokenizer, message_text
from infer_ctl.core.kvevents.sim_tokenizer import render_chat as sim_render_chat

log = logging.getLogger("infer_ctl.router.kv")


class SimBuiltin:
    """The simulator's built-in tokenizer."""

    name = "builtin"

    def __init__(self) -> None:
        self._tok = BuiltinTokenizer()

    def encode_with_ends(self, text: str, start: bool) -> tuple[list[int], list[int]]:
        return self._tok.encode_with_ends(text)


class HfTokenizer:
    """A `tokenizer.json` through the `tokenizers` library (Rust; offsets give each token's end)."""

    def __init__(self, path: str, *, special_tokens: bool) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(path)
        self.name = path
        self.special_tokens = special_tokens

    def encode_with_ends(self, text: str, start: bool) -> tuple[list[int], list[int]]:
        # encode_batch, not encode: it releases the GIL while it runs (tokenizers' Rust, under
        # allow_threads; encode holds it: a 1 MB prompt held every other thread 2.2 s), so the anchoring
        # thread (kv_routing.py) never stalls the event loop
        enc = self._tok.encode_batch([text], add_special_tokens=start and self.special_tokens)[0]
        return list(enc.ids), [e for _, e in enc.offsets]

    def for_chat(self) -> HfTokenizer:
        """The same tokenizer adding no special tokens: a chat template writes its own (SGLang tokenizes
        the rendered conversation with HF's apply_chat_template, which adds none)."""
        if not self.special_tokens:
            return self
        out = object.__new__(HfTokenizer)
        out._tok, out.name, out.special_tokens = self._tok, self.name, False
        return out


class IdsTokenizer:
    """`input_ids` prompts: the routing text is the ids written as `1,2,3,` (core/routing/prompt.py)."""

    name = "input_ids"

    def encode_with_ends(self, text: str, start: bool) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        ends: list[int] = []
        pos = 0
        for piece in text.split(",")[:-1]:
            pos += len(piece) + 1
            try:
                ids.append(int(piece))
            except ValueError:
                break
            ends.append(pos)
        return ids, ends


def chat_layout(messages: list[Any]) -> tuple[list[int], list[int], list[str], list[int]]:
    """Where each message's content starts and ends in the routing text (core/routing/prompt.py renders
    a message as its content, then `\n<|role|>\n`), and a key of the roles up to each message."""
    starts: list[int] = []
    ends: list[int] = []
    contents: list[str] = []
    role_keys: list[int] = []
    r = 0
    roles: tuple[Any, ...] = ()
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = message_text(m.get("content"))
        role = m.get("role", "")
        roles = (*roles, str(role))
        starts.append(r)
        ends.append(r + len(content))
        contents.append(content)
        role_keys.append(hash(roles) & 0x7FFF_FFFF_FFFF_FFFF)
        r += len(content) + len(f"\n<|{role}|>\n")
    return starts, ends, contents, role_keys


class ChatKeys(Sequence[int]):
    """A chat's block chain keyed with the roles so far: the routing text gives a message's role after
    its content, but the worker's template puts it first, so a block inside message i says what the
    worker's text is only together with the roles of messages 0..i."""

    __slots__ = ("_block", "_hashes", "_roles", "_starts")

    def __init__(self, hashes: Sequence[int], starts: list[int], role_keys: list[int], block_chars: int) -> None:
        self._hashes, self._starts, self._roles, self._block = hashes, starts, role_keys, block_chars

    def __len__(self) -> int:
        return len(self._hashes)

    def __getitem__(self, k: int) -> int:  # type: ignore[override]  # ints only: no slices
        i = bisect.bisect_right(self._starts, (k + 1) * self._block - 1) - 1
        return self._hashes[k] ^ self._roles[max(i, 0)] if self._roles else self._hashes[k]

    def materialize(self) -> list[int]:
        return [self[k] for k in range(len(self))]


def _chat_ends(messages: list[Any], worker_text: str, n_blocks: int, block_chars: int) -> list[int]:
    """Per routing-text block (keyed with the roles, `ChatKeys`), where its knowledge of the worker's
    text ends: inside a message's content, as far into that content; past it (in its role), the
    content's end. Contents are found in order in the worker's text; a template that rewrites a content
    stops the mapping there (later blocks know no more than the last content found)."""
    starts, ends, contents, _ = chat_layout(messages)
    where: list[int] = []  # where each content starts in the worker's text
    w = 0
    for content in contents:
        at = worker_text.find(content, w) if content else w
        if at < 0:
            break
        where.append(at)
        w = at + len(content)
    out: list[int] = []
    for k in range(n_blocks):
        e = (k + 1) * block_chars
        i = bisect.bisect_right(starts, e - 1) - 1
        if i < 0:
            out.append(0)
        elif i >= len(where):
            out.append(where[-1] + len(contents[len(where) - 1]) if where else 0)
        else:
            out.append(where[i] + min(e, ends[i]) - starts[i])
    return out


class PromptView:
    """One fleet's tokenizer and chat template."""

    def __init__(self, tokenizer: Any, *, template: Any = None, name: str = "") -> None:
        self.tokenizer = tokenizer
        #: messages -> the worker's prompt text (None: the simulator's template)
        self.template = template
        self.name = name or tokenizer.name
        self.ids = IdsTokenizer()

    def render(self, messages: list[Any]) -> str | None:
        if self.template is None:
            return sim_render_chat([m for m in messages if isinstance(m, dict)])
        out = self.template(messages)
        return out if isinstance(out, str) else None

    def view(self, endpoint: str, body: dict[str, Any], text: str, n_blocks: int,
             block_chars: int) -> tuple[str, Sequence[int] | None, Any] | None:
        """(worker text, block ends or None, tokenizer) of one request, or None to skip it."""
        if endpoint.endswith("/chat/completions"):
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return None
            worker = self.render(msgs)
            if worker is None:
                return None
            tok = self.tokenizer.for_chat() if isinstance(self.tokenizer, HfTokenizer) else self.tokenizer
            return worker, _chat_ends(msgs, worker, n_blocks, block_chars), tok
        if not endpoint.endswith("/completions") and body.get("text") is None and body.get("input_ids") is not None:
            return text, None, self.ids
        return text, None, self.tokenizer


def _hf_template(model_dir: str) -> Any:
    """The model's chat template as a callable, or None without one: `chat_template.jinja` beside the
    tokenizer (the layout current model repositories use; transformers, and so SGLang, prefer it over the
    config key), else `tokenizer_config.json`'s `chat_template`."""
    path = os.path.join(model_dir, "tokenizer_config.json")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        cfg = {}
    if not isinstance(cfg, dict):
        cfg = {}
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):  # named templates: the default one
        tpl = next((t.get("template") for t in tpl if isinstance(t, dict) and t.get("name") == "default"), None)
    try:
        with open(os.path.join(model_dir, "chat_template.jinja"), encoding="utf-8") as f:
            tpl = f.read()
    except (OSError, UnicodeDecodeError):
        pass
    if not isinstance(tpl, str):
        return None
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined)

    def raise_exception(message: str) -> None:  # what HF's apply_chat_template gives templates
        raise jinja2.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    try:
        compiled = env.from_string(tpl)
    except jinja2.TemplateError as exc:  # SGLang starts with it (compiled per request): route on the prediction
        log.warning("the model's chat template does not compile: chat requests are routed on the predicted index",
                    extra={"model_dir": model_dir, "error": str(exc)})
        return None

    def token(name: str) -> str:
        v = cfg.get(name)
        return v.get("content", "") if isinstance(v, dict) else (v or "")

    bos, eos = token("bos_token"), token("eos_token")

    def render(messages: list[Any]) -> str | None:
        try:
            return compiled.render(messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos)
        except jinja2.TemplateError:  # a conversation the template refuses: that prompt stays predicted
            return None

    return render


def view_for(info: Any, tokenizer_path: str | None) -> tuple[PromptView | None, str]:
    """The prompt view for a fleet whose prefill reports `info` (/server_info), and why (a log line)."""
    if not isinstance(info, dict):
        return None, "no /server_info"
    sim = info.get("sim")
    if isinstance(sim, dict):
        name = sim.get("tokenizer")
        if name == "builtin":
            return PromptView(SimBuiltin(), name="sim builtin"), "the simulator's built-in tokenizer"
        if isinstance(name, str) and os.path.isfile(name):
            try:
                return PromptView(HfTokenizer(name, special_tokens=False)), f"the simulator's tokenizer {name}"
            except Exception as exc:  # the file is the simulator's; a bad one only costs exactness
                return None, f"cannot load the simulator's tokenizer {name}: {exc}"
        return None, f"the simulator's tokenizer {name!r} is not a file here"
    model_dir = tokenizer_path
    if not model_dir:
        return None, "no tokenizer_path (the target model's directory) to tokenize prompts as the workers do"
    path = model_dir if model_dir.endswith(".json") else os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None, f"no {path}"
    try:
        tok = HfTokenizer(path, special_tokens=True)
    except Exception as exc:
        return None, f"cannot load {path}: {exc}"
    template = _hf_template(os.path.dirname(path))
    if template is None:
        log.warning("the model has no chat template: chat requests are routed on the predicted index",
                    extra={"tokenizer": path})
        return PromptView(tok, template=lambda msgs: None), f"{path} (no chat template)"
    return PromptView(tok, template=template), path
