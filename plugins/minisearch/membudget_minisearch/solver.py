"""The driver: best-fit's placement as the incumbent, then iterative deepening over the canonical space.

1. The incumbent is ``bestfit``'s placement (papers/003 section 3.2 with its squeaky-wheel
   rounds); the proved lower bound starts at the max-live bytes.
2. While the bound is below the incumbent's arena and time is left: search the canonical
   space (:mod:`membudget_minisearch._search`) for a placement with arena <= bound. Found:
   it is optimal (its arena is the bound). Exhausted: the smallest bound among the pruned
   branches is a new, higher proved lower bound; search again with it. When the bound
   reaches the incumbent's arena, the incumbent is proved optimal.
3. On time out the incumbent stands, with the proved bound and the gap between them.

Backtracking search is heavy-tailed: one order of preference settles an instance in a
hundred nodes that another does not settle in millions. So by default (``preference=
"portfolio"``) the search runs several orders (lifetime, size, area, start, start-size,
then a seeded random one) side by side on the same question, each resumed where it stopped, in slices that
double every round (every order gets the same slice before any gets a bigger one); any
one of them that finds a placement or exhausts its space answers the question. From the
second round on, a search under the midpoint between the bound and the incumbent also
gets a slice: found, the incumbent improves; exhausted, the bound rises. A question not
yet answered helps too: the deepest partial placement it reached (everything placed so
far fits under its threshold) is completed greedily (the other blocks, in order of
preference, each at the lowest offset its placed neighbours leave free) and replaces the
incumbent when its arena is smaller.

Times are first taken to best-fit's canonical times (the same overlaps, fewer distinct
times), and only the blocks that occupy something take part.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import numpy as np

from harness.allocators.trace import IntTrace, max_live_bytes
from membudget_minisearch._search import (
    EXHAUSTED, FOUND, PAUSED, PREFERENCES, SearchKernel, overlapping_pairs, prepare, search_reference,
)

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


def _incumbent(lower, upper, size, deadline: float) -> np.ndarray:
    """Best-fit's offsets, its rounds ended by ``deadline`` (its first round always runs)."""
    from membudget_bestfit import bestfit_offsets

    return bestfit_offsets(lower, upper, size, deadline=None if deadline == math.inf else deadline)


def complete(inst, placed, offsets) -> np.ndarray:
    """A full placement from a partial one: the other blocks, in rank order, each at the
    lowest offset where it fits between the blocks already placed that overlap it."""
    off = offsets.copy()
    done = placed.copy()
    for b in inst.order:
        if done[b]:
            continue
        nb = inst.neighbours(b)
        nb = nb[done[nb]]
        spans = sorted(zip(off[nb].tolist(), (off[nb] + inst.size[nb]).tolist()))
        x, need = 0, int(inst.size[b])
        for start, end in spans:
            if start - x >= need:
                break
            x = max(x, end)
        off[b] = x
        done[b] = True
    return off


_COMPILED = False


def _compiled() -> None:
    """Compile the kernels, the search's and best-fit's (or load them from Numba's cache), once per process."""
    global _COMPILED
    if not _COMPILED:
        from membudget_bestfit._kernels import compile_kernels

        compile_kernels()
        one = np.ones(1, dtype=np.int64)
        SearchKernel(prepare(one * 0, one, one), 1).advance(10)
        _COMPILED = True


class _Question:
    """"Is there a placement with arena <= threshold?" asked with one order of preference."""

    def __init__(self, inst, threshold: int, kernel: str):
        self.inst, self.threshold, self.kernel = inst, threshold, kernel
        self.status, self.offsets, self.next_bound, self.done_nodes = PAUSED, None, None, 0
        self.search = SearchKernel(inst, threshold) if kernel == "numba" else None
        self.deepest: dict = {}
        self.completed_depth = 0  # the depth of the last partial placement completed

    def advance(self, nodes: int, deadline: float) -> int:
        """Try up to ``nodes`` more children (fewer at the deadline); returns the work done."""
        if self.status != PAUSED or nodes <= 0:
            return 0
        if self.search is None:  # the reference cannot pause: rerun it with the larger budget
            before = self.done_nodes
            self.deepest = {}
            self.status, self.offsets, used, self.next_bound = search_reference(
                self.inst, self.threshold, before + nodes, self.deepest)
            self.done_nodes = used
            return used - before
        s = self.search
        start, target, chunk = s.nodes, s.nodes + nodes, 2_000
        while s.nodes < target:
            t0 = time.perf_counter()
            step = min(chunk, target - s.nodes)
            if s.advance(step) != PAUSED:
                break
            now = time.perf_counter()
            if now >= deadline:
                break
            per_node = max(now - t0, 1e-7) / max(step, 1)  # aim at ~50 ms a call, never past the deadline
            chunk = int(max(1_000, min(min(0.05, deadline - now) / per_node, 10_000_000)))
        self.status, self.offsets, self.next_bound = s.status, s.offsets, s.next_bound
        self.deepest = s.deepest
        self.done_nodes = s.nodes
        return s.nodes - start


