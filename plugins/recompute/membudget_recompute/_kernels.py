"""The DP and the exact search of ``planner`` as Numba kernels (the same loops as ``reference``, the same ties).

``dp_table`` fills C[a][m] for a = L-1..0 and every m in 0..S (see ``planner``): the saving
stage first, then the segments [a, b) by increasing b, a candidate replacing the best only
when strictly smaller, so both engines pick the same schedule.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit


@njit(cache=True)
def dp_table(S, keep_saved, keep_checkpoint, saving, segment, cost):
    """(C, choice): C[a, m] the least recomputation seconds of stages a.. with m free slots (inf:
    nothing fits), choice[a, m] 0 for a saving stage, b for the segment [a, b), -1 for none."""
    n = keep_saved.shape[0]
    value = np.full((n + 1, S + 1), np.inf)
    value[n, :] = 0.0
    choice = np.full((n, S + 1), -1, np.int64)
    for a in range(n - 1, -1, -1):
        k = keep_saved[a]
        for m in range(saving[a], S + 1):
            v = value[a + 1, m - k]
            if v < value[a, m]:
                value[a, m] = v
                choice[a, m] = 0
        k = keep_checkpoint[a]
        for b in range(a + 1, n + 1):
            c = cost[a, b]
            for m in range(segment[a, b], S + 1):
                v = c + value[b, m - k]
                if v < value[a, m]:
                    value[a, m] = v
                    choice[a, m] = b
    return value, choice


@functools.cache
def warm_up() -> None:
    """Compile the kernel (or load it from the cache) on a one-stage toy problem, once."""
    one = np.ones(1, np.int64)
    dp_table(2, one, one, one, np.ones((1, 2), np.int64), np.zeros((1, 2)))
    bound = prefix_bounds(2, one, one, one, np.ones((1, 2), np.int64), np.zeros((1, 2)))
    # every argument given, as exact_segments gives them: an omitted ``thin`` is another signature,
    # which the first real search compiled (9.6 s on a 2-core machine, in its plan's time)
    pareto_fronts(2, 1.0, 10, bound, one, one, one, np.ones((1, 2), np.int64), np.zeros((1, 2)), 0)


@njit(cache=True)
def prefix_bounds(S, keep_saved, keep_checkpoint, saving, segment, cost):
    """D[a, k]: the least recomputation seconds of stages 0..a-1 whose keeps, in slots rounded down,
    sum to at most k, every piece's need fitting S slots above the keeps before it (inf: none).
    A relaxation (``reference.prefix_bounds``), so a lower bound for the exact search."""
    n = keep_saved.shape[0]
    value = np.full((n + 1, S + 1), np.inf)
    value[0, 0] = 0.0
    for a in range(n):
        for k in range(S + 1):
            v = value[a, k]
            if v == np.inf:
                continue
            if k + saving[a] <= S and k + keep_saved[a] <= S and v < value[a + 1, k + keep_saved[a]]:
                value[a + 1, k + keep_saved[a]] = v
            kc = k + keep_checkpoint[a]
            if kc > S:
                continue
            for b in range(a + 1, n + 1):
                if k + segment[a, b] <= S and v + cost[a, b] < value[b, kc]:
                    value[b, kc] = v + cost[a, b]
    for a in range(n + 1):
        for k in range(1, S + 1):
            if value[a, k - 1] < value[a, k]:
                value[a, k] = value[a, k - 1]
    return value


@njit(cache=True)
def pareto_fronts(usable, upper, limit, bound, keep_saved, keep_checkpoint, saving, segment, cost, thin=0):
    """The exact search of ``planner.exact_segments``: for a = L-1..0, the Pareto front of (peak above
    the prefix, recomputation seconds) of stages a.. among schedules whose peak is at most ``usable``
    and whose time, with the least the stages before a can take in the room left (``bound``, from
    ``prefix_bounds``), is at most ``upper`` (``reference.pareto_fronts``: the same candidates in the
    same order, the same ties).

    Returns (peak, time, choice, next, start, size, complete): front a is the points start[a] ..
    start[a] + size[a] - 1 of the flat arrays, by increasing peak; ``choice`` 0 for a saving stage,
    b for the segment [a, b); ``next`` the flat index of the point it continues; ``complete`` False
    when a front would pass ``limit`` points (the search gave up). ``thin`` > 1: each front keeps only
    ``thin`` of its points, spread evenly by rank, the first and the last among them (a quick search for
    a good schedule, no longer exact).
    """
    n = keep_saved.shape[0]
    S = bound.shape[1] - 1
    cap = 1024
    peak = np.empty(cap, np.int64)
    time = np.empty(cap)
    choice = np.empty(cap, np.int64)
    nxt = np.empty(cap, np.int64)
    start = np.zeros(n + 1, np.int64)
    size = np.zeros(n + 1, np.int64)
    peak[0], time[0], choice[0], nxt[0] = 0, 0.0, 0, -1
    start[n], size[n] = 0, 1
    used = 1
    lo = np.zeros(n + 2, np.int64)
    hi = np.zeros(n + 2, np.int64)
    needs = np.zeros(n + 2, np.int64)
    keeps = np.zeros(n + 2, np.int64)
    extras = np.zeros(n + 2)
    runs = np.zeros(n + 3, np.int64)
    for a in range(n - 1, -1, -1):
        # Of front b (peaks up, times down) only a window can lead anywhere: times that stay within
        # ``upper`` even with the least the stages before a take (``floor``: the bound's, with every slot
        # free; the sweep below drops the others, as it drops with any room), peaks within ``usable``, and
        # of the points the need covers (all one peak) the fastest alone. b == a stands for the saving
        # stage, which continues at front a + 1.
        floor = bound[a, S]
        needs[a], keeps[a], extras[a] = saving[a], keep_saved[a], 0.0
        needs[a + 1:n + 1], keeps[a + 1:n + 1], extras[a + 1:n + 1] = segment[a, a + 1:], keep_checkpoint[a], \
            cost[a, a + 1:]
        total = 0
        for b in range(a, n + 1):
            f = a + 1 if b == a else b
            need, keep, extra = needs[b], keeps[b], extras[b]
            first, last = start[f], start[f] + size[f]
            lo[b], hi[b] = first, first
            if need > usable:
                continue
            # a front's times fall and its peaks rise: both ends of the window by bisection
            j = _first_within(time, extra, floor, upper, first, last)
            while j + 1 < last and keep + peak[j + 1] <= need and extra + time[j + 1] < extra + time[j]:
                j += 1  # strictly faster at the same peak: on a tie in floats the first made stays
            end = j + np.searchsorted(peak[j:last], usable - keep, side="right")  # keep + peak[end] > usable
            lo[b], hi[b] = j, end
            total += end - j
        cp = np.empty(total, np.int64)
        ct = np.empty(total)
        cb = np.empty(total, np.int64)
        cj = np.empty(total, np.int64)
        k = 0
        n_runs = 0
        for b in range(a, n + 1):
            tag = 0 if b == a else b
            if hi[b] > lo[b]:
                runs[n_runs] = k
                n_runs += 1
            for j in range(lo[b], hi[b]):
                cp[k] = max(needs[b], keeps[b] + peak[j])
                ct[k], cb[k], cj[k] = extras[b] + time[j], tag, j
                k += 1
        runs[n_runs] = total
        # a window's candidates come by rising peak (max(need, keep + peak[j])), so merging the windows
        # sorts them; the sweep below does not depend on the order of equal peaks
        order = _merge_runs(cp, runs, n_runs)
        start[a] = used
        best = np.inf
        i = 0
        while i < total:
            p = cp[order[i]]
            pick = order[i]
            i += 1
            while i < total and cp[order[i]] == p:  # the fastest of this peak, the first made on a tie
                c = order[i]
                if ct[c] < ct[pick] or (ct[c] == ct[pick] and c < pick):
                    pick = c
                i += 1
            room = ((usable - p) * S) // usable
            if ct[pick] < best and ct[pick] + bound[a, room] <= upper:
                best = ct[pick]
                if used == cap:
                    cap *= 2
                    peak = np.concatenate((peak, np.empty(cap - used, np.int64)))
                    time = np.concatenate((time, np.empty(cap - used)))
                    choice = np.concatenate((choice, np.empty(cap - used, np.int64)))
                    nxt = np.concatenate((nxt, np.empty(cap - used, np.int64)))
                peak[used], time[used], choice[used], nxt[used] = p, ct[pick], cb[pick], cj[pick]
                used += 1
        size[a] = used - start[a]
        if thin > 1 and size[a] > thin:
            for i in range(thin):  # in place: rank start[a] + k(i), k(i) >= i, goes to start[a] + i
                k = start[a] + (i * (size[a] - 1)) // (thin - 1)
                d = start[a] + i
                peak[d], time[d], choice[d], nxt[d] = peak[k], time[k], choice[k], nxt[k]
            used = start[a] + thin
            size[a] = thin
        if size[a] > limit:
            return peak[:used], time[:used], choice[:used], nxt[:used], start, size, False
    return peak[:used], time[:used], choice[:used], nxt[:used], start, size, True


@njit(cache=True)
def _first_within(time, extra, floor, upper, first, last):
    """The first j in [first, last) with (extra + time[j]) + floor <= upper (``last`` if none), in the
    sweep's float order of operations; ``time`` falls."""
    while first < last:
        mid = (first + last) // 2
        if (extra + time[mid]) + floor > upper:
            first = mid + 1
        else:
            last = mid
    return first


@njit(cache=True)
def _merge_runs(value, runs, n_runs):
    """The indices of ``value`` by increasing value, where [runs[r], runs[r + 1]) for r < n_runs are
    non-decreasing runs covering it: the runs merged pairwise (a merge sort's passes from its runs)."""
    total = runs[n_runs]
    order = np.arange(total)
    buf = np.empty(total, np.int64)
    bounds = runs[:n_runs + 1].copy()
    while n_runs > 1:
        merged = 0
        for r in range(0, n_runs, 2):
            left, mid = bounds[r], bounds[r + 1]
            right = bounds[r + 2] if r + 1 < n_runs else mid
            i, j, k = left, mid, left
            while i < mid and j < right:
                if value[order[j]] < value[order[i]]:
                    buf[k] = order[j]
                    j += 1
                else:
                    buf[k] = order[i]
                    i += 1
                k += 1
            while i < mid:
                buf[k] = order[i]
                i += 1
                k += 1
            while j < right:
                buf[k] = order[j]
                j += 1
                k += 1
            bounds[merged] = left
            merged += 1
        bounds[merged] = total
        n_runs = merged
        order, buf = buf, order
    return order
