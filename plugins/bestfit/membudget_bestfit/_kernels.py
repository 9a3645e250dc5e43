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

Cost
----
The reference scans every offset line and every unplaced block at each step (quadratic
and then some). The kernel keeps the lines in a linked list with a binary heap on
``(height, start)``, and the unplaced blocks sorted by ``lower`` with a skip list
(union-find ``next unplaced``) so that a search visits only the unplaced blocks that start
inside the line, and stops as soon as no later-starting block can be longer than the best
found so far.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["bestfit_kernel", "bestfit_reference", "bestfit_offsets"]


# --------------------------------------------------------------------------- reference


def bestfit_reference(lower, upper, size) -> np.ndarray:
    """Plain-Python best-fit (papers/003 section 3.2), written for clarity, not speed."""
    lower = [int(x) for x in lower]
    upper = [int(x) for x in upper]
    size = [int(x) for x in size]
    n = len(size)
    offsets = [0] * n
    unplaced = [i for i in range(n) if size[i] > 0 and upper[i] > lower[i]]
    if not unplaced:
        return np.zeros(n, dtype=np.int64)
    # offset lines, in time order: [start, end, height]
    lines = [[min(lower[i] for i in unplaced), max(upper[i] for i in unplaced), 0]]
    while unplaced:
        k = min(range(len(lines)), key=lambda j: (lines[j][2], lines[j][0]))
        xs, xe, h = lines[k]
        best = None
        for i in unplaced:
            if xs <= lower[i] and upper[i] <= xe:
                key = (upper[i] - lower[i], size[i], -i)
                if best is None or key > best[0]:
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


@njit(cache=True)
def bestfit_kernel(lower, upper, size):
    """Numba best-fit (papers/003 section 3.2) over int64 arrays; same result as the reference."""
    n = size.shape[0]
    offsets = np.zeros(n, dtype=np.int64)
    # active blocks sorted by (lower, index)
    m = 0
    for i in range(n):
        if size[i] > 0 and upper[i] > lower[i]:
            m += 1
    if m == 0:
        return offsets
    act = np.empty(m, dtype=np.int64)
    k = 0
    for i in range(n):
        if size[i] > 0 and upper[i] > lower[i]:
            act[k] = i
            k += 1
    order = np.argsort(lower[act], kind="mergesort")  # stable: index order among equal lowers
    pos_block = act[order]
    pos_lower = lower[pos_block]
    nxt = np.arange(m + 1).astype(np.int64)  # skip list over placed positions; m is the sentinel

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
        # search: the longest unplaced block with xs <= lower and upper <= xe
        lo = 0
        hi = m
        while lo < hi:
            mid = (lo + hi) // 2
            if pos_lower[mid] < xs:
                lo = mid + 1
            else:
                hi = mid
        p = _find(nxt, lo)
        best_p = -1
        best_len = -1
        best_size = -1
        best_idx = -1
        while p < m and pos_lower[p] < xe:
            if xe - pos_lower[p] < best_len:
                break
            b = pos_block[p]
            if upper[b] <= xe:
                ln = upper[b] - lower[b]
                if (
                    ln > best_len
                    or (ln == best_len and size[b] > best_size)
                    or (ln == best_len and size[b] == best_size and b < best_idx)
                ):
                    best_p = p
                    best_len = ln
                    best_size = size[b]
                    best_idx = b
            p = _find(nxt, p + 1)
        pv = sprev[s]
        nx = snext[s]
        if best_p >= 0:
            b = best_idx
            offsets[b] = h
            nxt[best_p] = best_p + 1
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


def bestfit_offsets(lower, upper, size, *, kernel: str = "numba") -> np.ndarray:
    """Best-fit offsets for the blocks ``[lower, upper)`` of ``size`` bytes.

    ``kernel``: ``"numba"`` (compiled, cached on disk) or ``"python"`` (the reference).
    """
    lo = np.ascontiguousarray(lower, dtype=np.int64)
    up = np.ascontiguousarray(upper, dtype=np.int64)
    sz = np.ascontiguousarray(size, dtype=np.int64)
    if kernel == "numba":
        return bestfit_kernel(lo, up, sz)
    if kernel == "python":
        return bestfit_reference(lo, up, sz)
    raise ValueError(f"kernel must be 'numba' or 'python', got {kernel!r}")
