"""The simulator's hot loop as a Numba kernel over the lowered arrays.

Same rules as ``harness.simulate.reference`` (read that one first); this one trades
readability for speed: per-operation lists of issued and awaited transfers are CSR
arrays, the engines are queues of transfer indices, and nothing allocates in the loop.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from harness.model import PAPER_OFFLOAD_START
from harness.simulate.lowering import Lowered
from harness.simulate.reference import OK, STUCK, Timing, after_forward


def _csr(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Group indices 0..len(keys)-1 by key (keys < 0 dropped): (pointers, indices)."""
    order = np.argsort(keys, kind="stable")
    order = order[keys[order] >= 0]
    counts = np.bincount(keys[order], minlength=n)
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(counts)
    return ptr, order.astype(np.int64)


@njit(cache=True)
def _simulate(
    budget, base, op_is_b, op_dur, op_alloc, op_free, op_tensor, t_size,
    tr_tensor, tr_is_pre, tr_bytes, tr_dur, tr_engine, tr_wait_op,
    issue_s_ptr, issue_s_idx, issue_e_ptr, issue_e_idx, wait_ptr, wait_idx,
    eng_ptr, eng_idx, t_fop, wait_for_end,
):
    n_ops = op_dur.shape[0]
    n_tr = tr_dur.shape[0]
    n_t = t_size.shape[0]
    n_eng = eng_ptr.shape[0] - 1
    nan = np.nan
    op_start = np.full(n_ops, nan)
    op_end = np.full(n_ops, nan)
    tr_issued = np.full(n_tr, nan)
    tr_start = np.full(n_tr, nan)
    tr_end = np.full(n_tr, nan)
    tr_release = np.full(n_tr, nan)
    t_dev = np.zeros(n_t, dtype=np.int64)
    t_host = np.zeros(n_t, dtype=np.int64)
    t_pref = np.zeros(n_t, dtype=np.int64)  # prefetches not yet ended
    t_offl = np.zeros(n_t, dtype=np.int64)  # offloads not yet released
    t_orun = np.zeros(n_t, dtype=np.int64)  # offloads not yet ended
    t_unrel = np.zeros(n_t, dtype=np.int64)  # offload bytes done, awaiting their F's end
    t_unrel_n = np.zeros(n_t, dtype=np.int64)
    waits_left = np.zeros(n_ops, dtype=np.int64)
    for j in range(n_tr):
        if tr_is_pre[j]:
            t_pref[tr_tensor[j]] += 1
        else:
            t_offl[tr_tensor[j]] += 1
            t_orun[tr_tensor[j]] += 1
        if tr_wait_op[j] >= 0:
            waits_left[tr_wait_op[j]] += 1
    head = np.zeros(n_eng, dtype=np.int64)
    busy = np.full(n_eng, -1, dtype=np.int64)  # running transfer per engine
    for e in range(n_eng):
        head[e] = eng_ptr[e]

    now = 0.0
    mem = float(base)
    peak = mem
    next_op = 0
    running = -1
    while True:
        progress = True
        while progress:
            progress = False
            if running >= 0 and op_end[running] <= now:
                k = running
                running = -1
                mem -= op_free[k]
                t = op_tensor[k]
                if t < 0:
                    pass  # a forward that saves nothing for a backward
                elif op_is_b[k]:
                    mem -= t_dev[t]
                    t_dev[t] = 0
                elif t_unrel_n[t] > 0:
                    for j in range(n_tr):  # rare: offloads that outran their forward
                        if tr_tensor[j] == t and not tr_is_pre[j] and tr_end[j] == tr_end[j] and tr_release[j] != tr_release[j]:
                            tr_release[j] = now
                    mem -= t_unrel[t]
                    t_dev[t] -= t_unrel[t]
                    t_offl[t] -= t_unrel_n[t]
                    t_unrel[t] = 0
                    t_unrel_n[t] = 0
                for q in range(issue_e_ptr[k], issue_e_ptr[k + 1]):
                    tr_issued[issue_e_idx[q]] = now
                progress = True
            for e in range(n_eng):
                j = busy[e]
                if j >= 0 and tr_start[j] + tr_dur[j] <= now:
                    busy[e] = -1
                    tr_end[j] = tr_start[j] + tr_dur[j]
                    t = tr_tensor[j]
                    if tr_is_pre[j]:
                        t_pref[t] -= 1
                        t_host[t] -= tr_bytes[j]
                    else:
                        t_orun[t] -= 1
                        t_host[t] += tr_bytes[j]
                        f = t_fop[t]
                        if op_end[f] == op_end[f] and op_end[f] <= now:
                            tr_release[j] = now
                            mem -= tr_bytes[j]
                            t_dev[t] -= tr_bytes[j]
                            t_offl[t] -= 1
                        else:
                            t_unrel[t] += tr_bytes[j]
                            t_unrel_n[t] += 1
                    w = tr_wait_op[j]
                    if w >= 0:
                        waits_left[w] -= 1
                    progress = True
            if running < 0 and next_op < n_ops:
                k = next_op
                t = op_tensor[k]
                ready = waits_left[k] == 0
                if ready and op_is_b[k]:
                    ready = t_dev[t] == t_size[t] and t_pref[t] == 0 and t_offl[t] == 0
                if ready and mem + op_alloc[k] <= budget:
                    mem += op_alloc[k]
                    if mem > peak:
                        peak = mem
                    if not op_is_b[k] and t >= 0:
                        t_dev[t] = t_size[t]
                    op_start[k] = now
                    op_end[k] = now + op_dur[k]
                    running = k
                    next_op += 1
                    for q in range(issue_s_ptr[k], issue_s_ptr[k + 1]):
                        tr_issued[issue_s_idx[q]] = now
                    progress = True
            for e in range(n_eng):
                if busy[e] >= 0 or head[e] >= eng_ptr[e + 1]:
                    continue
                j = eng_idx[head[e]]
                if tr_issued[j] != tr_issued[j]:
                    continue
                t = tr_tensor[j]
                if tr_is_pre[j]:
                    if t_orun[t] > 0 or t_host[t] < tr_bytes[j] or mem + tr_bytes[j] > budget:
                        continue
                    mem += tr_bytes[j]
                    if mem > peak:
                        peak = mem
                    t_dev[t] += tr_bytes[j]
                elif op_start[t_fop[t]] != op_start[t_fop[t]]:
                    continue
                elif wait_for_end and not op_end[t_fop[t]] <= now:
                    continue
                tr_start[j] = now
                busy[e] = j
                head[e] += 1
                progress = True
        nxt = np.inf
        if running >= 0:
            nxt = op_end[running]
        for e in range(n_eng):
            j = busy[e]
            if j >= 0 and tr_start[j] + tr_dur[j] < nxt:
                nxt = tr_start[j] + tr_dur[j]
        if nxt == np.inf:
            break
        now = nxt

    status = OK if (next_op == n_ops and running < 0) else STUCK
    return status, next_op, op_start, op_end, tr_start, tr_end, tr_release, peak, budget - mem


