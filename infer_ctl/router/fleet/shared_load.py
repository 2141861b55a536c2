"""In-flight requests per worker, shared by the router's processes (`router serve --processes N`).

One shared-memory block of int64 cells, `processes` rows of `slots` cells: process p writes only row p
(its own in-flight count per worker slot), and the load a policy sees for a worker is the sum of the
worker's column over all rows. No lock anywhere: every cell has exactly one writer, and a reader only
adds up whole cells. A cell is an aligned 8-byte word (the block is mmap'ed, so page-aligned, and a row
is a multiple of 64 bytes), and an aligned 8-byte load or store is a single access on x86-64 (Intel SDM
vol. 3A, 9.1.1 "Guaranteed Atomic Operations") and on AArch64: a reader sees a cell's old or new value,
never half of each. CPython's memoryview stores and loads an int64 item with one 8-byte memcpy, which
compilers emit as one move. The sum itself is not a snapshot (another process may move between two
cells), which is what the policy needs anyway: a current estimate, one request off at worst.

Rows are padded to whole cache lines so that two processes' stores never share a line (no false sharing
on the request path). Worker slots are stable: the profile's workers take slots 0..n-1 in order, a worker
added at runtime takes the next free one (the leader assigns it; followers learn it from the leader's
snapshot, router/scaleout/follow.py); slots are never reused while the router runs, so a removed worker's last
counts can never be read as a new worker's. A process that dies leaves its row behind; the supervisor
zeroes the row before it starts the replacement (the dead process's requests died with its sockets).
"""

from __future__ import annotations

from multiprocessing import resource_tracker, shared_memory

_CELL = 8
#: blocks this process created: attaching to one of them (tests) must not unregister the creator's entry
_CREATED: set[str] = set()
_LINE_CELLS = 64 // _CELL


def row_cells(slots: int) -> int:
    """Cells per row: `slots` rounded up to whole 64-byte cache lines."""
    return max(_LINE_CELLS, -(-slots // _LINE_CELLS) * _LINE_CELLS)


class SharedLoad:
    """The block, created by the supervisor (`create`) or attached to by a router process (`attach`)."""

    def __init__(self, shm: shared_memory.SharedMemory, processes: int, slots: int, owner: bool,
                 extra: int = 0) -> None:
        self.shm = shm
        self.processes = processes
        self.slots = slots
        self.stride = row_cells(slots)
        #: cells per process after the load rows (the flight board, router/fleet/shared_flights.py), from
        #: `extra_offset` on; zeroed with the process's load row
        self.extra = extra
        self.extra_offset = processes * self.stride
        self.owner = owner
        buf = shm.buf
        assert buf is not None  # None only after close()
        self.cells: memoryview = buf.cast("q")
        if len(self.cells) < processes * (self.stride + extra):
            raise ValueError(f"shared load block {shm.name} holds {len(self.cells)} cells, need "
                             f"{processes * (self.stride + extra)}")

    @classmethod
    def create(cls, processes: int, slots: int, extra: int = 0) -> SharedLoad:
        if processes < 1 or slots < 1 or extra < 0:
            raise ValueError("processes and slots must be >= 1, extra >= 0")
        size = processes * (row_cells(slots) + extra) * _CELL
        shm = shared_memory.SharedMemory(create=True, size=size)
        shm.buf[:size] = bytes(size)  # type: ignore[index]  # fresh pages are zero on Linux; say so anyway
        _CREATED.add(shm.name)
        return cls(shm, processes, slots, owner=True, extra=extra)

    @classmethod
    def attach(cls, name: str, processes: int, slots: int, extra: int = 0) -> SharedLoad:
        shm = shared_memory.SharedMemory(name=name)
        # The supervisor owns the block. Python 3.11 registers every attach with its resource tracker,
        # which unlinks the block when this process exits (a restarted follower would take it away from
        # the others); 3.13's track=False is the same thing as this unregister.
        if shm.name not in _CREATED:
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        return cls(shm, processes, slots, owner=False, extra=extra)

    @property
    def name(self) -> str:
        return self.shm.name

    def cell(self, process: int, slot: int) -> int:
        """The index of (process, slot) in `cells`."""
        if not 0 <= process < self.processes or not 0 <= slot < self.slots:
            raise IndexError(f"no cell for process {process}, slot {slot}")
        return process * self.stride + slot

    def total(self, slot: int) -> int:
        """A worker's in-flight requests over every process (the column sum)."""
        return sum(self.cells[slot:self.extra_offset:self.stride])  # the load rows only (the board follows)

    def row(self, process: int) -> list[int]:
        start = process * self.stride
        return list(self.cells[start:start + self.slots])

    def zero_row(self, process: int) -> None:
        """The supervisor, for a process that died (before its replacement starts)."""
        start = process * self.stride
        self.cells[start:start + self.stride] = memoryview(bytes(self.stride * _CELL)).cast("q")
        if self.extra:
            start = self.extra_offset + process * self.extra
            self.cells[start:start + self.extra] = memoryview(bytes(self.extra * _CELL)).cast("q")

    def close(self) -> None:
        self.cells.release()
        self.shm.close()
        if self.owner:
            self.shm.unlink()
            _CREATED.discard(self.shm.name)
