"""Exact search over the canonical solution space: a Numba kernel and a plain-Python reference.

The problem
-----------
Blocks ``i`` with half-open lifetimes ``[lower[i], upper[i])`` (integer time units) and
``size[i]`` bytes; place each at an offset so that blocks alive at the same time do not
share an address; minimise the arena (the highest block end). This is papers/003's DSA
(eq. 1-6).

The canonical space (after MiniMalloc, Moffitt, ASPLOS 2023)
-----------------------------------------------------------
Any placement can be compacted by "gravity" (each block dropped until it rests on an
overlapping block or on 0) without raising its arena. List the blocks of a compacted
placement in order of (offset, rank), ``rank`` being a fixed order of preference. Then
every block, when its turn comes, lies at its *floor*: the highest top of the blocks
before it that overlap it in time (0 when none). So the search places blocks one at a
time, each at its floor, with keys ``(floor, rank)`` strictly increasing along a branch;
every compacted placement is reached by exactly one branch. A node's children are the
unplaced blocks whose key exceeds the last block's, tried in increasing key order (the
lowest floor first: the first dive is a greedy skyline like best-fit's).

Pruning (valid for the question "is there a placement with arena <= T?")
-----------------------------------------------------------------------
- a block whose top would exceed ``T`` is not placed;
- the section bound: every unplaced block lies at or above the last offset ``o`` and its
  floor (the tops of the placed blocks it overlaps), and unplaced blocks alive at the
  same time are stacked, so at every time unit ``t`` the arena is at least
  ``max(o, low[t]) + U[t]`` (``low[t]``: the lowest floor of the unplaced blocks alive at
  ``t``; ``U[t]``: their bytes). At the root this is the max-live bound. It is first
  tried in its cheap form, with ``sky[t]`` (the highest top of the placed blocks alive at
  ``t``, never above ``low[t]``) for ``low[t]``: O(times) instead of O(lifetimes), and
  most pruned children are pruned by it already. Space below ``low[t]`` at a time
  ``t`` where something is still to be placed is space no later block can use: the
  bound counts it as waste, so at ``T`` = max-live any waste prunes;
- a dead end: an unplaced block whose key is already below the last key can only be
  placed once its floor rises, i.e. on top of an unplaced block it overlaps; with no such
  block left, the branch is dead;
- symmetry: identical blocks (same lifetime and size) are placed in rank order.

Every pruned child records the bound that pruned it; when the search under ``T`` is
exhausted without a placement, the smallest of those bounds is a proved lower bound on
the optimum (iterative deepening, as IDA* does), which is how the driver
(:mod:`membudget_minisearch.solver`) raises its threshold.

The two implementations
-----------------------
``search_reference`` is a plain recursive function, written for clarity.
``SearchKernel`` keeps the same search in arrays (an explicit stack and undo logs) and
runs it in a Numba kernel a bounded number of nodes at a time, so the driver can stop it
at a time limit and resume it. Both visit the same nodes in the same order: the same
answer, the same node count and the same next threshold (the tests hold them to it).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["Instance", "prepare", "PREFERENCES", "search_reference", "SearchKernel", "FOUND", "EXHAUSTED", "PAUSED"]

PAUSED, EXHAUSTED, FOUND = 0, 1, 2
_INF = np.int64(2**62)


class Instance:
    """The search's view of the active blocks: dense times, ranks, overlap lists.

    ``lower``/``upper`` are time units ``0..horizon``; ``rank[i]`` is block i's place in
    the order of preference (``order[rank[i]] == i``); ``nb_ptr``/``nb_idx`` list, for
    each block, the blocks whose lifetimes intersect its own (CSR); ``twin_prev[i]`` is
    the identical block (same lifetime and size) just before i in rank order, or -1.
    """

    def __init__(self, lower, upper, size, order, pairs=None):
        self.lower = np.ascontiguousarray(lower, dtype=np.int64)
        self.upper = np.ascontiguousarray(upper, dtype=np.int64)
        self.size = np.ascontiguousarray(size, dtype=np.int64)
        n = len(self.size)
        if n and (self.upper <= self.lower).any():  # the sweep below counts on every block lasting
            raise ValueError("an Instance takes blocks that last (lower < upper): prepare() gives them")
        self.n = n
        self.horizon = int(self.upper.max()) if n else 0
        self.order = np.ascontiguousarray(order, dtype=np.int64)
        self.rank = np.empty(n, dtype=np.int64)
        self.rank[self.order] = np.arange(n, dtype=np.int64)
        # overlap lists (sorted by rank, so both implementations see them alike), from each overlapping pair
        first, second = overlapping_pairs(self.lower, self.upper) if pairs is None else pairs
        self.nb_ptr, self.nb_idx = _lists_by_rank(first, second, self.order, n)
        self.twin_prev = np.full(n, -1, dtype=np.int64)
        last: dict[tuple[int, int, int], int] = {}
        for b in self.order:
            key = (int(self.lower[b]), int(self.upper[b]), int(self.size[b]))
            if key in last:
                self.twin_prev[b] = last[key]
            last[key] = int(b)
        live = np.zeros(self.horizon + 1, dtype=np.int64)
        np.add.at(live, self.lower, self.size)
        np.add.at(live, self.upper, -self.size)
        self.live = np.cumsum(live)[: self.horizon]
        self.max_live = int(self.live.max()) if n else 0

    def neighbours(self, i: int) -> np.ndarray:
        return self.nb_idx[self.nb_ptr[i] : self.nb_ptr[i + 1]]


@njit(cache=True)
def _sweep(lower, upper, first, second, fill):
    """The sweep of ``overlapping_pairs``: counts the pairs, and writes them into ``first``/``second``
    when ``fill``."""
    n = len(lower)
    by_start = np.argsort(lower, kind="mergesort")
    by_end = np.argsort(upper, kind="mergesort")
    active = np.empty(n, dtype=np.int64)  # the blocks alive, in no order; where[b]: b's place there
    where = np.full(n, -1, dtype=np.int64)
    alive, ended, pairs = 0, 0, 0
    for k in range(n):
        b = by_start[k]
        while ended < n and upper[by_end[ended]] <= lower[b]:
            gone = by_end[ended]
            ended += 1
            if where[gone] >= 0:
                last = active[alive - 1]
                active[where[gone]] = last
                where[last] = where[gone]
                where[gone] = -1
                alive -= 1
        if fill:
            for j in range(alive):
                first[pairs + j] = active[j]
                second[pairs + j] = b
        pairs += alive
        active[alive] = b
        where[b] = alive
        alive += 1
    return pairs


@njit(cache=True)
def _lists_by_rank(first, second, order, n):
    """Each block's neighbours (the pairs ``first[p], second[p]`` both ways) in rank order, as CSR
    (``ptr``, ``idx``): the lists in any order first, then each block handed to its neighbours' lists
    in rank order, so every list comes out sorted without a sort."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    for p in range(len(first)):
        ptr[first[p] + 1] += 1
        ptr[second[p] + 1] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    unsorted = np.empty(ptr[n], dtype=np.int64)
    filled = ptr[:n].copy()
    for p in range(len(first)):
        a, b = first[p], second[p]
        unsorted[filled[a]] = b
        filled[a] += 1
        unsorted[filled[b]] = a
        filled[b] += 1
    idx = np.empty(ptr[n], dtype=np.int64)
    filled[:] = ptr[:n]
    for r in range(n):
        d = order[r]
        for q in range(ptr[d], ptr[d + 1]):
            s = unsorted[q]
            idx[filled[s]] = d
            filled[s] += 1
    return ptr, idx


