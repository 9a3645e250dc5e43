"""The DP of ``planner`` written plainly: the reference the Numba kernel (``_kernels``) must equal.

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
