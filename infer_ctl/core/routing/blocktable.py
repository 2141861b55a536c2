"""A set of 64-bit block hashes without a Python object per hash: one medium's blocks (core/routing/blocks.py). Pure.

A dict or set of ints costs ~90-100 bytes an entry (the int object and its slot): 3.2M blocks, what a
publisher flooding four media holds under `max_blocks` 4M, were 290-323 MB (issue 28). Here the hashes
are the slots of an `array('q')`: open addressing with linear probing, 8 bytes a slot, the table kept at
most half full and grown to a third full: 16-27 bytes a block (a table is sized for what a batch lists,
so a batch re-listing held blocks may leave it emptier).

A hash's home slot is `h * m % p` for a prime `p` and a factor `m` drawn at random when the table is
sized: cheap (C arithmetic on one int) and secret, so a publisher cannot choose hashes that pile into one
run of slots. SGLang's hashes are truncated SHA-256, but the router takes whatever ints a stream sends:
with `h & mask` a stream of multiples of 2^22 would make every insert walk the whole table, and with
`h % p` alone a million consecutive ints would be one run of a million slots that every lookup whose
home falls in it walks to its end (the request path's too). Lookups: ~230 ns a hit and ~135 ns a miss
in a table of 800,000 against a dict's ~120 and ~75 (measured on the 2-core host). Probes run forward
from the home slot without wrapping into a tail of `_TAIL` slots whose last one is always empty (the
walk's end); a run that would reach it is sized again with another prime (vanishingly rare for hashes
that do not know `p` and `m`).
Removal shifts the run's later hashes back (no tombstones: an empty slot always ends a walk).

0 marks an empty slot (`while v:` is the cheapest test of a slot), so the hash 0, and ints outside
int64 (a publisher sending unsigned 64-bit hashes), are kept in a small dict beside the array (`_odd`):
exact for any int, and empty for SGLang's signed 64-bit hashes but once in 2^64.

Growing rehashes every hash in Python (~0.3 us each): `reserve` does it in slices, yielding between them
(`blocks.py` `apply_steps` lets the event loop run there); readers keep the old array until the new one
is complete. Freeing a table is one `free` of its array, not millions of int deallocations.
"""

from __future__ import annotations

import secrets
from array import array
from collections.abc import Callable, Generator, Iterable, Iterator

_INT64_MIN = -(1 << 63)
_INT64_END = 1 << 63
#: slots past the last home slot: a run from a home near the end continues there (the last stays empty)
_TAIL = 64
#: a table grows when its hashes would fill more than half its home slots, to this many slots a hash
_GROW_TO = 3
#: old slots rehashed per step of `reserve` (a third to a half of them hold a hash)
RESERVE_STEP = 16_384


def _is_prime(n: int) -> bool:
    """Miller-Rabin with the bases that decide every n < 3.3e24."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    if n in small:
        return True
    if any(n % q == 0 for q in small):
        return False
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _random_prime(at_least: int) -> int:
    """A prime drawn at random from [at_least, 1.125 x at_least + 64)."""
    span = at_least // 8 + 64
    while True:
        p = at_least + secrets.randbelow(span)
        if _is_prime(p):
            return p


def _multiplier(p: int) -> int:
    """The home slot's secret factor: 2..p-1."""
    return 2 + secrets.randbelow(p - 2)


def _finder(t: array[int], p: int, m: int) -> Callable[[int], bool]:
    """`h in table` for hashes in int64 other than 0 (False for those: they live in `_odd`)."""

    def has(h: int, t: array[int] = t, p: int = p, m: int = m) -> bool:
        i = h * m % p
        v = t[i]
        while v:
            if v == h:
                return True
            i += 1
            v = t[i]
        return False

    return has