def simulate_kernel(low: Lowered, offload_start: str = PAPER_OFFLOAD_START) -> Timing:
    """Run the Numba kernel on ``low`` and return its timing (``offload_start``: the reference's rule)."""
    wait_for_end = after_forward(offload_start)
    n_ops, n_t = low.n_ops, len(low.t_size)
    n_eng = int(low.tr_engine.max()) + 1 if len(low.tr_engine) else 1
    issue_start = np.where(low.tr_issue_end, -1, low.tr_issue_op)
    issue_end = np.where(low.tr_issue_end, low.tr_issue_op, -1)
    s_ptr, s_idx = _csr(issue_start, n_ops)
    e_ptr, e_idx = _csr(issue_end, n_ops)
    w_ptr, w_idx = _csr(low.tr_wait_op, n_ops)
    g_ptr, g_idx = _csr(low.tr_engine, n_eng)
    t_fop = np.full(n_t, -1, dtype=np.int64)
    f_ops = np.flatnonzero(~low.op_is_b & (low.op_tensor >= 0))  # the creator of each saved tensor
    t_fop[low.op_tensor[f_ops]] = f_ops
    status, blocked, op_s, op_e, tr_s, tr_e, tr_r, peak, free = _simulate(
        low.budget, float(low.base_bytes), low.op_is_b, low.op_dur, low.op_alloc, low.op_free, low.op_tensor,
        low.t_size, low.tr_tensor, low.tr_is_prefetch, low.tr_bytes, low.tr_dur, low.tr_engine, low.tr_wait_op,
        s_ptr, s_idx, e_ptr, e_idx, w_ptr, w_idx, g_ptr, g_idx, t_fop, wait_for_end,
    )
    return Timing(
        status=int(status), blocked_op=int(blocked) if status != OK else -1,
        op_start=op_s, op_end=op_e, tr_start=tr_s, tr_end=tr_e, tr_release=tr_r,
        peak=float(peak), free_at_block=float(free),
    )
