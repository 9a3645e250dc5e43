"""The DP of ``planner`` as a Numba kernel (the same loops as ``reference``, the same ties).

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