def member(tables: tuple[BlockTable, ...]) -> Callable[[int], bool]:
    """`block in any of tables` as one function (the tier-weighted walk asks it per anchor probed: a
    call per table cost ~50% more), the largest table asked first (with HiCache's write-through the
    host holds what the device does: one lookup per held block). Bound to the tables' arrays as they
    are now: build it again after they change (a table grows into another array)."""
    tables = tuple(sorted(tables, key=len, reverse=True))
    if len(tables) == 1:
        return tables[0].has
    if any(tb._odd for tb in tables):
        has = [tb.has for tb in tables]
        return lambda h: any(f(h) for f in has)
    if len(tables) == 2:
        (t, p, m), (t2, p2, m2) = ((tb._t, tb._p, tb._m) for tb in tables)
        return _finder2(t, p, m, t2, p2, m2)
    arrays = tuple((tb._t, tb._p, tb._m) for tb in tables)

    def has_any(h: int, arrays: tuple[tuple[array[int], int, int], ...] = arrays) -> bool:
        for t, p, m in arrays:
            i = h * m % p
            v = t[i]
            while v:
                if v == h:
                    return True
                i += 1
                v = t[i]
        return False

    return has_any


def _finder2(t: array[int], p: int, m: int, t2: array[int], p2: int, m2: int) -> Callable[[int], bool]:
    """`member` of two tables (the device and the host: SGLang's HiCache), unrolled."""

    def has2(h: int, t: array[int] = t, p: int = p, m: int = m, t2: array[int] = t2, p2: int = p2,
             m2: int = m2) -> bool:
        i = h * m % p
        v = t[i]
        while v:
            if v == h:
                return True
            i += 1
            v = t[i]
        i = h * m2 % p2
        v = t2[i]
        while v:
            if v == h:
                return True
            i += 1
            v = t2[i]
        return False

    return has2


def _odd(h: int) -> bool:
    """A hash the array cannot hold: 0 (an empty slot) or outside int64."""
    return not h or not _INT64_MIN <= h < _INT64_END


def _has_odd(hashes: list[int]) -> bool:
    return min(hashes) < _INT64_MIN or max(hashes) >= _INT64_END or 0 in hashes  # (C loops over the list)


class _RunTooLong(Exception):
    """A probe run reached the tail's last slot: the table is sized again with another prime."""