def overlapping_pairs(lower, upper):
    """Every pair of blocks whose lifetimes ``[lower, upper)`` intersect, once each, as two arrays, by a
    sweep over the starts: a block overlaps exactly the blocks started no later than it and not ended
    when it starts. Its time is that of the sort plus the pairs (the all-pairs test it replaces was
    quadratic: 8.5 s on 100,000 blocks)."""
    none = np.zeros(0, dtype=np.int64)
    count = _sweep(lower, upper, none, none, False)
    first, second = np.empty(count, dtype=np.int64), np.empty(count, dtype=np.int64)
    _sweep(lower, upper, first, second, True)
    return first, second


PREFERENCES = ("lifetime", "size", "area", "start", "start-size")


def prepare(lower, upper, size, preference="lifetime", pairs=None) -> Instance:
    """An :class:`Instance` for blocks that all occupy something (size > 0, lower < upper).

    ``pairs``: ``overlapping_pairs(lower, upper)`` when the caller has it (it depends on the lifetimes
    alone, not on the order of preference: a portfolio computes it once).

    Times are renumbered densely (the same overlaps). ``preference`` orders blocks of
    equal floor: ``"lifetime"`` (longest first, then largest; best-fit's order),
    ``"size"`` (largest first, then longest), ``"area"`` (size x lifetime, largest first),
    ``"start"`` (earliest first, then longest, then largest: a valley is filled from its
    left edge, bottom-left as in strip packing), ``"start-size"`` (earliest, then largest,
    then longest), ties by trace position; or an integer: a random order drawn with that
    seed.
    """
    lo = np.asarray(lower, dtype=np.int64)
    up = np.asarray(upper, dtype=np.int64)
    sz = np.asarray(size, dtype=np.int64)
    if len(sz) and ((sz <= 0).any() or (up <= lo).any()):
        raise ValueError("prepare() takes active blocks only (size > 0, lower < upper)")
    points = np.unique(np.concatenate([lo, up]))
    dlo = np.searchsorted(points, lo).astype(np.int64)
    dup = np.searchsorted(points, up).astype(np.int64)
    idx = np.arange(len(sz))
    length = dup - dlo
    if isinstance(preference, (int, np.integer)) and not isinstance(preference, bool):
        order = np.random.default_rng(int(preference)).permutation(len(sz))
    elif preference == "lifetime":
        order = np.lexsort((idx, -sz, -length))
    elif preference == "size":
        order = np.lexsort((idx, -length, -sz))
    elif preference == "start":
        order = np.lexsort((idx, -sz, -length, dlo))
    elif preference == "start-size":
        order = np.lexsort((idx, -length, -sz, dlo))
    elif preference == "area":
        order = np.lexsort((idx, -sz, -(sz.astype(np.float64) * length)))
    else:
        raise ValueError(f"preference must be one of {', '.join(PREFERENCES)} or a seed, got {preference!r}")
    return Instance(dlo, dup, sz, order, pairs)


