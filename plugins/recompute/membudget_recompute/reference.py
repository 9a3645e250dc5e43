"""The DP and the exact search of ``planner`` written plainly: the references the Numba kernels
(``_kernels``) must equal.

C[L][m] = 0; for a = L-1..0 and every m, the saving stage (if its need fits m) then every
segment [a, b) by increasing b (if its need fits m), a candidate replacing the best only
when strictly smaller.
"""

from __future__ import annotations

import math

import numpy as np


def dp_table(S, keep_saved, keep_checkpoint, saving, segment, cost):
    """(C, choice) as numpy arrays, as ``_kernels.dp_table`` returns them."""
    S = int(S)
    n = len(keep_saved)
    value = [[math.inf] * (S + 1) for _ in range(n)] + [[0.0] * (S + 1)]
    choice = [[-1] * (S + 1) for _ in range(n)]
    for a in reversed(range(n)):
        for m in range(S + 1):
            best, chosen = math.inf, -1
            if int(saving[a]) <= m:
                v = value[a + 1][m - int(keep_saved[a])]
                if v < best:
                    best, chosen = v, 0
            for b in range(a + 1, n + 1):
                if int(segment[a][b]) <= m:
                    v = float(cost[a][b]) + value[b][m - int(keep_checkpoint[a])]
                    if v < best:
                        best, chosen = v, b
            value[a][m], choice[a][m] = best, chosen
    return np.array(value), np.array(choice, dtype=np.int64).reshape(n, S + 1)


def prefix_bounds(S, keep_saved, keep_checkpoint, saving, segment, cost):
    """D[a][k] as ``_kernels.prefix_bounds`` returns it: the prefix 0..a-1 forward, each piece's need
    fitting S slots above the keeps before it, keeps summing to at most k (a running minimum over k)."""
    S, n = int(S), len(keep_saved)
    value = [[math.inf] * (S + 1) for _ in range(n + 1)]
    value[0][0] = 0.0
    for a in range(n):
        for k in range(S + 1):
            v = value[a][k]
            if v == math.inf:
                continue
            after = k + int(keep_saved[a])
            if k + int(saving[a]) <= S and after <= S:
                value[a + 1][after] = min(value[a + 1][after], v)
            after = k + int(keep_checkpoint[a])
            for b in range(a + 1, n + 1):
                if after <= S and k + int(segment[a][b]) <= S:
                    value[b][after] = min(value[b][after], v + float(cost[a][b]))
    for row in value:
        for k in range(1, S + 1):
            row[k] = min(row[k], row[k - 1])
    return np.array(value)


def pareto_fronts(usable, upper, limit, bound, keep_saved, keep_checkpoint, saving, segment, cost, thin=0):
    """The exact search written plainly, as ``_kernels.pareto_fronts`` returns it.

    Front L is the empty schedule, (0, 0 s). Front a: every way to begin at stage a (the saving
    stage, then the segments [a, b) by increasing b) joined to every point of the front it leads
    to, its peak ``max(need, keep + peak)`` (``planner.leanest``'s rule) and its time ``cost +
    time``; of the points with peak <= ``usable`` and time <= ``upper``, those no other point beats
    on both, by increasing peak (of equal peaks the fastest, the first made on a tie), less those
    whose time with ``bound[a][room]`` (the least the stages before a take in the slots left) passes
    ``upper``; with ``thin`` > 1, of each front only ``thin`` points, spread evenly by rank.
    """
    S = len(bound[0]) - 1
    n = len(keep_saved)
    peak, time, choice, nxt = [0], [0.0], [0], [-1]
    start, size = [0] * (n + 1), [0] * (n + 1)
    size[n] = 1
    for a in reversed(range(n)):
        made = [(max(int(saving[a]), int(keep_saved[a]) + peak[j]), time[j], 0, j)
                for j in range(start[a + 1], start[a + 1] + size[a + 1])]
        for b in range(a + 1, n + 1):
            if int(segment[a][b]) <= usable:
                made += [(max(int(segment[a][b]), int(keep_checkpoint[a]) + peak[j]), float(cost[a][b]) + time[j], b, j)
                         for j in range(start[b], start[b] + size[b])]
        by_peak: dict[int, tuple[float, int, int]] = {}
        for p, t, b, j in made:
            if p <= usable and (p not in by_peak or t < by_peak[p][0]):
                by_peak[p] = (t, b, j)
        start[a], best = len(peak), math.inf
        for p in sorted(by_peak):
            t, b, j = by_peak[p]
            if t < best and t + bound[a][((usable - p) * S) // usable] <= upper:
                best = t
                peak.append(p), time.append(t), choice.append(b), nxt.append(j)
        size[a] = len(peak) - start[a]
        if thin > 1 and size[a] > thin:
            kept = [start[a] + (i * (size[a] - 1)) // (thin - 1) for i in range(thin)]
            for column in (peak, time, choice, nxt):
                column[start[a]:] = [column[k] for k in kept]
            size[a] = thin
        if size[a] > limit:
            return _arrays(peak, time, choice, nxt, start, size, False)
    return _arrays(peak, time, choice, nxt, start, size, True)


def _arrays(peak, time, choice, nxt, start, size, complete):
    return (np.array(peak, dtype=np.int64), np.array(time), np.array(choice, dtype=np.int64),
            np.array(nxt, dtype=np.int64), np.array(start, dtype=np.int64), np.array(size, dtype=np.int64), complete)
