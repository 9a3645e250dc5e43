"""moDNN's memory manager and offloading-scheme search as Numba kernels (papers/000 IV.B).

The device memory is a doubly linked list of segments (papers/000 section III.B, "a
linked list based approach [23]"): each node is a free or an occupied segment, and an
occupied one belongs to a data block (``owner``). The list lives in flat arrays so that
Numba can work on it:

- ``off``, ``size``, ``owner`` (-1: free), ``nxt``, ``prv`` (-1: none) per node slot;
- ``meta = [head, free_slots, arena_bytes]``; ``stack[:free_slots]`` the unused slots.

Allocation is best fit, at the low end of the hole for long-lived data and at its high
end for short-lived data (gradients, workspaces), freeing coalesces with free neighbours, ``ll_compact`` is the
defragmentation (every occupied segment slides to the lowest addresses, in order).
``find_scheme`` is the search of Figure 4: every node may start a run of contiguous
segments, each free or of an offloadable block, grown until it covers the request; the
scheme with the lowest delay wins (ties: fewer bytes moved, then the lowest address).

``harness``-style pairing: every kernel has a plain-Python twin in
``membudget_modnn.reference`` and the tests check that they agree on random inputs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

FREE = -1


def ll_new(capacity: int, arena: int) -> tuple[np.ndarray, ...]:
    """Empty list arrays for ``capacity`` nodes over an arena of ``arena`` bytes (one free node)."""
    off = np.zeros(capacity, dtype=np.int64)
    size = np.zeros(capacity, dtype=np.int64)
    owner = np.full(capacity, FREE, dtype=np.int64)
    nxt = np.full(capacity, -1, dtype=np.int64)
    prv = np.full(capacity, -1, dtype=np.int64)
    stack = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # pop from the end: slot 0 first
    meta = np.array([-1, capacity, arena], dtype=np.int64)
    if arena > 0:
        k = _take(stack, meta)
        size[k] = arena
        meta[0] = k
    return off, size, owner, nxt, prv, meta, stack


@njit(cache=True)
def _take(stack, meta):
    meta[1] -= 1
    return stack[meta[1]]


@njit(cache=True)
def _give(stack, meta, k):
    stack[meta[1]] = k
    meta[1] += 1


@njit(cache=True)
def _unlink(nxt, prv, meta, stack, k):
    if prv[k] >= 0:
        nxt[prv[k]] = nxt[k]
    else:
        meta[0] = nxt[k]
    if nxt[k] >= 0:
        prv[nxt[k]] = prv[k]
    nxt[k] = -1
    prv[k] = -1
    _give(stack, meta, k)


@njit(cache=True)
def _insert_after(off, size, owner, nxt, prv, meta, stack, k, offset, nbytes, who):
    m = _take(stack, meta)
    off[m] = offset
    size[m] = nbytes
    owner[m] = who
    prv[m] = k
    nxt[m] = nxt[k]
    if nxt[k] >= 0:
        prv[nxt[k]] = m
    nxt[k] = m
    return m


@njit(cache=True)
def ll_alloc(off, size, owner, nxt, prv, meta, stack, req, who, top):
    """Place ``req`` bytes for ``who``; the node now holding them, or -1 when no free segment is big enough.

    Both kinds go best fit, into the smallest free segment that holds them: long-lived
    data (``top`` False) at its low end (the lowest address on ties), short-lived data
    (``top`` True) at its high end (the highest address on ties). Within a hole the two
    kinds grow from opposite ends, and short-lived blocks do not cut a large hole (such as
    the one offloads leave for the prefetches) when a smaller one holds them.
    """
    if meta[1] == 0:
        return -2  # out of node slots (the caller sized the arrays too small)
    k = meta[0]
    best = -1
    while k >= 0:
        if owner[k] == FREE and size[k] >= req:
            if best < 0 or size[k] < size[best] or (top and size[k] == size[best]):
                best = k
        k = nxt[k]
    if best < 0:
        return -1
    k = best
    if size[k] > req:
        if top:
            size[k] -= req
            return _insert_after(off, size, owner, nxt, prv, meta, stack, k, off[k] + size[k], req, who)
        _insert_after(off, size, owner, nxt, prv, meta, stack, k, off[k] + req, size[k] - req, FREE)
        size[k] = req
    owner[k] = who
    return k


@njit(cache=True)
def ll_free(off, size, owner, nxt, prv, meta, stack, k):
    """Free node ``k`` and merge it with free neighbours."""
    owner[k] = FREE
    n = nxt[k]
    if n >= 0 and owner[n] == FREE:
        size[k] += size[n]
        _unlink(nxt, prv, meta, stack, n)
    p = prv[k]
    if p >= 0 and owner[p] == FREE:
        size[p] += size[k]
        _unlink(nxt, prv, meta, stack, k)


@njit(cache=True)
def ll_shrink(off, size, owner, nxt, prv, meta, stack, k, keep):
    """Keep the first ``keep`` bytes (0 < keep <= size) of node ``k`` and free its tail."""
    tail = size[k] - keep
    if tail <= 0:
        return
    size[k] = keep
    n = nxt[k]
    if n >= 0 and owner[n] == FREE:
        off[n] -= tail
        size[n] += tail
    else:
        _insert_after(off, size, owner, nxt, prv, meta, stack, k, off[k] + keep, tail, FREE)


@njit(cache=True)
def ll_compact(off, size, owner, nxt, prv, meta, stack):
    """Defragment: occupied segments slide down in address order; one free segment is left at the top."""
    k = meta[0]
    cursor = 0
    last = -1
    while k >= 0:
        n = nxt[k]
        if owner[k] == FREE:
            _unlink(nxt, prv, meta, stack, k)
        else:
            off[k] = cursor
            cursor += size[k]
            last = k
        k = n
    rest = meta[2] - cursor
    if rest > 0:
        if last < 0:
            m = _take(stack, meta)
            off[m] = 0
            size[m] = rest
            owner[m] = FREE
            nxt[m] = -1
            prv[m] = -1
            meta[0] = m
        else:
            _insert_after(off, size, owner, nxt, prv, meta, stack, last, cursor, rest, FREE)


@njit(cache=True)
def ll_flatten(off, size, owner, nxt, prv, meta):
    """The segments in address order: (node, offset, size, owner) arrays."""
    count = 0
    k = meta[0]
    while k >= 0:
        count += 1
        k = nxt[k]
    nodes = np.empty(count, dtype=np.int64)
    k = meta[0]
    for i in range(count):
        nodes[i] = k
        k = nxt[k]
    return nodes, off[nodes], size[nodes], owner[nodes]


@njit(cache=True)
def find_scheme(seg_size, seg_owner, can_off, ready, dur, moved, next_use, engine_free, now, req):
    """Figure 4's search over contiguous segments: the scheme with the lowest delay.

    ``seg_size``/``seg_owner`` list the segments in address order. A block ``o`` may be
    offloaded when ``can_off[o]`` (the two "must not offload" criteria are applied by
    the caller); its copy may start at ``ready[o]``, lasts ``dur[o]`` and moves
    ``moved[o]`` bytes. The offloads of a scheme queue on the copy engine (free from
    ``engine_free``) by ready time; the delay to the task that starts at ``now`` is how
    much later than ``now`` the last of them ends (Figure 3). Among schemes of equal
    delay the one whose blocks are needed again latest wins (``next_use[o]``: the index
    of the task that reads ``o`` next; the soonest of a scheme's blocks counts), then the
    one that moves fewer bytes, then the lowest address. Returns (first, last, delay,
    bytes); first = -1 when no scheme exists.
    """
    n = seg_size.shape[0]
    best_first = -1
    best_last = -1
    best_delay = np.inf
    best_moved = 0
    best_use = -1
    buf = np.empty(n, dtype=np.int64)
    for k in range(n):
        total = 0
        count = 0
        last = -1
        for m in range(k, n):
            o = seg_owner[m]
            if o != FREE:
                if not can_off[o]:
                    break
                seen = False
                for q in range(count):
                    if buf[q] == o:
                        seen = True
                        break
                if not seen:
                    buf[count] = o
                    count += 1
            total += seg_size[m]
            if total >= req:
                last = m
                break
        if last < 0 or count == 0:
            continue
        # insertion sort of the scheme's blocks by (ready, block)
        for a in range(1, count):
            x = buf[a]
            b = a - 1
            while b >= 0 and (ready[buf[b]] > ready[x] or (ready[buf[b]] == ready[x] and buf[b] > x)):
                buf[b + 1] = buf[b]
                b -= 1
            buf[b + 1] = x
        t = engine_free
        nbytes = 0
        use = next_use[buf[0]]
        for a in range(count):
            o = buf[a]
            t = max(t, ready[o]) + dur[o]
            nbytes += moved[o]
            use = min(use, next_use[o])
        delay = max(0.0, t - now)
        if delay < best_delay or (delay == best_delay and (use > best_use or (use == best_use and nbytes < best_moved))):
            best_first, best_last, best_delay, best_moved, best_use = k, last, delay, nbytes, use
    return best_first, best_last, best_delay, best_moved
