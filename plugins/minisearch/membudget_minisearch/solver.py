"""The driver: best-fit's placement as the incumbent, then iterative deepening over the canonical space.

1. The incumbent is ``bestfit``'s placement (papers/003 section 3.2 with its squeaky-wheel
   rounds); the proved lower bound starts at the max-live bytes.
2. While the bound is below the incumbent's arena and time is left: search the canonical
   space (:mod:`membudget_minisearch._search`) for a placement with arena <= bound. Found:
   it is optimal (its arena is the bound). Exhausted: the smallest bound among the pruned
   branches is a new, higher proved lower bound; search again with it. When the bound
   reaches the incumbent's arena, the incumbent is proved optimal.
3. On time out the incumbent stands, with the proved bound and the gap between them.

Times are first taken to best-fit's canonical times (the same overlaps, fewer distinct
times), and only the blocks that occupy something take part.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from membudget_minisearch._search import EXHAUSTED, FOUND, PAUSED, SearchKernel, prepare, search_reference

__all__ = ["SearchResult", "solve"]


@dataclass(frozen=True)
class SearchResult:
    """What :func:`solve` found for the blocks it was given.

    ``offsets``: one per block; ``arena_bytes``: their highest end; ``lower_bound_bytes``:
    proved (at least the max-live bytes); ``optimal``: ``arena == lower bound``;
    ``incumbent_bytes``: best-fit's arena, where the search started; ``thresholds``: the
    bounds searched; ``nodes``: children tried in all; ``timed_out``: the time or node
    limit ended the search before it settled.
    """

    offsets: np.ndarray
    arena_bytes: int
    lower_bound_bytes: int
    max_live_bytes: int
    incumbent_bytes: int
    optimal: bool
    nodes: int
    thresholds: int
    timed_out: bool
    wall_time_s: float

    @property
    def gap(self) -> float:
        """``(arena - lower bound) / arena``; 0.0 when optimal."""
        return (self.arena_bytes - self.lower_bound_bytes) / self.arena_bytes if self.arena_bytes else 0.0


def _incumbent(lower, upper, size) -> np.ndarray:
    from membudget_bestfit import bestfit_offsets

    return bestfit_offsets(lower, upper, size)


def solve(lower, upper, size, *, time_limit: float | None = 5.0, node_limit: int | None = None,
          kernel: str = "numba", preference: str = "lifetime", incumbent=None) -> SearchResult:
    """Place the blocks ``[lower, upper)`` of ``size`` bytes; see the module docstring.

    ``time_limit`` (seconds, None: none) and ``node_limit`` (children tried over all
    thresholds, None: none) stop the search; with only ``node_limit`` the result does not
    depend on the machine's speed. ``kernel``: ``"numba"`` or ``"python"`` (the reference,
    for tests). ``incumbent``: offsets to start from instead of best-fit's.
    """
    from membudget_bestfit._kernels import canonical_times

    if kernel not in ("numba", "python"):
        raise ValueError(f"kernel must be 'numba' or 'python', got {kernel!r}")
    if time_limit is not None and not time_limit >= 0:
        raise ValueError(f"time_limit must be a number of seconds >= 0, got {time_limit!r}")
    if node_limit is not None and node_limit < 0:
        raise ValueError(f"node_limit must be >= 0, got {node_limit!r}")
    started = time.perf_counter()
    deadline = math.inf if time_limit is None else started + float(time_limit)
    lo = np.ascontiguousarray(lower, dtype=np.int64)
    up = np.ascontiguousarray(upper, dtype=np.int64)
    sz = np.ascontiguousarray(size, dtype=np.int64)
    n = len(sz)
    offsets = np.zeros(n, dtype=np.int64)
    active = np.flatnonzero((sz > 0) & (up > lo))
    if not len(active):
        return SearchResult(offsets, 0, 0, 0, 0, True, 0, 0, False, time.perf_counter() - started)

    inc = np.asarray(_incumbent(lo, up, sz) if incumbent is None else incumbent, dtype=np.int64)
    offsets[active] = inc[active]
    arena = int((offsets[active] + sz[active]).max())
    incumbent_arena = arena
    clo, cup = canonical_times(lo[active], up[active], sz[active])
    inst = prepare(clo, cup, sz[active], preference)
    bound = inst.max_live
    nodes = thresholds = 0
    timed_out = False
    while bound < arena:
        if time.perf_counter() >= deadline or (node_limit is not None and nodes >= node_limit):
            timed_out = True
            break
        thresholds += 1
        left = None if node_limit is None else node_limit - nodes
        if kernel == "python":
            status, found, used, next_bound = search_reference(inst, bound, left)
            nodes += used
        else:
            search = SearchKernel(inst, bound)
            chunk = 2_000
            while True:
                step = chunk if left is None else min(chunk, left - search.nodes)
                t0 = time.perf_counter()
                status = search.advance(step)
                if status != PAUSED:
                    break
                now = time.perf_counter()
                if now >= deadline or (left is not None and search.nodes >= left):
                    break
                # aim at ~50 ms a call, never past the deadline
                per_node = max(now - t0, 1e-6) / max(step, 1)
                chunk = int(max(1_000, min(min(0.05, deadline - now) / per_node, 10_000_000)))
            nodes += search.nodes
            found, next_bound = search.offsets, search.next_bound
        if status == FOUND:
            offsets[active] = found
            arena = int((found + inst.size).max())
            break
        if status == EXHAUSTED:
            bound = max(bound + 1, next_bound)
            continue
        timed_out = True
        break
    bound = min(bound, arena)
    return SearchResult(offsets, arena, bound, inst.max_live, incumbent_arena, bound == arena, nodes,
                        thresholds, timed_out, time.perf_counter() - started)
