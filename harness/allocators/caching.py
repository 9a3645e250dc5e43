"""A model of PyTorch's CUDA caching allocator: what a PyTorch user gets today.

The rules are those of ``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch) with its
default configuration (no ``PYTORCH_CUDA_ALLOC_CONF``: ``max_split_size`` unlimited,
``roundup_power2_divisions`` off, ``expandable_segments`` off, no garbage collection
threshold), one device and one stream:

- ``round_size``: every request is rounded up to a multiple of ``kMinBlockSize`` = 512
  bytes (and at least 512);
- ``get_pool``: rounded sizes up to ``kSmallSize`` = 1 MiB are served from the *small*
  pool, larger ones from the *large* pool;
- ``get_free_block``: best fit within the pool: the free block with the smallest size
  that is large enough, lowest address among equal sizes (the pool is a ``std::set``
  ordered by ``(stream, size, address)`` and searched with ``lower_bound``);
- when none fits, a new segment is ``cudaMalloc``-ed with ``get_allocation_size``:
  ``kSmallBuffer`` = 2 MiB for small requests, ``kLargeBuffer`` = 20 MiB for requests
  below ``kMinLargeAlloc`` = 10 MiB, and the request rounded up to ``kRoundLarge`` = 2 MiB
  above that;
- ``should_split``: the block found is split when the remainder is at least 512 bytes
  (small pool) or more than ``kSmallSize`` (large pool); the request takes the front,
  the remainder goes back to the pool;
- ``free_block`` / ``try_merge_blocks``: a freed block merges with its free neighbours
  of the same segment and returns to its pool; segments are never returned to the device
  during an iteration (``cudaFree`` happens only on an out-of-memory retry or
  ``empty_cache``), so without a cap the reserved bytes only grow.

The arena is the total reserved segment bytes (``torch.cuda.max_memory_reserved``), with
the segments laid out one after another in the order they were created; a block's offset
is its segment's base plus its place in the segment.

Under a cap (``set_per_process_memory_fraction``), ``reserved_under_cap`` replays the
out-of-memory path of ``malloc``: when a new segment would take the reserved bytes past the
cap, ``alloc_block`` fails; ``release_available_cached_blocks`` does nothing with
``max_split_size`` unlimited; ``release_cached_blocks`` frees every cached block that is a
whole segment (no ``prev``, no ``next``) in both pools, and the segment is tried again; if
it still does not fit, the request is out of memory. So a capped process can train in less
than the uncapped arena: what a capped run needs is ``min_cap``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from harness.allocators._common import event_order, make_placement
from harness.allocators.trace import IntTrace, as_int_trace
from harness.model import MemoryBlock, Placement

__all__ = ["CachingAllocator", "reserved_under_cap", "min_cap", "round_size", "allocation_size", "K_MIN_BLOCK_SIZE",
           "K_SMALL_SIZE", "K_SMALL_BUFFER", "K_LARGE_BUFFER", "K_MIN_LARGE_ALLOC", "K_ROUND_LARGE"]

K_MIN_BLOCK_SIZE = 512  # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 << 20  # largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2 << 20  # "small" allocations are packed in 2 MiB blocks
K_LARGE_BUFFER = 20 << 20  # "large" allocations may be packed in 20 MiB blocks
K_MIN_LARGE_ALLOC = 10 << 20  # allocations between 1 and 10 MiB may use kLargeBuffer
K_ROUND_LARGE = 2 << 20  # round up large allocations to 2 MiB


def round_size(size: int) -> int:
    """PyTorch's ``round_size``: up to a multiple of 512 bytes, at least 512."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """PyTorch's ``get_allocation_size``: the segment ``cudaMalloc``-ed for a rounded request."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


@dataclass
class _Block:
    addr: int
    size: int
    small: bool
    prev: _Block | None = None
    next: _Block | None = None
    allocated: bool = False


@dataclass
class _State:
    reserved: int = 0
    top: int = 0  # the next segment's base: segments released under a cap leave their addresses unused
    segments: list[tuple[int, int, bool]] = field(default_factory=list)  # (base, size, small)
    pools: dict[bool, list[tuple[int, int, int]]] = field(default_factory=lambda: {True: [], False: []})
    blocks: dict[int, _Block] = field(default_factory=dict)  # pool key id -> block

    def pool_insert(self, b: _Block) -> None:
        """Put a free block into its pool (ordered by size, then address)."""
        bisect.insort(self.pools[b.small], (b.size, b.addr, id(b)))
        self.blocks[id(b)] = b

    def pool_remove(self, b: _Block) -> None:
        """Take a free block out of its pool."""
        pool = self.pools[b.small]
        key = (b.size, b.addr, id(b))
        pos = bisect.bisect_left(pool, key)
        assert pool[pos] == key
        pool.pop(pos)
        del self.blocks[id(b)]


