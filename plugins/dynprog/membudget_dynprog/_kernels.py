"""Algorithm 1 of papers/004 as Numba kernels over dense arrays.

One layer IDLE_i is a set of parallel arrays (K, Delta_F, Delta_B, idle, key); the next
layer is built by ``dp_step`` with an open-addressing hash table on the state key
(an int64 array, no Python dict). All sizes are in slots (``planner.discretise``); a
quantity ``e`` of slots that must be sent before an operation can start is ``e * wf``
seconds of idle (offload) or ``e * wb`` (prefetch). For stage i, from a state
(K, Delta_F, Delta_B) with idle I (``stage_move``, which ``membudget_hybrid`` also applies
to a recomputed segment as one coarse stage):

- feasibility (Algorithm 1's test): K + C^F_i <= S and K + C^B_i <= S;
- eq. (1): e_F = max(0, K + Delta_F^+ + C^F_i - S)   (eps^F_i = e_F wf);
- eq. (6): e_B = max(0, K + Delta_B^+ + C^B_i - S)   (eps^B_i = e_B wb);
- offload s_i, eqs. (2), (3), (7): K' = K, Delta_F' = Delta_F^+ + s_i - e_F - u_F beta,
  Delta_B' = s_i + max(0, Delta_B - e_B - u_B beta);
- keep s_i, eqs. (4), (5), (8): K' = K + s_i, Delta_F' = Delta_F - e_F - u_F beta,
  Delta_B' = Delta_B - e_B - u_B beta;
- I' = I + e_F wf + e_B wb; ties go to keep, then to the smaller parent key.

Delta_F and Delta_B are clamped below where their value no longer changes any future
(``Discretised.df_min``, ``db_min``); neither exceeds S + max s_i, so the key
(K * RF + Delta_F - df_min) * RB + Delta_B - db_min orders states like (K, Delta_F, Delta_B).
After each step ``pareto_keep`` drops dominated states (see ``planner``).
"""

from __future__ import annotations

import functools
import time

import numpy as np
from numba import njit

from membudget_dynprog.planner import Discretised, Solution

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True)
def _slot(key, shift):
    return np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(shift))


@njit(cache=True)
def stage_move(k, df, db, idle, x, cf, cb, uf, ub, offload, wf, wb, S, df_min, db_min, last):
    """One of Algorithm 1's two moves on a stage (saved data ``x``, needs ``cf``, ``cb``,
    windows ``uf``, ``ub``) from the state (K, Delta_F, Delta_B) with idle ``idle``.

    Returns (ok, K', Delta_F', Delta_B', idle'); ok is False when the stage does not fit
    (Algorithm 1's test, or a kept x overflowing S before the last stage). Delta_F' and
    Delta_B' are clamped below at ``df_min``, ``db_min``. Also the segment moves of
    ``membudget_hybrid``, which are these moves on a coarse stage.
    """
    if k + cf > S or k + cb > S:
        return False, 0, 0, 0, 0.0
    dfp = max(df, 0)
    dbp = max(db, 0)
    ef = max(0, k + dfp + cf - S)  # eq. (1)
    eb = max(0, k + dbp + cb - S)  # eq. (6)
    new_idle = idle + ef * wf + eb * wb
    if offload:  # eqs. (2), (3), (7)
        nk = k
        ndf = dfp + x - ef - uf
        ndb = x + max(db - eb - ub, 0)
    else:  # eqs. (4), (5), (8)
        nk = k + x
        if nk > S and not last:
            return False, 0, 0, 0, 0.0
        ndf = df - ef - uf
        ndb = db - eb - ub
    return True, nk, max(ndf, df_min), max(ndb, db_min), new_idle


