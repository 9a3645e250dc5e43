"""The best-fit heuristic of papers/003 section 3.2: a Numba kernel and a plain-Python reference.

Both take the blocks as three integer arrays (``lower``, ``upper``: half-open lifetimes
``[lower, upper)``; ``size``) and return one offset per block. They make exactly the same
choices, so they return exactly the same offsets (the tests hold them to it).

The heuristic (papers/003 section 3.2, after Burke et al. 2004)
--------------------------------------------------------------
Time runs along x, addresses along y. The tops of the blocks placed so far form a
skyline: a sequence of *offset lines*, each a time range ``[xs, xe)`` at a height ``h``
(adjacent lines always have different heights: equal neighbours are one line). At the
start there is one line at height 0 over the whole trace. Until every block is placed:

1. choose the lowest offset line, the leftmost among equally low ones;
2. among the unplaced blocks that can be placed on it without colliding with a placed
   block (their lifetime lies inside ``[xs, xe)``), take the one with the longest
   lifetime and place it at offset ``h``; the line splits into up to three (the part
   before the block, the block's top at ``h + size``, the part after it);
3. if no block can be placed there, lift the line up to the lower of its neighbours and
   merge it with that neighbour (with both when they are equally high), and go to 1.

Ties the paper leaves open are broken the same way in both implementations: between
blocks of equal lifetime, the larger one; then the one that comes first in the trace.
Blocks that occupy nothing (size 0 or an empty lifetime) get offset 0 and take no part.

``bestfit_kernel`` and ``bestfit_reference`` run the heuristic on the times as given.
``bestfit_offsets`` (what the ``bestfit`` allocator calls) first takes the times to
:func:`canonical_times`: the same overlaps, without the order that section 4.1's
counting puts on events that do not interact (allocations in a row, frees in a row, and
the simultaneous events of a simulated run, which ``to_int_trace`` orders by trace
position). The heuristic is sensitive to that order although the instance is not.

Cost
----
The reference scans every offset line and every unplaced block at each step (quadratic
and then some). The kernel keeps the lines in a linked list with a binary heap on
``(height, start)``. The unplaced blocks are indexed twice: by start (``lower``), under a
min segment tree of their ends, so that a line no block fits is recognised in O(log n)
and lifted; and by preference (longest, largest, first), under a segment tree of their
largest start and smallest end. The best block for a line is then found by two searches
in lock step (see ``_best_block``), which keeps the work near the cheaper of the two on
every kind of trace.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "bestfit_kernel", "bestfit_reference", "bestfit_offsets", "bestfit_rounds", "canonical_times", "paper_priority",
    "active_blocks", "compile_kernels",
]


# --------------------------------------------------------------------------- reference


def bestfit_reference(lower, upper, size, priority=None) -> np.ndarray:
    """Plain-Python best-fit (papers/003 section 3.2), written for clarity, not speed.

    ``priority``: as for :func:`bestfit_kernel` (``None``: the paper's longest lifetime first).
    """
    lower = [int(x) for x in lower]
    upper = [int(x) for x in upper]
    size = [int(x) for x in size]
    n = len(size)
    offsets = [0] * n
    unplaced = [i for i in range(n) if size[i] > 0 and upper[i] > lower[i]]
    if not unplaced:
        return np.zeros(n, dtype=np.int64)
    if priority is None:  # the paper: longest lifetime; then the larger block, the first in the trace
        def preference(i):
            return (-(upper[i] - lower[i]), -size[i], i)
    else:
        rank = {int(b): r for r, b in enumerate(priority)}
        if sorted(rank) != unplaced or len(rank) != len(priority):
            raise ValueError("priority must hold every active block exactly once")
        preference = rank.__getitem__
    # offset lines, in time order: [start, end, height]
    lines = [[min(lower[i] for i in unplaced), max(upper[i] for i in unplaced), 0]]
    while unplaced:
        k = min(range(len(lines)), key=lambda j: (lines[j][2], lines[j][0]))
        xs, xe, h = lines[k]
        best = None
        for i in unplaced:
            if xs <= lower[i] and upper[i] <= xe:
                key = preference(i)
                if best is None or key < best[0]:
                    best = (key, i)
        if best is not None:
            i = best[1]
            offsets[i] = h
            unplaced.remove(i)
            new = []
            if lower[i] > xs:
                new.append([xs, lower[i], h])
            new.append([lower[i], upper[i], h + size[i]])
            if upper[i] < xe:
                new.append([upper[i], xe, h])
            lines[k : k + 1] = new
        else:
            heights = []
            if k > 0:
                heights.append(lines[k - 1][2])
            if k + 1 < len(lines):
                heights.append(lines[k + 1][2])
            if not heights:
                raise RuntimeError("best-fit: a block fits nowhere (corrupt trace)")
            lines[k][2] = min(heights)
        # adjacent lines of equal height are one line
        merged = [lines[0]]
        for line in lines[1:]:
            if line[2] == merged[-1][2]:
                merged[-1][1] = line[1]
            else:
                merged.append(line)
        lines = merged
    return np.asarray(offsets, dtype=np.int64)


# --------------------------------------------------------------------------- kernel


_INF = np.int64(2**62)


@njit(cache=True)
def _pick(a, b, use_max):
    if use_max:
        return a if a > b else b
    return a if a < b else b


@njit(cache=True)
def _build(tree, tsize, use_max):
    """Fill the inner nodes of a min (or max) segment tree from its leaves."""
    for node in range(tsize - 1, 0, -1):
        tree[node] = _pick(tree[2 * node], tree[2 * node + 1], use_max)


@njit(cache=True)
def _set(tree, tsize, leaf, value, use_max):
    """Set a leaf of a min (or max) segment tree and repair the path to the root."""
    node = leaf + tsize
    tree[node] = value
    node >>= 1
    while node >= 1:
        tree[node] = _pick(tree[2 * node], tree[2 * node + 1], use_max)
        node >>= 1


@njit(cache=True)
def _range_min(tree, tsize, lo, hi):
    """The smallest leaf value in ``[lo, hi)``."""
    out = _INF
    l = lo + tsize
    r = hi + tsize
    while l < r:
        if l & 1:
            if tree[l] < out:
                out = tree[l]
            l += 1
        if r & 1:
            r -= 1
            if tree[r] < out:
                out = tree[r]
        l >>= 1
        r >>= 1
    return out


@njit(cache=True)
def _find(nxt, p):
    """The first unplaced position >= p (union-find with path compression)."""
    root = p
    while nxt[root] != root:
        root = nxt[root]
    while nxt[p] != root:
        q = nxt[p]
        nxt[p] = root
        p = q
    return root


@njit(cache=True)
def _best_block(xs, xe, lo, hi, first, m, pos_lower, pos_block, nxt, lower, upper,
                maxlow, minup_r, tsize, rank_block, rank_of, by_lifetime, roots, stack):
    """The best block for the line ``[xs, xe)``: the first in the order of preference that fits.

    The caller has checked that some block fits. Two searches run in lock step, one unit
    of work each in turn, and the first to finish answers (both give the same block):

    - a scan of the unplaced blocks that start inside the line, in order of start, keeping
      the best rank; in the paper's order (``by_lifetime``) it stops once no
      later-starting block can live longer than the best found;
    - a walk of the rank tree (blocks in order of preference, from the first one not
      longer than the line) that skips every subtree whose blocks all start before
      ``xs`` or all end after ``xe``; the first block it reaches that fits is the best.

    The scan wins when lines are narrow and blocks short, the walk when many short blocks
    fit a wide line but the best one starts late in it.
    """
    # canonical nodes of the rank range [first, m), left to right
    half = roots.shape[0] // 2
    nl = 0
    nr = 0
    l = first + tsize
    r = m + tsize
    while l < r:
        if l & 1:
            roots[nl] = l
            nl += 1
            l += 1
        if r & 1:
            r -= 1
            roots[half + nr] = r
            nr += 1
        l >>= 1
        r >>= 1
    for k in range(nr):
        roots[nl + k] = roots[half + nr - 1 - k]
    nroots = nl + nr
    k = 0
    sp = 0
    walking = True
    # the scan
    p = _find(nxt, lo)
    best_b = -1
    best_len = -1
    best_rank = m
    while True:
        if p >= hi or (by_lifetime and xe - pos_lower[p] < best_len):
            return best_b
        b = pos_block[p]
        if upper[b] <= xe and rank_of[b] < best_rank:
            best_b = b
            best_len = upper[b] - lower[b]
            best_rank = rank_of[b]
        p = _find(nxt, p + 1)
        if walking:
            if sp == 0:
                if k == nroots:
                    walking = False
                    continue
                stack[0] = roots[k]
                k += 1
                sp = 1
            sp -= 1
            node = stack[sp]
            if maxlow[node] >= xs and minup_r[node] <= xe:
                if node >= tsize:
                    return rank_block[node - tsize]
                stack[sp] = 2 * node + 1
                stack[sp + 1] = 2 * node
                sp += 2


@njit(cache=True)
def _less(h1, x1, h2, x2):
    return h1 < h2 or (h1 == h2 and x1 < x2)


@njit(cache=True)
def _heap_push(hh, hx, hs, hv, count, h, x, s, v):
    i = count
    hh[i] = h
    hx[i] = x
    hs[i] = s
    hv[i] = v
    while i > 0:
        parent = (i - 1) // 2
        if _less(hh[i], hx[i], hh[parent], hx[parent]):
            hh[i], hh[parent] = hh[parent], hh[i]
            hx[i], hx[parent] = hx[parent], hx[i]
            hs[i], hs[parent] = hs[parent], hs[i]
            hv[i], hv[parent] = hv[parent], hv[i]
            i = parent
        else:
            break
    return count + 1


@njit(cache=True)
def _heap_pop(hh, hx, hs, hv, count):
    """Remove the top entry (the caller has read it); returns the new count."""
    count -= 1
    hh[0] = hh[count]
    hx[0] = hx[count]
    hs[0] = hs[count]
    hv[0] = hv[count]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= count:
            break
        child = left
        right = left + 1
        if right < count and _less(hh[right], hx[right], hh[left], hx[left]):
            child = right
        if _less(hh[child], hx[child], hh[i], hx[i]):
            hh[i], hh[child] = hh[child], hh[i]
            hx[i], hx[child] = hx[child], hx[i]
            hs[i], hs[child] = hs[child], hs[i]
            hv[i], hv[child] = hv[child], hv[i]
            i = child
        else:
            break
    return count


def active_blocks(lower, upper, size) -> np.ndarray:
    """Indices of the blocks that occupy something (size > 0, non-empty lifetime), in trace order."""
    return np.flatnonzero((np.asarray(size) > 0) & (np.asarray(upper) > np.asarray(lower)))


def paper_priority(lower, upper, size) -> np.ndarray:
    """The active blocks in section 3.2's order of preference: the longest lifetime first.

    Ties the paper leaves open: the larger block, then the one first in the trace.
    """
    act = active_blocks(lower, upper, size)
    lo, up, sz = (np.asarray(a, dtype=np.int64)[act] for a in (lower, upper, size))
    return act[np.lexsort((act, -sz, lo - up))]


def bestfit_kernel(lower, upper, size, priority=None) -> np.ndarray:
    """Numba best-fit (papers/003 section 3.2) over int64 arrays; same result as the reference.

    ``priority``: the active blocks (:func:`active_blocks`) in order of preference, the
    block a line takes being the first of them that fits it; ``None`` is the paper's
    order (:func:`paper_priority`). Any other order is the extension of
    :mod:`membudget_bestfit.improve`.
    """
    lo, up, sz = (np.ascontiguousarray(a, dtype=np.int64) for a in (lower, upper, size))
    if priority is None:
        priority = paper_priority(lo, up, sz)
    rank_block = np.ascontiguousarray(priority, dtype=np.int64)
    if not np.array_equal(np.sort(rank_block), active_blocks(lo, up, sz)):
        raise ValueError("priority must hold every active block exactly once")
    return _bestfit_core(lo, up, sz, rank_block)


@njit(cache=True)
def _bestfit_core(lower, upper, size, rank_block):
    """The kernel proper: ``rank_block`` holds the active blocks, the preferred first."""
    n = size.shape[0]
    offsets = np.zeros(n, dtype=np.int64)
    m = rank_block.shape[0]
    if m == 0:
        return offsets
    act = np.sort(rank_block)
    order = np.argsort(lower[act], kind="mergesort")  # stable: index order among equal lowers
    pos_block = act[order]
    pos_lower = lower[pos_block]
    # ranks: the order of preference, under a segment tree of the largest lower and the
    # smallest upper of the unplaced blocks: the best block for a line is the first rank
    # whose block starts at or after the line's start and ends by its end (see _best_block)
    neg_len = lower[rank_block] - upper[rank_block]  # -lifetime along the ranks
    # the paper's order (longest first) lets both searches skip the blocks longer than the line
    by_lifetime = True
    for r in range(1, m):
        if neg_len[r] < neg_len[r - 1]:
            by_lifetime = False
            break
    rank_of = np.empty(n, dtype=np.int64)
    for r in range(m):
        rank_of[rank_block[r]] = r
    tsize = 1
    while tsize < m:
        tsize *= 2
    maxlow = np.full(2 * tsize, -_INF, dtype=np.int64)
    minup_r = np.full(2 * tsize, _INF, dtype=np.int64)
    for r in range(m):
        maxlow[tsize + r] = lower[rank_block[r]]
        minup_r[tsize + r] = upper[rank_block[r]]
    _build(maxlow, tsize, True)
    _build(minup_r, tsize, False)
    # a segment tree over positions (blocks sorted by lower) keeps the smallest upper, so
    # that a line no block fits is recognised without a search
    minup_p = np.full(2 * tsize, _INF, dtype=np.int64)
    for p in range(m):
        minup_p[tsize + p] = upper[pos_block[p]]
    _build(minup_p, tsize, False)
    pos_of = np.empty(n, dtype=np.int64)
    for p in range(m):
        pos_of[pos_block[p]] = p
    nxt = np.arange(m + 1).astype(np.int64)  # skip list over placed positions; m is the sentinel
    stack = np.empty(256, dtype=np.int64)
    roots = np.empty(256, dtype=np.int64)

    t0 = pos_lower[0]
    t1 = upper[pos_block[0]]
    for p in range(m):
        if upper[pos_block[p]] > t1:
            t1 = upper[pos_block[p]]

    cap = 2 * m + 4
    sxs = np.empty(cap, dtype=np.int64)
    sxe = np.empty(cap, dtype=np.int64)
    sh = np.empty(cap, dtype=np.int64)
    sprev = np.empty(cap, dtype=np.int64)
    snext = np.empty(cap, dtype=np.int64)
    salive = np.zeros(cap, dtype=np.bool_)
    sver = np.zeros(cap, dtype=np.int64)
    nseg = 1
    sxs[0] = t0
    sxe[0] = t1
    sh[0] = 0
    sprev[0] = -1
    snext[0] = -1
    salive[0] = True

    hcap = 5 * m + 8
    hh = np.empty(hcap, dtype=np.int64)
    hx = np.empty(hcap, dtype=np.int64)
    hs = np.empty(hcap, dtype=np.int64)
    hv = np.empty(hcap, dtype=np.int64)
    hcount = 0
    hcount = _heap_push(hh, hx, hs, hv, hcount, 0, t0, 0, 0)

    placed = 0
    while placed < m:
        if hcount == 0:
            raise RuntimeError("best-fit: no offset line left")
        s = hs[0]
        v = hv[0]
        hcount = _heap_pop(hh, hx, hs, hv, hcount)
        if not salive[s] or sver[s] != v:
            continue  # stale entry
        xs = sxs[s]
        xe = sxe[s]
        h = sh[s]
        # the best unplaced block with xs <= lower and upper <= xe, if any
        lo = np.searchsorted(pos_lower, xs)  # first block starting at or after xs
        hi = np.searchsorted(pos_lower, xe)  # first block starting at or after xe
        b = -1
        if lo < hi and _range_min(minup_p, tsize, lo, hi) <= xe:
            # blocks longer than the line cannot fit: start at the first rank that is not
            first = np.searchsorted(neg_len, -(xe - xs)) if by_lifetime else 0
            b = _best_block(xs, xe, lo, hi, first, m, pos_lower, pos_block, nxt, lower, upper,
                            maxlow, minup_r, tsize, rank_block, rank_of, by_lifetime, roots, stack)
        pv = sprev[s]
        nx = snext[s]
        if b >= 0:
            offsets[b] = h
            r = rank_of[b]
            _set(maxlow, tsize, r, -_INF, True)
            _set(minup_r, tsize, r, _INF, False)
            _set(minup_p, tsize, pos_of[b], _INF, False)
            nxt[pos_of[b]] = pos_of[b] + 1
            placed += 1
            lb = lower[b]
            ub = upper[b]
            top = h + size[b]
            left = -1
            right = -1
            if lb > xs:
                left = nseg
                nseg += 1
                sxs[left] = xs
                sxe[left] = lb
                sh[left] = h
                salive[left] = True
                sver[left] = 0
            if ub < xe:
                right = nseg
                nseg += 1
                sxs[right] = ub
                sxe[right] = xe
                sh[right] = h
                salive[right] = True
                sver[right] = 0
            # s becomes the block's top
            sxs[s] = lb
            sxe[s] = ub
            sh[s] = top
            sver[s] += 1
            # link pv - left - s - right - nx
            if left >= 0:
                sprev[left] = pv
                snext[left] = s
                if pv >= 0:
                    snext[pv] = left
                sprev[s] = left
            if right >= 0:
                sprev[right] = s
                snext[right] = nx
                if nx >= 0:
                    sprev[nx] = right
                snext[s] = right
            # merge s with an equally high neighbour
            if left < 0 and pv >= 0 and sh[pv] == top:
                sxs[s] = sxs[pv]
                salive[pv] = False
                sprev[s] = sprev[pv]
                if sprev[pv] >= 0:
                    snext[sprev[pv]] = s
            if right < 0 and nx >= 0 and sh[nx] == top:
                sxe[s] = sxe[nx]
                salive[nx] = False
                snext[s] = snext[nx]
                if snext[nx] >= 0:
                    sprev[snext[nx]] = s
            hcount = _heap_push(hh, hx, hs, hv, hcount, sh[s], sxs[s], s, sver[s])
            if left >= 0:
                hcount = _heap_push(hh, hx, hs, hv, hcount, sh[left], sxs[left], left, sver[left])
            if right >= 0:
                hcount = _heap_push(hh, hx, hs, hv, hcount, sh[right], sxs[right], right, sver[right])
        else:
            # lift the line to its lower neighbour and merge (with both when equal)
            if pv < 0 and nx < 0:
                raise RuntimeError("best-fit: a block fits nowhere (corrupt trace)")
            if pv < 0:
                newh = sh[nx]
            elif nx < 0:
                newh = sh[pv]
            else:
                newh = min(sh[pv], sh[nx])
            sh[s] = newh
            if pv >= 0 and sh[pv] == newh:
                sxs[s] = sxs[pv]
                salive[pv] = False
                sprev[s] = sprev[pv]
                if sprev[pv] >= 0:
                    snext[sprev[pv]] = s
            if nx >= 0 and sh[nx] == newh:
                sxe[s] = sxe[nx]
                salive[nx] = False
                snext[s] = snext[nx]
                if snext[nx] >= 0:
                    sprev[snext[nx]] = s
            sver[s] += 1
            hcount = _heap_push(hh, hx, hs, hv, hcount, sh[s], sxs[s], s, sver[s])
    return offsets


def canonical_times(lower, upper, size) -> tuple[np.ndarray, np.ndarray]:
    """The same blocks with the coarsest times that keep every overlap: ``(lower, upper)``.

    Section 4.1 gives every event a time of its own, so events that do not interact are
    still put in an order: allocations made one after another with no free in between
    (or at the same instant of a simulated run, which ``to_int_trace`` orders by trace
    position), likewise frees. That order changes no overlap (the set E of section 3.1,
    all the DSA instance is made of), but best-fit sees it: a block allocated one event
    before a longer one straddles the edge of the offset line the longer one leaves, fits
    no line there, and the line is lifted over empty space (25% above max-live on the
    offload-everything ResNet-18 traces of the quick suite). Here each run of
    consecutive allocations shares one time, and so does each run of consecutive frees
    (a free run and the allocation run after it share one: lifetimes are half-open).

    Two blocks overlap after this exactly when they overlapped before, so a placement of
    the new times is valid for the old ones. Blocks that occupy nothing (size 0 or an
    empty lifetime) get ``[0, 0)``.
    """
    lo = np.ascontiguousarray(lower, dtype=np.int64)
    up = np.ascontiguousarray(upper, dtype=np.int64)
    sz = np.ascontiguousarray(size, dtype=np.int64)
    active = (sz > 0) & (up > lo)
    new_lo = np.zeros_like(lo)
    new_up = np.zeros_like(up)
    if not active.any():
        return new_lo, new_up
    a_lo, a_up = lo[active], up[active]
    points = np.unique(np.concatenate([a_lo, a_up]))  # each: its frees, then its allocations
    has_free = np.isin(points, a_up)
    has_alloc = np.isin(points, a_lo)
    # a new time starts at each free run that follows an allocation run
    step = np.zeros(len(points), dtype=np.int64)
    step[1:] = has_free[1:] & has_alloc[:-1]
    time = np.cumsum(step)
    new_lo[active] = time[np.searchsorted(points, a_lo)]
    new_up[active] = time[np.searchsorted(points, a_up)]
    return new_lo, new_up


_COMPILED = False


def compile_kernels() -> None:
    """Compile the kernel (or load it from Numba's cache) once per process, so that a time limit counts
    placing, not compiling (about 10 s with an empty cache)."""
    global _COMPILED
    if not _COMPILED:
        one = np.ones(2, dtype=np.int64)
        bestfit_kernel(one * 0, one, one)
        _COMPILED = True


def bestfit_offsets(lower, upper, size, *, kernel: str = "numba", canonical: bool = True,
                    paper_only: bool = False, rounds: int | None = None,
                    deadline: float | None = None) -> np.ndarray:
    """Best-fit offsets for the blocks ``[lower, upper)`` of ``size`` bytes.

    ``kernel``: ``"numba"`` (compiled, cached on disk) or ``"python"`` (the reference).
    ``canonical``: run the heuristic on :func:`canonical_times` (the default: the same
    instance without the order section 4.1's counting puts on events that do not
    interact); ``False`` runs it on the times as given.
    ``paper_only``: section 3.2's rule, one pass. Otherwise (the default) the squeaky-wheel
    rounds of :mod:`membudget_bestfit.improve` (``rounds`` of them at most, default
    ``improve.DEFAULT_ROUNDS``, until ``deadline``, a ``time.perf_counter()`` value, if
    given), whose first round is that pass and whose result is never larger.
    """
    return bestfit_rounds(lower, upper, size, kernel=kernel, canonical=canonical, paper_only=paper_only,
                          rounds=rounds, deadline=deadline).offsets


def bestfit_rounds(lower, upper, size, *, kernel: str = "numba", canonical: bool = True,
                   paper_only: bool = False, rounds: int | None = None, deadline: float | None = None):
    """:func:`bestfit_offsets` with how many rounds ran and whether the deadline ended them
    (:class:`membudget_bestfit.improve.Rounds`)."""
    from harness.allocators.trace import IntTrace, max_live_bytes
    from membudget_bestfit.improve import DEFAULT_ROUNDS, Rounds, squeaky_wheel

    if kernel not in ("numba", "python"):
        raise ValueError(f"kernel must be 'numba' or 'python', got {kernel!r}")
    lo = np.ascontiguousarray(lower, dtype=np.int64)
    up = np.ascontiguousarray(upper, dtype=np.int64)
    sz = np.ascontiguousarray(size, dtype=np.int64)
    if canonical:
        lo, up = canonical_times(lo, up, sz)
    if paper_only:
        return Rounds(bestfit_kernel(lo, up, sz) if kernel == "numba" else bestfit_reference(lo, up, sz), 1, False)
    bound = max_live_bytes(IntTrace(lo, up, sz))
    return squeaky_wheel(lo, up, sz, lower_bound=bound, kernel=kernel, deadline=deadline,
                         rounds=DEFAULT_ROUNDS if rounds is None else rounds)