class CachingAllocator:
    """Replays a trace through a model of PyTorch's CUDA caching allocator (module docstring).

    The arena is the reserved segment bytes at the end of the iteration (nothing is
    released mid-iteration). ``notes`` reports the segment count and the bytes lost to
    rounding.
    """

    name = "caching"
    description = "PyTorch CUDA caching allocator model (512 B rounding, 2/20 MiB segments, best fit per pool)"

    def place(self, trace: Sequence[MemoryBlock]) -> Placement:
        """Replay ``trace`` (allocations and frees in time order) and report where each block landed."""
        t = as_int_trace(trace)
        st, offsets, _ = _replay(t)
        small_segments = sum(1 for s in st.segments if s[2])
        notes = (
            f"{len(st.segments)} segments ({small_segments} small, {len(st.segments) - small_segments} large), "
            f"{st.reserved} bytes reserved"
        )
        return make_placement(self.name, t, offsets, arena_bytes=st.reserved, notes=notes)

    def serves_under_cap(self, trace: Sequence[MemoryBlock], cap_bytes: int) -> bool:
        """Whether a process capped at ``cap_bytes`` serves ``trace``: PyTorch gives its cached whole segments
        back at the cap before it gives up (``reserved_under_cap``), so it can train in less than the
        arena ``place`` reports, which is what an uncapped process reserves."""
        return reserved_under_cap(trace, cap_bytes) is not None

    @staticmethod
    def _malloc(st: _State, requested: int, cap: int | None = None) -> _Block | None:
        """The block serving ``requested`` bytes; None when a new segment would pass ``cap``
        even after the cached whole segments are released (out of memory)."""
        size = round_size(requested)
        small = size <= K_SMALL_SIZE
        pool = st.pools[small]
        pos = bisect.bisect_left(pool, (size, -1, -1))
        if pos < len(pool):
            block = st.blocks[pool[pos][2]]
            st.pool_remove(block)
        else:
            seg = allocation_size(size)
            if cap is not None and st.reserved + seg > cap:
                CachingAllocator._release_cached_blocks(st)
                if st.reserved + seg > cap:
                    return None
            block = _Block(st.top, seg, small)
            st.segments.append((st.top, seg, small))
            st.reserved += seg
            st.top += seg
        remaining = block.size - size
        split = remaining >= K_MIN_BLOCK_SIZE if small else remaining > K_SMALL_SIZE
        if split:
            rest = _Block(block.addr + size, remaining, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            st.pool_insert(rest)
        block.allocated = True
        return block

    @staticmethod
    def _free(st: _State, block: _Block) -> None:
        block.allocated = False
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            st.pool_remove(prev)
            block.addr = prev.addr
            block.size += prev.size
            block.prev = prev.prev
            if block.prev is not None:
                block.prev.next = block
        if nxt is not None and not nxt.allocated:
            st.pool_remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if block.next is not None:
                block.next.prev = block
        st.pool_insert(block)

    @staticmethod
    def _release_cached_blocks(st: _State) -> None:
        """``release_cached_blocks``: ``cudaFree`` every free block that is a whole segment."""
        for small in (True, False):
            for key in list(st.pools[small]):
                block = st.blocks[key[2]]
                if block.prev is None and block.next is None:
                    st.pool_remove(block)
                    st.segments.remove((block.addr, block.size, small))
                    st.reserved -= block.size


def _replay(t: IntTrace, cap: int | None = None) -> tuple[_State, np.ndarray, int] | None:
    """Replay ``t`` through the model: its final state, each block's offset and the peak reserved
    bytes; None when, under ``cap``, a request is out of memory."""
    offsets = np.zeros(len(t), dtype=np.int64)
    st = _State()
    live: dict[int, _Block] = {}
    peak = 0
    for code in event_order(t):
        code = int(code)
        if code >= 0:
            block = CachingAllocator._malloc(st, int(t.size[code]), cap)
            if block is None:
                return None
            live[code] = block
            offsets[code] = block.addr
            peak = max(peak, st.reserved)
        else:
            CachingAllocator._free(st, live.pop(~code))
    return st, offsets, peak


def reserved_under_cap(trace: Sequence[MemoryBlock] | IntTrace, cap_bytes: int) -> int | None:
    """The peak reserved bytes of ``trace`` replayed under a cap of ``cap_bytes`` (module
    docstring: the out-of-memory retry), or None when some request is out of memory."""
    replayed = _replay(as_int_trace(trace), cap_bytes)
    return None if replayed is None else replayed[2]


def min_cap(trace: Sequence[MemoryBlock] | IntTrace, uncapped: Placement | None = None) -> int:
    """The smallest cap (to ``K_ROUND_LARGE``) under which ``trace`` is served without running
    out of memory: bisected between the trace's max-live bytes and the uncapped arena, which
    always serves it (``uncapped``: the trace's ``CachingAllocator().place``, when the caller has
    it). Returns a cap found to serve it (the replay is not monotone in the cap in every case,
    so a bisection step that fits is checked, never assumed)."""
    t = as_int_trace(trace)
    placement = uncapped if uncapped is not None else CachingAllocator().place(t)
    hi = placement.arena_bytes
    lo = placement.max_live_bytes - 1  # below max-live nothing serves the trace
    while hi - lo > K_ROUND_LARGE:
        mid = (lo + hi) // 2
        if _replay(t, mid) is None:
            lo = mid
        else:
            hi = mid
    return hi