# --------------------------------------------------------------------------- reference


def search_reference(inst: Instance, threshold: int, max_nodes: int | None = None, deepest: dict | None = None):
    """Is there a placement of ``inst`` with arena <= ``threshold``? Plain recursive search.

    Returns ``(status, offsets, nodes, next_bound)``: ``status`` is ``FOUND`` (``offsets``
    then holds one), ``EXHAUSTED`` (none exists; ``next_bound`` is a proved lower bound on
    the optimum, above ``threshold``) or ``PAUSED`` (``max_nodes`` children were tried).
    A node is one child tried (placed or pruned). ``deepest``, when given, receives the
    first partial placement of the greatest depth reached (``depth``, ``placed``,
    ``offsets``), from which the driver completes an incumbent.
    """
    n = inst.n
    lower, upper, size, rank = inst.lower.tolist(), inst.upper.tolist(), inst.size.tolist(), inst.rank.tolist()
    twin = inst.twin_prev.tolist()
    nbs = [inst.neighbours(i).tolist() for i in range(n)]
    placed = [False] * n
    offset = [0] * n
    floor = [0] * n
    unplaced_nb = [len(nbs[i]) for i in range(n)]
    U = inst.live.tolist()  # bytes of unplaced blocks alive at t
    sky = [0] * inst.horizon  # highest top of placed blocks alive at t
    state = {"nodes": 0, "bound": int(_INF)}

    class Pause(Exception):
        pass

    def section_bound(o):
        # first the cheap form, with the skyline: it prunes most children
        best = 0
        for t in range(inst.horizon):
            if U[t] > 0:
                best = max(best, max(o, sky[t]) + U[t])
        if best > threshold:
            return best
        # the lowest an unplaced block alive at t can go: its floor (and o)
        low = [int(_INF)] * inst.horizon
        for b in range(n):
            if not placed[b]:
                for t in range(lower[b], upper[b]):
                    low[t] = min(low[t], floor[b])
        best = 0
        for t in range(inst.horizon):
            if U[t] > 0:
                best = max(best, max(o, low[t]) + U[t])
        return best

    def dead_end(key):
        for b in range(n):
            if not placed[b] and (floor[b], rank[b]) < key and unplaced_nb[b] == 0:
                return True
        return False

    def dfs(depth, key):
        if depth == n:
            return True
        candidates = sorted(
            (floor[b], rank[b], b) for b in range(n)
            if not placed[b] and (floor[b], rank[b]) > key and (twin[b] < 0 or placed[twin[b]])
        )
        for f, r, c in candidates:
            if max_nodes is not None and state["nodes"] >= max_nodes:
                raise Pause
            state["nodes"] += 1
            top = f + size[c]
            if top > threshold:
                state["bound"] = min(state["bound"], top)
                continue
            # place c at its floor
            placed[c], offset[c] = True, f
            old_sky = sky[lower[c] : upper[c]]
            for t in range(lower[c], upper[c]):
                U[t] -= size[c]
                sky[t] = top
            old_floor = [(b, floor[b]) for b in nbs[c]]
            for b in nbs[c]:
                unplaced_nb[b] -= 1
                if not placed[b] and top > floor[b]:
                    floor[b] = top
            bound = int(_INF) if dead_end((f, r)) else section_bound(f)
            if bound > threshold:
                state["bound"] = min(state["bound"], bound)
            else:
                if deepest is not None and depth + 1 > deepest.get("depth", 0):
                    deepest.update(depth=depth + 1, placed=np.array(placed, dtype=np.bool_),
                                   offsets=np.array(offset, dtype=np.int64))
                if dfs(depth + 1, (f, r)):
                    return True
            # undo
            for b, v in old_floor:
                floor[b] = v
                unplaced_nb[b] += 1
            for t in range(lower[c], upper[c]):
                U[t] += size[c]
            sky[lower[c] : upper[c]] = old_sky
            placed[c] = False
        return False

    try:
        found = dfs(0, (-1, -1))
    except Pause:
        return PAUSED, None, state["nodes"], state["bound"]
    if found:
        return FOUND, np.asarray(offset, dtype=np.int64), state["nodes"], state["bound"]
    return EXHAUSTED, None, state["nodes"], state["bound"]


