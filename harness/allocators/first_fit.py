"""A pool allocator like CNMEM (papers/001 section 2, NVIDIA/cnmem): first-fit or best-fit.

CNMEM reserves one pool up front and serves requests from a free list kept sorted by
address (``src/cnmem.cpp``):

- requests are rounded up to ``CNMEM_GRANULARITY`` = 512 bytes;
- ``findBestBlockUnsafe`` takes the smallest free block that is large enough (lowest
  address among equal sizes), i.e. CNMEM itself is *best* fit; the classic ``first-fit``
  pool takes the lowest-address free block that is large enough;
- ``extractBlockUnsafe`` gives the front of the block to the request and leaves the rest
  free;
- ``releaseBlockUnsafe`` merges a freed block with free neighbours, never across the
  boundary of a separate ``cudaMalloc`` (a "head" block);
- when nothing fits and the pool may grow, ``allocateBlockUnsafe`` ``cudaMalloc``-s a new
  block of exactly the requested size (a new head).

:class:`PoolAllocator` models this with ``policy`` ``"first"`` or ``"best"``. With
``pool_bytes=None`` the pool is unbounded (one free block from 0 to infinity) and the
arena is the highest address used, the usual first-fit baseline for dynamic storage
allocation. With ``pool_bytes=P`` the pool is ``P`` bytes; a request that does not fit
grows the pool at its top as CNMEM does, so the placement fits in ``P`` exactly when
``arena_bytes == P`` (``Placement.notes`` counts the growths).
"""

from __future__ import annotations

import bisect
from typing import Literal, Sequence

import numpy as np

from harness.allocators._common import event_order, make_placement
from harness.allocators.trace import as_int_trace
from harness.model import MemoryBlock, Placement

__all__ = ["PoolAllocator", "FirstFit", "Cnmem", "CNMEM_GRANULARITY"]

CNMEM_GRANULARITY = 512
_INFINITE = 1 << 62


class PoolAllocator:
    """An address-ordered free-list pool (CNMEM-like); see the module docstring.

    ``policy``: ``"first"`` (lowest address that fits) or ``"best"`` (smallest block that
    fits, lowest address among ties). ``granularity``: requests are rounded up to a
    multiple of it. ``pool_bytes``: the pool reserved up front (None: unbounded).
    """

    def __init__(
        self,
        policy: Literal["first", "best"] = "first",
        *,
        granularity: int = CNMEM_GRANULARITY,
        pool_bytes: int | None = None,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        if policy not in ("first", "best"):
            raise ValueError(f"policy must be 'first' or 'best', got {policy!r}")
        if granularity < 1:
            raise ValueError("granularity must be >= 1")
        self.policy = policy
        self.granularity = granularity
        self.pool_bytes = pool_bytes
        self.name = name or ("first-fit" if policy == "first" else "best-fit-pool")
        self.description = description or (
            f"{policy}-fit free-list pool, {granularity}-byte granularity"
            + (f", {pool_bytes}-byte pool" if pool_bytes is not None else ", unbounded pool")
        )

    def place(self, trace: Sequence[MemoryBlock]) -> Placement:
        """Replay ``trace`` in time order through the pool and report the offsets."""
        t = as_int_trace(trace)
        g = self.granularity
        offsets = np.zeros(len(t), dtype=np.int64)
        # free list sorted by address: parallel lists of address, size, head flag
        if self.pool_bytes is None:
            f_addr, f_size, f_head = [0], [_INFINITE], [True]
            top = 0  # highest address used
        else:
            pool = -(-self.pool_bytes // g) * g if self.pool_bytes else 0
            f_addr, f_size, f_head = ([0], [pool], [True]) if pool else ([], [], [])
            top = pool
        grown = 0
        used: dict[int, tuple[int, int, bool]] = {}  # block -> (addr, size, head)
        for code in event_order(t):
            code = int(code)
            if code >= 0:
                size = -(-int(t.size[code]) // g) * g
                k = self._find(f_size, size)
                if k < 0:  # grow: a new cudaMalloc of exactly `size` at the top
                    addr, head = top, True
                    top += size
                    grown += 1
                else:
                    addr, head = f_addr[k], f_head[k]
                    if f_size[k] == size:
                        del f_addr[k], f_size[k], f_head[k]
                    else:
                        f_addr[k] += size
                        if f_size[k] != _INFINITE:
                            f_size[k] -= size
                        f_head[k] = False
                    if self.pool_bytes is None:
                        top = max(top, addr + size)
                used[code] = (addr, size, head)
                offsets[code] = addr
            else:
                addr, size, head = used.pop(~code)
                k = bisect.bisect_left(f_addr, addr)
                merged = False
                if k > 0 and f_addr[k - 1] + f_size[k - 1] == addr and not head:
                    f_size[k - 1] += size
                    k -= 1
                    merged = True
                if not merged:
                    f_addr.insert(k, addr)
                    f_size.insert(k, size)
                    f_head.insert(k, head)
                nk = k + 1
                if nk < len(f_addr) and f_addr[k] + f_size[k] == f_addr[nk] and not f_head[nk]:
                    f_size[k] = _INFINITE if f_size[nk] == _INFINITE else f_size[k] + f_size[nk]
                    del f_addr[nk], f_size[nk], f_head[nk]
        arena = top  # unbounded: the highest address used; bounded: the pool plus its growths
        notes = f"policy={self.policy}, granularity={g}"
        if self.pool_bytes is not None:
            notes += f", pool={self.pool_bytes}, grew {grown} time(s)"
        return make_placement(self.name, t, offsets, arena_bytes=arena, notes=notes)

    def _find(self, f_size: list[int], size: int) -> int:
        if self.policy == "first":
            for k, s in enumerate(f_size):
                if s >= size:
                    return k
            return -1
        best, best_size = -1, None
        for k, s in enumerate(f_size):
            if s >= size and (best_size is None or s < best_size):
                best, best_size = k, s
        return best


class FirstFit(PoolAllocator):
    """``first-fit``: the lowest-address free block that fits, in an unbounded CNMEM-like pool."""

    def __init__(self, *, granularity: int = CNMEM_GRANULARITY, pool_bytes: int | None = None) -> None:
        super().__init__(
            "first", granularity=granularity, pool_bytes=pool_bytes, name="first-fit",
            description="first-fit pool like CNMEM (papers/001): lowest-address free block that fits, 512 B granularity",
        )


class Cnmem(PoolAllocator):
    """``cnmem``: CNMEM's own rule, the smallest free block that fits (``findBestBlockUnsafe``)."""

    def __init__(self, *, granularity: int = CNMEM_GRANULARITY, pool_bytes: int | None = None) -> None:
        super().__init__(
            "best", granularity=granularity, pool_bytes=pool_bytes, name="cnmem",
            description="NVIDIA CNMEM pool: smallest free block that fits, split at the front, 512 B granularity",
        )
