"""The hybrid DP (``planner``) as one Numba kernel over flat arrays.

Layer b holds the states (K, Delta_F, Delta_B, cost) after stages 0..b-1 are decided. Layer b
is built from layer b-1 by DYNPROG's two moves on stage b-1 (keep, offload: papers/004
eqs. (1)-(8), ``membudget_dynprog._kernels.stage_move``) and from every layer a < b by the
segment move [a, b): a keep of one coarse stage with the segment's constants (its
checkpoint, forward and backward needs, overlap windows) whose cost also pays the
recomputation, or (with ``seg_offload``) an offload of that coarse stage, whose saved data
is the checkpoint x_a: DYNPROG's offload move with the segment's constants. Candidates are
sorted by (key, cost) and swept as DYNPROG's ``pareto_keep`` does: a state that another state
of the same K dominates (no larger Delta_F, Delta_B, cost) is dropped, which keeps the optimum
since every move is non-decreasing in Delta_F and Delta_B. The tests check the layers against a
plain enumeration of these definitions (``test_the_kernels_layers_are_the_reference_ones``).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from membudget_dynprog._kernels import pareto_sweep, stage_move

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
    moves = np.empty((4, 6), np.int64)  # per move: its code, x, C^F, C^B, u_F, u_B (slots)
    recompute = np.empty(4)
    for b in range(1, L + 1):
        last = b == L
        m = 0
        for a in range(b - 1, -1, -1):
            # the moves from layer a into layer b, in move order (``_add_move``)
            n_moves = 0
            if a == b - 1:
                n_moves = _add_move(moves, recompute, n_moves, KEEP, x[a], cf[a], cb[a], uf[a], ub[a], 0.0)
                if offloadable[a]:
                    n_moves = _add_move(moves, recompute, n_moves, OFFLOAD, x[a], cf[a], cb[a], uf[a], ub[a], 0.0)
            if sx[a, b] >= 0:
                segment = (sx[a, b], scf[a, b], scb[a, b], suf[a, b], sub[a, b], scost[a, b])
                n_moves = _add_move(moves, recompute, n_moves, SEGMENT, *segment)
                if seg_offload and sx[a, b] > 0:
                    n_moves = _add_move(moves, recompute, n_moves, SEGMENT_OFFLOAD, *segment)
            if n_moves == 0:
                continue
            # A layer's states are in key order, so K ascends: the states past the largest K any of the moves
            # accepts (stage_move's tests) cannot move, and the loop stops there.
            k_max = -1
            for j in range(n_moves):
                k_max = max(k_max, _k_max(moves[j, 1], moves[j, 2], moves[j, 3], moves[j, 0] % 2 == 1, S, last))
            lo = offsets[a]
            stop = lo + np.searchsorted(K[lo:offsets[a + 1]], k_max, side="right")
            for s in range(lo, stop):
                for j in range(n_moves):
                    ok, nk, ndf, ndb, c = stage_move(K[s], dF[s], dB[s], cost[s], moves[j, 1], moves[j, 2],
                                                     moves[j, 3], moves[j, 4], moves[j, 5], moves[j, 0] % 2 == 1, wf,
                                                     wb, S, df_min, db_min, last)
                    if not ok:
                        continue
                    if m == ccap:
                        ccap *= 2
                        cK, cdF, cdB = _grow(cK, ccap), _grow(cdF, ccap), _grow(cdB, ccap)
                        ccost, cpar, cmove = _grow(ccost, ccap), _grow(cpar, ccap), _grow(cmove, ccap)
                    cK[m] = nk
                    cdF[m] = ndf
                    cdB[m] = ndb
                    ccost[m] = c + recompute[j]  # a segment's recomputation (0 for a stage's moves)
                    cpar[m] = s
                    cmove[m] = moves[j, 0]
                    m += 1
        if m == 0:
            return K, dF, dB, cost, parent, move, offsets, b
        # DYNPROG's sweep on the candidates in (key, cost) order: of equal states the cheapest stays
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
def _add_move(moves, recompute, n_moves, code, x, cf, cb, uf, ub, seconds):
    """Row ``n_moves`` of the move table: move ``code`` (odd: an offload) of a stage or coarse stage; returns
    the moves listed."""
    moves[n_moves, 0], moves[n_moves, 1], moves[n_moves, 2], moves[n_moves, 3] = code, x, cf, cb
    moves[n_moves, 4], moves[n_moves, 5] = uf, ub
    recompute[n_moves] = seconds
    return n_moves + 1


@njit(cache=True)
def _k_max(x, cf, cb, offloadable, S, last):
    """The largest K from which ``stage_move`` accepts a stage (or coarse stage) by either move: both needs
    must fit beside K, and a kept ``x`` too unless it is the last stage (offloading keeps K)."""
    fits = S - max(cf, cb)
    return fits if offloadable or last else min(fits, S - x)


@njit(cache=True)
def _pareto(cK, cdF, cdB, ccost, pool, df_min, db_min, RF, RB):
    """The candidates of ``pool`` no other of ``pool`` dominates (DYNPROG's sweep), as indices in key order;
    of candidates with the same key, the cheapest stays (the first in ``pool`` when they cost the same)."""
    return pareto_sweep(_key_cost_order(cK, cdF, cdB, ccost, pool, df_min, db_min, RF, RB), cK, cdF, cdB, ccost,
                        db_min, RB, False)


@njit(cache=True)
def _key_cost_order(cK, cdF, cdB, ccost, pool, df_min, db_min, RF, RB):
    """``pool`` sorted by (key, cost, place in ``pool``): three stable counting sorts, on Delta_B, Delta_F
    and K (key order, in a time linear in the candidates: the keys' parts span a few hundred slots
    each), then each run of equal keys by cost (insertion sort, stable: such runs are short)."""
    n = pool.shape[0]
    k_range = 1
    for t in range(n):
        k_range = max(k_range, cK[pool[t]] + 1)
    order = _counting_pass(pool, cdB, db_min, RB)
    order = _counting_pass(order, cdF, df_min, RF)
    order = _counting_pass(order, cK, 0, k_range)
    start = 0
    while start < n:
        end = start + 1
        while (end < n and cK[order[end]] == cK[order[start]] and cdF[order[end]] == cdF[order[start]]
               and cdB[order[end]] == cdB[order[start]]):
            end += 1
        for t in range(start + 1, end):
            c = order[t]
            u = t
            while u > start and ccost[order[u - 1]] > ccost[c]:
                order[u] = order[u - 1]
                u -= 1
            order[u] = c
        start = end
    return order


@njit(cache=True)
def _counting_pass(order, value, low, size):
    """``order`` stably sorted by ``value[order[t]] - low``, which lies in [0, size)."""
    count = np.zeros(size + 1, np.int64)
    for t in range(order.shape[0]):
        count[value[order[t]] - low + 1] += 1
    for v in range(size):
        count[v + 1] += count[v]
    out = np.empty_like(order)
    for t in range(order.shape[0]):
        v = value[order[t]] - low
        out[count[v]] = order[t]
        count[v] += 1
    return out


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