# --------------------------------------------------------------------------- kernel

# regs: 0 depth, 1 nodes, 2 next bound, 3 status, 4 threshold
_DEPTH, _NODES, _BOUND, _STATUS, _THRESHOLD, _DEEPEST = 0, 1, 2, 3, 4, 5


@njit(cache=True)
def _undo(c, lower, upper, size, nb_ptr, nb_idx, placed, floor, unplaced_nb, U, sky,
          fl_b, fl_v, fl_ptr, sky_old, sky_ptr, depth):
    """Undo the placement of block ``c``, made at ``depth``."""
    for k in range(fl_ptr[depth], fl_ptr[depth + 1]):
        floor[fl_b[k]] = fl_v[k]
    for k in range(nb_ptr[c], nb_ptr[c + 1]):
        unplaced_nb[nb_idx[k]] += 1
    base = sky_ptr[depth]
    for t in range(lower[c], upper[c]):
        U[t] += size[c]
        sky[t] = sky_old[base + t - lower[c]]
    placed[c] = False


@njit(cache=True)
def _run(lower, upper, size, rank, twin_prev, nb_ptr, nb_idx, horizon,
         placed, offset, floor, unplaced_nb, U, sky,
         blk, key_f, key_r, fl_b, fl_v, fl_ptr, sky_old, sky_ptr, low, deep_placed, deep_off, regs, max_nodes):
    """Advance the search by at most ``max_nodes`` children; the state lives in the arrays.

    ``key_f[d], key_r[d]``: the key of the last child tried at depth d (at first the key
    of the block placed at depth d - 1); ``blk[d]``: the block placed at depth d.
    """
    n = len(size)
    threshold = regs[_THRESHOLD]
    depth = regs[_DEPTH]
    nodes = regs[_NODES]
    bound = regs[_BOUND]
    budget = nodes + max_nodes
    while True:
        if depth == n:
            regs[_STATUS] = 2
            break
        # the next child: the smallest key (floor, rank) above key[depth]
        kf = key_f[depth]
        kr = key_r[depth]
        c = -1
        cf = _INF
        cr = _INF
        for b in range(n):
            if placed[b]:
                continue
            fb = floor[b]
            rb = rank[b]
            if fb < kf or (fb == kf and rb <= kr):
                continue
            if fb > cf or (fb == cf and rb >= cr):
                continue
            tw = twin_prev[b]
            if tw >= 0 and not placed[tw]:
                continue
            c = b
            cf = fb
            cr = rb
        if c < 0:
            # no child left: backtrack
            if depth == 0:
                regs[_STATUS] = 1
                break
            depth -= 1
            _undo(blk[depth], lower, upper, size, nb_ptr, nb_idx, placed, floor, unplaced_nb, U, sky,
                  fl_b, fl_v, fl_ptr, sky_old, sky_ptr, depth)
            continue
        if nodes >= budget:
            regs[_STATUS] = 0
            break
        nodes += 1
        key_f[depth] = cf
        key_r[depth] = cr
        top = cf + size[c]
        if top > threshold:
            if top < bound:
                bound = top
            continue
        # place c at its floor
        placed[c] = True
        offset[c] = cf
        base = sky_ptr[depth]
        for t in range(lower[c], upper[c]):
            sky_old[base + t - lower[c]] = sky[t]
            U[t] -= size[c]
            sky[t] = top
        sky_ptr[depth + 1] = base + upper[c] - lower[c]
        k = fl_ptr[depth]
        for j in range(nb_ptr[c], nb_ptr[c + 1]):
            b = nb_idx[j]
            unplaced_nb[b] -= 1
            if not placed[b] and top > floor[b]:
                fl_b[k] = b
                fl_v[k] = floor[b]
                k += 1
                floor[b] = top
        fl_ptr[depth + 1] = k
        # dead end, then the section bound
        nb = np.int64(0)
        for b in range(n):
            if (not placed[b]) and unplaced_nb[b] == 0 and (floor[b] < cf or (floor[b] == cf and rank[b] < cr)):
                nb = _INF
                break
        if nb == 0:
            for t in range(horizon):
                if U[t] > 0:
                    v = (cf if cf > sky[t] else sky[t]) + U[t]
                    if v > nb:
                        nb = v
        if nb <= threshold:
            nb = 0
            for t in range(horizon):
                low[t] = _INF
            for b in range(n):
                if not placed[b]:
                    fb = floor[b]
                    for t in range(lower[b], upper[b]):
                        if fb < low[t]:
                            low[t] = fb
            for t in range(horizon):
                if U[t] > 0:
                    v = (cf if cf > low[t] else low[t]) + U[t]
                    if v > nb:
                        nb = v
        if nb > threshold:
            if nb < bound:
                bound = nb
            _undo(c, lower, upper, size, nb_ptr, nb_idx, placed, floor, unplaced_nb, U, sky,
                  fl_b, fl_v, fl_ptr, sky_old, sky_ptr, depth)
            continue
        blk[depth] = c
        depth += 1
        key_f[depth] = cf
        key_r[depth] = cr
        if depth > regs[_DEEPEST]:  # the first partial placement this deep: kept for the driver
            regs[_DEEPEST] = depth
            for b in range(n):
                deep_placed[b] = placed[b]
                deep_off[b] = offset[b]
    regs[_DEPTH] = depth
    regs[_NODES] = nodes
    regs[_BOUND] = bound