@njit(cache=True)
def dp_step(K, dF, dB, idle, key, x, cf, cb, uf, ub, offloadable, wf, wb, S, df_min, db_min, RF, RB, last):
    """IDLE_{i+1} from IDLE_i (Algorithm 1's inner loop) for one stage's constants.

    Returns the new layer's (K, Delta_F, Delta_B, idle, key) and, per new state, the index
    of its parent in the input arrays and the decision (1: offloaded).
    """
    n = K.shape[0]
    bits = 2
    while (1 << bits) < 4 * n + 4:
        bits += 1
    cap = 1 << bits
    shift = 64 - bits
    table = np.full(cap, -1, np.int64)
    m_max = 2 * n
    oK = np.empty(m_max, np.int64)
    odF = np.empty(m_max, np.int64)
    odB = np.empty(m_max, np.int64)
    oidle = np.empty(m_max, np.float64)
    okey = np.empty(m_max, np.int64)
    oparent = np.empty(m_max, np.int64)
    odec = np.empty(m_max, np.int8)
    m = 0
    for s in range(n):
        for dec in range(2):
            if dec == 1 and not offloadable:
                continue
            ok, nk, ndf, ndb, cost = stage_move(K[s], dF[s], dB[s], idle[s], x, cf, cb, uf, ub, dec == 1, wf, wb,
                                                S, df_min, db_min, last)
            if not ok:
                continue
            nkey = (nk * RF + (ndf - df_min)) * RB + (ndb - db_min)
            h = _slot(nkey, shift)
            while True:
                j = table[h]
                if j == -1:
                    table[h] = m
                    oK[m] = nk
                    odF[m] = ndf
                    odB[m] = ndb
                    oidle[m] = cost
                    okey[m] = nkey
                    oparent[m] = s
                    odec[m] = dec
                    m += 1
                    break
                if okey[j] == nkey:
                    old = oidle[j]
                    if cost < old or (cost == old and (dec < odec[j] or (
                            dec == odec[j] and key[s] < key[oparent[j]]))):
                        oidle[j] = cost
                        oparent[j] = s
                        odec[j] = dec
                    break
                h = (h + 1) & (cap - 1)
    return oK[:m], odF[:m], odB[:m], oidle[:m], okey[:m], oparent[:m], odec[:m]


@njit(cache=True)
def pareto_keep(K, dF, dB, idle, key, db_min, RB, same_df):
    """Indices (in key order) of the states no other state of the same K dominates.

    B dominates A when Delta_F_B <= Delta_F_A, Delta_B_B <= Delta_B_A and idle_B <= idle_A
    (with ``same_df``: Delta_F_B == Delta_F_A). Every step and eps_G are non-decreasing in
    Delta_F and Delta_B (see ``planner``), so A's best future is never better than B's.
    """
    return pareto_sweep(np.argsort(key, kind="mergesort"), K, dF, dB, idle, db_min, RB, same_df)


@njit(cache=True)
def pareto_sweep(order, K, dF, dB, idle, db_min, RB, same_df):
    """``pareto_keep`` on the states ``order`` lists in key order (of equal keys, the one first in
    ``order`` stays): those of them no other of them dominates, as indices, in that order.

    A sweep with a prefix-minimum Fenwick tree over Delta_B per K group.
    """
    n = order.shape[0]
    tree = np.full(RB, np.inf)
    keep = np.empty(n, np.int64)
    m = 0
    start = 0
    while start < n:
        end = start
        g0 = order[start]
        while end < n and K[order[end]] == K[g0] and (not same_df or dF[order[end]] == dF[g0]):
            end += 1
        first_kept = m
        for t in range(start, end):
            s = order[t]
            i = dB[s] - db_min
            best = np.inf
            j = i
            while j >= 0:
                if tree[j] < best:
                    best = tree[j]
                j = (j & (j + 1)) - 1
            if best <= idle[s]:
                continue
            keep[m] = s
            m += 1
            j = i
            while j < RB:
                if idle[s] < tree[j]:
                    tree[j] = idle[s]
                j = j | (j + 1)
        for t in range(first_kept, m):  # reset what this group touched
            j = dB[keep[t]] - db_min
            while j < RB:
                tree[j] = np.inf
                j = j | (j + 1)
        start = end
    return keep[:m]


@njit(cache=True)
def final_totals(K, dF, dB, idle, wf, wb, h9, g10):
    """Total idle of every last-layer state: its idle plus eps_G (eqs. (9), (10))."""
    totals = np.empty(K.shape[0])
    for s in range(K.shape[0]):
        k, df, db = K[s], dF[s], dB[s]
        e = df * wf + db * wb
        if e < 0.0:
            e = 0.0
        if df > 0:
            t = (k + df) * wf + h9
            if t > e:
                e = t
        if df < 0 and db > 0 and g10.shape[0] > 0:
            a = -df
            if a >= g10.shape[0]:
                a = g10.shape[0] - 1
            t = (k + db) * wb + g10[a]
            if t > e:
                e = t
        totals[s] = idle[s] + e
    return totals