def solve(lower, upper, size, *, time_limit: float | None = 5.0, node_limit: int | None = None,
          kernel: str = "numba", preference="portfolio", incumbent=None, slice_nodes: int = 20_000,
          random_orders: int = 1) -> SearchResult:
    """Place the blocks ``[lower, upper)`` of ``size`` bytes; see the module docstring.

    ``time_limit`` (seconds, None: none) and ``node_limit`` (children tried over all
    searches, None: none) stop the search; with only ``node_limit`` the result does not
    depend on the machine's speed. ``kernel``: ``"numba"`` or ``"python"`` (the reference,
    for tests; same answers). ``preference``: ``"portfolio"`` (the default: every order of
    :data:`~membudget_minisearch._search.PREFERENCES` and ``random_orders`` random ones) or
    one order. ``slice_nodes``: the first round's slice. ``incumbent``: offsets to start
    from instead of best-fit's.
    """
    from membudget_bestfit._kernels import canonical_times

    if kernel not in ("numba", "python"):
        raise ValueError(f"kernel must be 'numba' or 'python', got {kernel!r}")
    if time_limit is not None and not time_limit >= 0:
        raise ValueError(f"time_limit must be a number of seconds >= 0, got {time_limit!r}")
    if node_limit is not None and node_limit < 0:
        raise ValueError(f"node_limit must be >= 0, got {node_limit!r}")
    if preference == "portfolio":
        prefs = [*PREFERENCES, *range(1, random_orders + 1)]
    elif preference in PREFERENCES:
        prefs = [preference]
    else:
        raise ValueError(f"preference must be 'portfolio' or one of {', '.join(PREFERENCES)}, got {preference!r}")
    if kernel == "numba":
        _compiled()  # JIT compilation (or loading it from the cache) is not search time
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

    try:
        inc = np.asarray(_incumbent(lo, up, sz, deadline) if incumbent is None else incumbent, dtype=np.int64)
    except KeyboardInterrupt as exc:  # during best-fit's rounds: its best placement goes with the interrupt
        rounds = getattr(exc, "partial", None)
        if rounds is not None:
            offsets[active] = rounds.offsets[active]
            arena = int((offsets[active] + sz[active]).max())
            live = max_live_bytes(IntTrace(lo[active], up[active], sz[active]))
            exc.partial = SearchResult(offsets, arena, live, live, arena, arena <= live, 0, 0, True,
                                       time.perf_counter() - started)
        raise
    offsets[active] = inc[active]
    arena = int((offsets[active] + sz[active]).max())
    incumbent_arena = arena
    clo, cup = canonical_times(lo[active], up[active], sz[active])
    instances = {}
    # the overlapping pairs, once and only when an instance is needed: they do not depend on the order
    pairs = functools.cache(lambda: overlapping_pairs(clo, cup))

    def instance(pref):
        if pref not in instances:
            instances[pref] = prepare(clo, cup, sz[active], pref, pairs())
        return instances[pref]

    bound = max_live = max_live_bytes(IntTrace(clo, cup, sz[active]))  # the instances are built in the try
    nodes = 0
    questions: dict[tuple[int, object], _Question] = {}
    asked: set[int] = set()
    rnd = 0

    def out_of_budget():
        return time.perf_counter() >= deadline or (node_limit is not None and nodes >= node_limit)

    try:
        while bound < arena and not out_of_budget():
            budget = slice_nodes << min(rnd, 40)
            mid = bound + (arena - bound) // 2
            targets = [bound] + ([mid] if rnd >= 1 and mid > bound else [])
            settled = False
            for threshold in targets:
                for pref in prefs if threshold == bound else [prefs[rnd % len(prefs)]]:
                    if out_of_budget():
                        break
                    key = (threshold, pref)
                    if key not in questions:
                        questions[key] = _Question(instance(pref), threshold, kernel)
                        asked.add(threshold)
                    q = questions[key]
                    step = budget if node_limit is None else min(budget, node_limit - nodes)
                    nodes += q.advance(step, deadline)
                    d = q.deepest.get("depth", 0)
                    if q.status == PAUSED and d >= q.completed_depth + max(1, len(active) // 50):
                        # the deepest partial placement under the threshold, completed greedily:
                        # often below the incumbent when the threshold is not reached
                        q.completed_depth = d
                        cand = complete(q.inst, q.deepest["placed"], q.deepest["offsets"])
                        cand_arena = int((cand + sz[active]).max())
                        if cand_arena < arena:
                            offsets[active] = cand
                            arena = cand_arena
                    if q.status == FOUND:
                        order_offsets = q.offsets
                        offsets[active] = order_offsets
                        arena = int((order_offsets + sz[active]).max())
                        settled = True
                    elif q.status == EXHAUSTED:
                        bound = max(bound, threshold + 1, q.next_bound)
                        settled = True
                    if settled:
                        break
                if settled:
                    break
            if settled:  # a new question: forget the old ones (their thresholds are settled)
                questions = {k: v for k, v in questions.items() if bound <= k[0] < arena}
                rnd = 0
            else:
                rnd += 1
    except KeyboardInterrupt as exc:  # the best placement so far goes with the interrupt (its arena recounted:
        # the interrupt may fall between an offsets update and the arena's)
        arena = int((offsets[active] + sz[active]).max())
        exc.partial = SearchResult(offsets, arena, min(bound, arena), max_live, incumbent_arena, bound >= arena,
                                   nodes, len(asked), True, time.perf_counter() - started)
        raise
    bound = min(bound, arena)
    return SearchResult(offsets, arena, bound, max_live, incumbent_arena, bound == arena, nodes,
                        len(asked), bound < arena, time.perf_counter() - started)