class BlockTable:
    """A set of int block hashes (`has`, `add`, `remove`, `missing`, `len`, iteration)."""

    __slots__ = ("_m", "_n", "_odd", "_p", "_t", "has")

    def __init__(self, hashes: Iterable[int] = ()) -> None:
        self._odd: dict[int, None] = {}
        self._n = 0
        self._size(_random_prime(13))
        self.update(hashes)

    def _size(self, p: int, t: array[int] | None = None, m: int | None = None) -> None:
        self._p, self._m = p, _multiplier(p) if m is None else m
        self._t = array("q", [0]) * (p + _TAIL) if t is None else t
        self._set_has()

    def _set_has(self) -> None:
        #: `block in self`, the request path's lookup: a closure over the array (no attribute loads)
        fast = _finder(self._t, self._p, self._m)
        if self._odd:
            odd = self._odd
            self.has = lambda h: fast(h) or h in odd
        else:
            self.has = fast

    # ---- reading ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n + len(self._odd)

    def __contains__(self, h: object) -> bool:
        return isinstance(h, int) and self.has(h)

    def __iter__(self) -> Iterator[int]:
        yield from filter(None, self._t)
        yield from self._odd

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockTable):
            return NotImplemented
        return len(self) == len(other) and all(map(other.has, self))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"BlockTable({len(self)} blocks, {self._p} slots)"

    def missing(self, hashes: Iterable[int]) -> list[int]:
        """The hashes not held, in order (repeats kept). The lookup inline: a call per hash cost ~40%
        more (a fresh block is looked up on every other medium, `blocks.py` `_store`)."""
        if self._odd:
            has = self.has
            return [h for h in hashes if not has(h)]
        t, p, m = self._t, self._p, self._m
        out: list[int] = []
        keep = out.append
        for h in hashes:
            i = h * m % p
            v = t[i]
            while v:
                if v == h:
                    break
                i += 1
                v = t[i]
            else:
                keep(h)
        return out

    # ---- changing --------------------------------------------------------------------------------
    def update(self, hashes: Iterable[int]) -> None:
        """Add every hash (tests and benches build tables so; `add` says which were new)."""
        self.add(list(hashes))

    def add(self, hashes: list[int]) -> list[int]:
        """Add the hashes; returns those not held before, each once. Grows in one piece when needed
        (`reserve` first to grow in steps)."""
        for _ in self.reserve(len(hashes)):
            pass
        if not hashes:
            return []
        if _has_odd(hashes):
            odd = [h for h in hashes if _odd(h)]
            hashes = [h for h in hashes if not _odd(h)]
            new = [h for h in dict.fromkeys(odd) if h not in self._odd]
            if new:
                self._odd.update(dict.fromkeys(new))
                self._set_has()
        else:
            new = []
        while True:
            try:
                return new + self._insert(hashes)
            except _RunTooLong as stop:  # what was inserted stays; the rest goes into a resized table
                done: list[int] = stop.args[0]
                new += done
                hashes = hashes[stop.args[1]:]
                self._rebuild_now(self._p)

    def _insert(self, hashes: list[int]) -> list[int]:
        t, p, m = self._t, self._p, self._m
        last = len(t) - 1
        new: list[int] = []
        keep = new.append
        for h in hashes:
            i = h * m % p
            v = t[i]
            while v:
                if v == h:
                    break
                i += 1
                v = t[i]
            else:
                if i == last:
                    self._n += len(new)
                    # (its first place in the list: an earlier one would have been found above)
                    raise _RunTooLong(new, hashes.index(h))
                t[i] = h
                keep(h)
        self._n += len(new)
        return new

    def remove(self, hashes: list[int]) -> list[int]:
        """Remove the hashes held; returns those removed, each once."""
        out: list[int] = []
        if not hashes:
            return out
        if self._odd and _has_odd(hashes):
            odd = self._odd
            gone = [h for h in dict.fromkeys(hashes) if h in odd]
            for h in gone:
                del odd[h]
            out += gone
            if not odd:
                self._set_has()
        t, p, m = self._t, self._p, self._m
        for h in hashes:
            i = h * m % p
            v = t[i]
            while v and v != h:
                i += 1
                v = t[i]
            if not v:  # (0 itself lives in `_odd`)
                continue
            out.append(h)
            # shift back: a later hash of the run moves into the hole when its home is at or before it
            j = i
            while True:
                j += 1
                w = t[j]
                if not w:
                    break
                if w * m % p <= i:
                    t[i] = w
                    i = j
            t[i] = 0
            self._n -= 1
        return out

    def reserve(self, incoming: int, step: int = RESERVE_STEP) -> Generator[None, None, None]:
        """Grow, when `incoming` more hashes could fill past half the home slots, to a third full;
        rehashing `step` old slots between yields (none for a small table). The table reads as before
        until the new array is complete (the caller adds nothing meanwhile)."""
        need = self._n + incoming
        if 2 * need > self._p:
            yield from self._rehash(_random_prime(_GROW_TO * need), step)

    def _rebuild_now(self, p: int) -> None:
        """Rehash in one piece into a table of another prime near `p` (a run reached the tail's end)."""
        for _ in self._rehash(_random_prime(p), RESERVE_STEP):
            pass

    def _rehash(self, p: int, step: int) -> Generator[None, None, None]:
        while True:
            old = self._t
            m = _multiplier(p)
            t = array("q", [0]) * (p + _TAIL)
            last = len(t) - 1
            try:
                for a in range(0, len(old), step):
                    if a:
                        yield
                    for h in filter(None, old[a:a + step]):
                        i = h * m % p
                        while t[i]:
                            i += 1
                        if i == last:
                            raise _RunTooLong
                        t[i] = h
            except _RunTooLong:
                p = _random_prime(p)
                continue
            self._size(p, t, m)
            return

    def clear(self) -> None:
        self._odd = {}
        self._n = 0
        self._size(_random_prime(13))