@njit(cache=True)
def dp_layers(K, dF, dB, idle, key, x, cf, cb, uf, ub, offloadable, wf, wb, S, df_min, db_min, RF, RB, same_df,
              i0, i1):
    """Layers i0..i1-1 of Algorithm 1: ``dp_step`` then ``pareto_keep`` per stage.

    Returns the last layer's arrays, the parents and decisions of every layer built, flat,
    with their offsets, and the number of states created (0 layers built: none survived).
    """
    n_layers = i1 - i0
    offsets = np.zeros(n_layers + 1, np.int64)
    cap = 1024
    parent_all = np.empty(cap, np.int64)
    dec_all = np.empty(cap, np.int8)
    created = 0
    n = x.shape[0]
    for t in range(n_layers):
        i = i0 + t
        K, dF, dB, idle, key, parent, dec = dp_step(
            K, dF, dB, idle, key, x[i], cf[i], cb[i], uf[i], ub[i], offloadable[i], wf, wb, S, df_min, db_min,
            RF, RB, i == n - 1)
        if K.shape[0] == 0:
            return K, dF, dB, idle, key, parent_all[:0], dec_all[:0], offsets[:1], created
        created += K.shape[0]
        keep = pareto_keep(K, dF, dB, idle, key, db_min, RB, same_df)
        K, dF, dB, idle, key = K[keep], dF[keep], dB[keep], idle[keep], key[keep]
        m = keep.shape[0]
        lo = offsets[t]
        while lo + m > cap:
            cap *= 2
            grown_p = np.empty(cap, np.int64)
            grown_p[:lo] = parent_all[:lo]
            parent_all = grown_p
            grown_d = np.empty(cap, np.int8)
            grown_d[:lo] = dec_all[:lo]
            dec_all = grown_d
        for s in range(m):
            parent_all[lo + s] = parent[keep[s]]
            dec_all[lo + s] = dec[keep[s]]
        offsets[t + 1] = lo + m
    return K, dF, dB, idle, key, parent_all[:offsets[n_layers]], dec_all[:offsets[n_layers]], offsets, created


def solve_kernel(d: Discretised, deadline: float | None = None, candidates: int = 1,
                 chunk: int = 16) -> Solution | None:
    """Algorithm 1 in kernel calls of ``chunk`` layers (the deadline is checked between them).

    The ``candidates`` best last-layer states are backtracked (best first).
    """
    RF, RB = d.key_ranges
    K = np.zeros(1, np.int64)
    dF = np.zeros(1, np.int64)
    dB = np.zeros(1, np.int64)
    idle = np.zeros(1, np.float64)
    key = np.array([(0 * RF + (0 - d.df_min)) * RB + (0 - d.db_min)], np.int64)
    parents: list[np.ndarray] = []
    decisions: list[np.ndarray] = []
    created = 1
    n = d.n_stages
    step = n if deadline is None else chunk
    same_df = d.g10.shape[0] > 0
    for i0 in range(0, n, step):
        if deadline is not None and time.perf_counter() > deadline:
            return Solution((), float("nan"), created, timed_out=True)
        i1 = min(n, i0 + step)
        K, dF, dB, idle, key, flat_p, flat_d, offsets, made = dp_layers(
            K, dF, dB, idle, key, d.x, d.cf, d.cb, d.uf, d.ub, d.offloadable, d.wf, d.wb, d.slots,
            d.df_min, d.db_min, RF, RB, same_df, i0, i1)
        created += made
        if len(offsets) < i1 - i0 + 1:
            return None
        for t in range(i1 - i0):
            parents.append(flat_p[offsets[t]:offsets[t + 1]])
            decisions.append(flat_d[offsets[t]:offsets[t + 1]])
    g10 = d.g10.astype(np.float64) if d.g10.shape[0] else np.zeros(0)
    totals = final_totals(K, dF, dB, idle, d.wf, d.wb, d.h9, g10)
    # rank: least total idle, then the larger K (less offloaded), then smaller Delta_F, Delta_B
    order = np.lexsort((dB, dF, -K, totals))[:max(1, candidates)]
    found = []
    for s in order:
        offload = []
        for i in range(n - 1, -1, -1):
            if decisions[i][s]:
                offload.append(i)
            s = parents[i][s]
        found.append(tuple(sorted(offload)))
    return Solution(found[0], float(totals[order[0]]), created,
                    candidates=tuple(zip(found, (float(totals[s]) for s in order))))


@functools.cache
def warm_up() -> None:
    """Compile the kernels (or load them from the cache) on a one-stage toy problem, once."""
    z = np.zeros(1, np.int64)
    one = np.ones(1, np.int64)
    out = dp_layers(z, z, z, np.zeros(1), z, one, one, one, z, z, np.ones(1, np.bool_), 1.0, 1.0, 4, 0, -2, 8, 8,
                    False, 0, 1)
    final_totals(out[0], out[1], out[2], out[3], 1.0, 1.0, 0.0, np.zeros(0))
