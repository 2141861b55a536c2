"""Block hashes of KV-cache pages, computed as SGLang 0.5.23 computes them for its KV events. Pure.

One function for both sides: the simulator hashes the pages it publishes with it, and the router hashes
the prompts it routes with it, so a prompt's blocks are found under the hashes a worker published.

SGLang hashes a radix node's pages as a SHA-256 chain (`get_hash_str` in sglang/srt/mem_cache/utils.py,
the C++ kernel in sglang/srt/mem_cache/cpp_utils/hash_binding.cpp):

    digest(page) = SHA-256(digest(previous page) || page bytes)     (no prefix for the first page)

where the page bytes are its token ids as little-endian uint32, or, when a page holds an id that does not
fit in 32 bits, the byte 0xff followed by the ids as little-endian uint64. An EAGLE worker keys its tree
by bigrams (token i, token i+1), hashed as the two ids in a row. The published block hash is the first
8 bytes of a page's digest read as a big-endian signed int64 (`hash_str_to_int64`).

The simulator's radix tree keys nodes by *units*: a token id, or on a bigram tree the pair packed into
one int (`pack_bigrams`), so the tree compares plain ints either way. A node keeps its pages' digests
as one `bytes` of 32 bytes per page: the chain continues from the last one, a split slices it.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
from array import array
from collections.abc import Sequence

DIGEST_LEN = 32
_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1
_WIDE_TAG = b"\xff"  # SGLang: an odd byte count tells wide (uint64) pages from uint32 ones
_LITTLE = sys.byteorder == "little"
try:
    # CPython's built-in SHA-256: the same digests as OpenSSL's, and for a 36-byte page of the chain
    # ~1.5x faster per call here (OpenSSL's EVP set-up dominates inputs this small). `_sha256` up to
    # Python 3.11, `_sha2` from 3.12; a build without either (--without-builtin-hashlib-hashes) uses hashlib's
    from _sha256 import sha256 as _sha256_small
except ImportError:  # pragma: no cover - another Python
    try:
        from _sha2 import sha256 as _sha256_small
    except ImportError:
        _sha256_small = hashlib.sha256


def pack_bigrams(tokens: Sequence[int]) -> list[int]:
    """The bigram units of `tokens` (len - 1 of them): (a, b) as a | b << 32, so that a unit's 8
    little-endian bytes are a and b as uint32, exactly a bigram page's bytes. Ids outside uint32 (never
    produced by a tokenizer) are kept as a tuple, which `unit_pair` and the wide hash path understand.

    On the scheduler's path for every prompt of an EAGLE worker, so it runs at C speed: the uint32
    bytes of the tokens read as uint64 from offset 0 are the even bigrams, from offset 4 the odd ones."""
    n = len(tokens) - 1
    if n <= 0:
        return []
    try:
        if not _LITTLE:
            raise OverflowError
        raw = array("I", tokens).tobytes()  # refuses an id outside uint32
    except OverflowError:
        return [a | b << 32 if 0 <= a <= _U32 and 0 <= b <= _U32 else (a, b)  # type: ignore[misc]
                for a, b in itertools.pairwise(tokens)]  # fmt: skip
    even, odd = array("Q"), array("Q")
    even.frombytes(raw[: (n + 1) // 2 * 8])
    odd.frombytes(raw[4 : 4 + n // 2 * 8])
    out: list[int] = [0] * n
    out[0::2] = even.tolist()
    out[1::2] = odd.tolist()
    return out


def bigram_pairs(units: Sequence[int]) -> list[tuple[int, int]]:
    """`unit_pair` of every unit, as SGLang publishes an EAGLE page's `token_ids`."""
    try:
        words = array("Q", units)
    except (OverflowError, TypeError):
        return [unit_pair(u) for u in units]
    if not _LITTLE:
        return [unit_pair(u) for u in units]
    halves = array("I")
    halves.frombytes(words.tobytes())
    return list(zip(halves[0::2].tolist(), halves[1::2].tolist(), strict=True))


def unit_pair(unit: int | tuple[int, int]) -> tuple[int, int]:
    """The (token, next token) pair of one bigram unit, as SGLang publishes it in `token_ids`."""
    if isinstance(unit, tuple):
        return unit
    return unit & _U32, unit >> 32


def _le_bytes(words: Sequence[int], code: str) -> bytes:
    arr = array(code, words)
    if not _LITTLE:
        arr.byteswap()
    return arr.tobytes()


def _page_bytes(units: Sequence[int], bigram: bool) -> bytes:
    """One page as SGLang feeds it to SHA-256."""
    if bigram:
        words: list[int] = []
        for u in units:
            words.extend(unit_pair(u))
    else:
        words = list(units)
    if all(0 <= w <= _U32 for w in words):
        return _le_bytes(words, "I")
    # SGLang refuses negative ids; the simulator must never fail in its scheduler, so it hashes
    # their two's complement on the wide path instead (no real SGLang stream to agree with here)
    return _WIDE_TAG + _le_bytes([w & _U64 for w in words], "Q")


def page_digests(units: Sequence[int], page_size: int, prior: bytes | None, *, bigram: bool = False) -> bytes:
    """The chained digests of `units` cut into pages of `page_size` (the last one may be shorter),
    continuing from `prior` (the parent node's last page digest; None at the root)."""
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    width = 8 if bigram else 4
    try:  # fast path: every unit packs as-is; pages are then slices of one buffer
        buf = _le_bytes(units, "Q" if bigram else "I")
        step = page_size * width
        pages = [buf[i : i + step] for i in range(0, len(buf), step)]
    except (OverflowError, TypeError):
        pages = [_page_bytes(units[i : i + page_size], bigram) for i in range(0, len(units), page_size)]
    sha = _sha256_small
    # the chain in C's loop (accumulate): no prior is the empty prefix
    chain = itertools.accumulate(pages, lambda prev, data: sha(prev + data).digest(), initial=prior or b"")
    next(chain)
    return b"".join(chain)


def block_hashes(digests: bytes) -> list[int]:
    """Every page's block hash, at C speed: the digests read as int64s, every 4th one, byte-swapped."""
    words = array("q")
    words.frombytes(digests)
    if _LITTLE:
        words.byteswap()  # a digest's first 8 bytes are read big-endian
    return words[0 :: DIGEST_LEN // 8].tolist()


def last_digest(digests: bytes | None) -> bytes | None:
    """Where a child's chain continues from (None for an empty node, e.g. the root)."""
    if not digests:
        return None
    return digests[-DIGEST_LEN:]
