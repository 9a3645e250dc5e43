"""The hybrid DP (``planner``) as one Numba kernel over flat arrays.

Layer b holds the states (K, Delta_F, Delta_B, cost) after stages 0..b-1 are decided. Layer b
is built from layer b-1 by DYNPROG's two moves on stage b-1 (keep, offload: papers/004
eqs. (1)-(8), ``membudget_dynprog._kernels.stage_move``) and from every layer a < b by the
segment move [a, b): a keep of one coarse stage with the segment's constants (its
checkpoint, forward and backward needs, overlap windows) whose cost also pays the
recomputation, or (with ``seg_offload``) an offload of that coarse stage, whose saved data
is the checkpoint x_a: DYNPROG's offload move with the segment's constants. Candidates are sorted by (key, cost) and swept as DYNPROG's
``pareto_keep`` does: a state that another state of the same K dominates (no larger
Delta_F, Delta_B, cost) is dropped, which keeps the optimum since every move is
non-decreasing in Delta_F and Delta_B.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from membudget_dynprog._kernels import pareto_keep, stage_move

KEEP, OFFLOAD, SEGMENT, SEGMENT_OFFLOAD = 0, 1, 2, 3


@njit(cache=True)
def hybrid_dp(x, cf, cb, uf, ub, offloadable, sx, scf, scb, suf, sub, scost, wf, wb, S, df_min, db_min, RF, RB,
              beam, seg_offload):
    """Every layer of the hybrid DP.

    Segment arrays are (L + 1) x (L + 1), indexed [a, b]; ``sx[a, b] < 0`` marks a segment
    left out (it cannot fit). ``seg_offload``: also try offloading a segment's checkpoint
    (move ``SEGMENT_OFFLOAD``). Returns the flat states (K, Delta_F, Delta_B, cost), each
    state's parent (flat index) and move, the layer offsets and the number of layers built
    (L + 1 when the last layer is not empty).
    """
    L = x.shape[0]
    cap = 4096
    K = np.zeros(cap, np.int64)
    dF = np.zeros(cap, np.int64)
    dB = np.zeros(cap, np.int64)
    cost = np.zeros(cap, np.float64)
    parent = np.full(cap, -1, np.int64)
    move = np.zeros(cap, np.int8)
    offsets = np.zeros(L + 2, np.int64)
    offsets[1] = 1  # layer 0: the empty state
    ccap = 4096
    cK = np.empty(ccap, np.int64)
    cdF = np.empty(ccap, np.int64)
    cdB = np.empty(ccap, np.int64)
    ccost = np.empty(ccap, np.float64)
    cpar = np.empty(ccap, np.int64)
    cmove = np.empty(ccap, np.int8)
    for b in range(1, L + 1):
        last = b == L
        m = 0
        for a in range(b - 1, -1, -1):
            single = a == b - 1
            if not single and sx[a, b] < 0:
                continue
            for s in range(offsets[a], offsets[a + 1]):
                for mv in range(4):
                    if mv >= SEGMENT:
                        if sx[a, b] < 0 or (mv == SEGMENT_OFFLOAD and (not seg_offload or sx[a, b] == 0)):
                            continue
                        ok, nk, ndf, ndb, c = stage_move(K[s], dF[s], dB[s], cost[s], sx[a, b], scf[a, b],
                                                         scb[a, b], suf[a, b], sub[a, b], mv == SEGMENT_OFFLOAD, wf,
                                                         wb, S, df_min, db_min, last)
                        c += scost[a, b]  # the segment's recomputation
                    else:
                        if not single or (mv == OFFLOAD and not offloadable[a]):
                            continue
                        ok, nk, ndf, ndb, c = stage_move(K[s], dF[s], dB[s], cost[s], x[a], cf[a], cb[a], uf[a],
                                                         ub[a], mv == OFFLOAD, wf, wb, S, df_min, db_min, last)
                    if not ok:
                        continue
                    if m == ccap:
                        ccap *= 2
                        cK, cdF, cdB = _grow(cK, ccap), _grow(cdF, ccap), _grow(cdB, ccap)
                        ccost, cpar, cmove = _grow(ccost, ccap), _grow(cpar, ccap), _grow(cmove, ccap)
                    cK[m] = nk
                    cdF[m] = ndf
                    cdB[m] = ndb
                    ccost[m] = c
                    cpar[m] = s
                    cmove[m] = mv
                    m += 1
        if m == 0:
            return K, dF, dB, cost, parent, move, offsets, b
        # DYNPROG's sweep on the candidates in cost order: of equal states the cheapest stays
        kept = _sweep(cK, cdF, cdB, ccost, m, wf, df_min, db_min, RF, RB, beam)
        lo = offsets[b]
        n_kept = kept.shape[0]
        while lo + n_kept > cap:
            cap *= 2
            K, dF, dB = _grow(K, cap), _grow(dF, cap), _grow(dB, cap)
            cost, parent, move = _grow(cost, cap), _grow(parent, cap), _grow(move, cap)
        K[lo:lo + n_kept] = cK[kept]
        dF[lo:lo + n_kept] = cdF[kept]
        dB[lo:lo + n_kept] = cdB[kept]
        cost[lo:lo + n_kept] = ccost[kept]
        parent[lo:lo + n_kept] = cpar[kept]
        move[lo:lo + n_kept] = cmove[kept]
        if beam > 0 and n_kept > beam:  # keep the beam states of least cost + pending offload time
            rank = np.empty(n_kept)
            for t in range(n_kept):
                rank[t] = cost[lo + t] + max(dF[lo + t], 0) * wf
            pick = np.sort(np.argsort(rank, kind="mergesort")[:beam]) + lo
            K[lo:lo + beam] = K[pick]
            dF[lo:lo + beam] = dF[pick]
            dB[lo:lo + beam] = dB[pick]
            cost[lo:lo + beam] = cost[pick]
            parent[lo:lo + beam] = parent[pick]
            move[lo:lo + beam] = move[pick]
            n_kept = beam
        offsets[b + 1] = lo + n_kept
    return K, dF, dB, cost, parent, move, offsets, L + 1


@njit(cache=True)
def _pareto(cK, cdF, cdB, ccost, pool, df_min, db_min, RF, RB):
    """The candidates of ``pool`` no other of ``pool`` dominates (DYNPROG's sweep), as indices."""
    by_cost = pool[np.argsort(ccost[pool], kind="mergesort")]
    key = np.empty(by_cost.shape[0], np.int64)
    for t in range(by_cost.shape[0]):
        c = by_cost[t]
        key[t] = (cK[c] * RF + (cdF[c] - df_min)) * RB + (cdB[c] - db_min)
    return by_cost[pareto_keep(cK[by_cost], cdF[by_cost], cdB[by_cost], ccost[by_cost], key, db_min, RB, False)]


@njit(cache=True)
def _sweep(cK, cdF, cdB, ccost, m, wf, df_min, db_min, RF, RB, beam):
    """The undominated candidates among the first ``m``, or (with a beam) enough of them for the beam.

    With a beam, only the candidates of least rank (cost + pending offload time, the beam's
    order) are swept, 4 beams' worth and more while fewer than a beam survive: a state that
    dominates another has no larger rank, so the survivors among them are exactly the
    undominated states of that rank or less, and the beam, which keeps the least ranks,
    picks the same states as from the whole sweep (the offloaded checkpoints' move doubles
    the segment candidates; this keeps the sort to a few beams).
    """
    everything = np.arange(m)
    if beam <= 0 or m <= 4 * beam:
        return _pareto(cK, cdF, cdB, ccost, everything, df_min, db_min, RF, RB)
    rank = np.empty(m)
    for t in range(m):
        rank[t] = ccost[t] + max(cdF[t], 0) * wf
    take = 4 * beam
    while take < m:
        threshold = np.partition(rank, take - 1)[take - 1]
        pool = np.flatnonzero(rank <= threshold)
        kept = _pareto(cK, cdF, cdB, ccost, pool, df_min, db_min, RF, RB)
        if kept.shape[0] >= beam:
            return kept
        take *= 4
    return _pareto(cK, cdF, cdB, ccost, everything, df_min, db_min, RF, RB)


@njit(cache=True)
def _grow(a, n):
    out = np.empty(n, a.dtype)
    out[:a.shape[0]] = a
    return out


@functools.cache
def warm_up() -> None:
    """Compile the kernel (or load it from the cache) on a one-stage toy problem, once."""
    one = np.ones(1, np.int64)
    z = np.zeros(1, np.int64)
    seg = np.full((2, 2), -1, np.int64)
    segf = np.zeros((2, 2))
    hybrid_dp(one, one, one, z, z, np.ones(1, np.bool_), seg, seg, seg, seg, seg, segf, 1.0, 1.0, 4, 0, -2, 8, 8, 0,
              True)