class SearchKernel:
    """The Numba search for one threshold, resumable: ``advance(max_nodes)`` until it is not ``PAUSED``.

    ``status``, ``nodes``, ``next_bound`` and (once ``FOUND``) ``offsets`` mean what
    :func:`search_reference` returns.
    """

    def __init__(self, inst: Instance, threshold: int):
        n, T = inst.n, inst.horizon
        self.inst = inst
        self.placed = np.zeros(n, dtype=np.bool_)
        self.offset = np.zeros(n, dtype=np.int64)
        self.floor = np.zeros(n, dtype=np.int64)
        self.unplaced_nb = np.diff(inst.nb_ptr).astype(np.int64)
        self.U = inst.live.copy()
        self.sky = np.zeros(T, dtype=np.int64)
        self.low = np.zeros(T, dtype=np.int64)
        self.blk = np.zeros(n + 1, dtype=np.int64)
        self.key_f = np.full(n + 1, -1, dtype=np.int64)
        self.key_r = np.full(n + 1, -1, dtype=np.int64)
        self.fl_b = np.zeros(max(1, len(inst.nb_idx)), dtype=np.int64)
        self.fl_v = np.zeros(max(1, len(inst.nb_idx)), dtype=np.int64)
        self.fl_ptr = np.zeros(n + 2, dtype=np.int64)
        self.sky_old = np.zeros(max(1, int((inst.upper - inst.lower).sum())), dtype=np.int64)
        self.sky_ptr = np.zeros(n + 2, dtype=np.int64)
        self.deep_placed = np.zeros(n, dtype=np.bool_)
        self.deep_off = np.zeros(n, dtype=np.int64)
        self.regs = np.array([0, 0, _INF, PAUSED, threshold, 0], dtype=np.int64)

    def advance(self, max_nodes: int) -> int:
        """Run at most ``max_nodes`` more children; returns the status."""
        if self.status != PAUSED:
            return self.status
        i = self.inst
        _run(i.lower, i.upper, i.size, i.rank, i.twin_prev, i.nb_ptr, i.nb_idx, i.horizon,
             self.placed, self.offset, self.floor, self.unplaced_nb, self.U, self.sky,
             self.blk, self.key_f, self.key_r, self.fl_b, self.fl_v, self.fl_ptr, self.sky_old, self.sky_ptr,
             self.low, self.deep_placed, self.deep_off, self.regs, np.int64(max_nodes))
        return self.status

    @property
    def status(self) -> int:
        return int(self.regs[_STATUS])

    @property
    def nodes(self) -> int:
        return int(self.regs[_NODES])

    @property
    def next_bound(self) -> int:
        return int(self.regs[_BOUND])

    @property
    def deepest(self) -> dict:
        """The first partial placement of the greatest depth reached (as :func:`search_reference` gives it)."""
        d = int(self.regs[_DEEPEST])
        if d == 0:
            return {}
        return {"depth": d, "placed": self.deep_placed.copy(), "offsets": self.deep_off.copy()}

    @property
    def offsets(self) -> np.ndarray | None:
        return self.offset.copy() if self.status == FOUND else None
