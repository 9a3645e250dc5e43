"""Algorithm 1 of papers/004 written plainly, with hash tables as in the paper: the kernel's reference.

IDLE_i maps a state (K, Delta_F, Delta_B) to the least idle time of a schedule reaching
it, with the state it came from and the decision (1: offload x_{i-1}). The recurrences are
those of ``_kernels`` (same arithmetic, same tie-breaking, same pruning of dominated
states), so both choose the same set.
"""

from __future__ import annotations

import time

from membudget_dynprog.planner import Discretised, Solution, eps_g


def _better(cost: float, dec: int, parent: tuple, old: tuple) -> bool:
    """Lower idle first; on a tie keep (0) before offload (1), then the smaller parent state."""
    return (cost, dec, parent) < (old[0], old[2], old[1])


def _pareto(layer: dict, same_df: bool) -> dict:
    """Drop the states another state of the same K dominates (<= Delta_F, <= Delta_B, <= idle).

    With ``same_df`` only states of the same Delta_F compare (eq. (10) is not monotone in
    Delta_F). Domination is transitive, so checking against the states kept suffices.
    """
    groups: dict[tuple, list] = {}
    for state in sorted(layer):
        K, dF, _ = state
        groups.setdefault((K, dF) if same_df else K, []).append(state)
    kept = {}
    for states in groups.values():
        front: list[tuple[int, float]] = []
        for state in states:  # by increasing Delta_F, then Delta_B
            idle = layer[state][0]
            if any(db <= state[2] and i <= idle for db, i in front):
                continue
            front.append((state[2], idle))
            kept[state] = layer[state]
    return kept


def solve_reference(d: Discretised, deadline: float | None = None, candidates: int = 1) -> Solution | None:
    """Fill IDLE_0..IDLE_L (Algorithm 1), add eps_G (eqs. (9), (10)), backtrack the decisions.

    The ``candidates`` best last states are backtracked, best first.
    """
    S, n = d.slots, d.n_stages
    df_min, db_min = d.df_min, d.db_min
    top = S + int(d.x.max(initial=0)) + 1
    layers: list[dict[tuple[int, int, int], tuple[float, tuple | None, int]]] = [{(0, 0, 0): (0.0, None, 0)}]
    created = 1
    for i in range(n):
        if deadline is not None and time.perf_counter() > deadline:
            return Solution((), float("nan"), created, timed_out=True)
        x, cf, cb, uf, ub = int(d.x[i]), int(d.cf[i]), int(d.cb[i]), int(d.uf[i]), int(d.ub[i])
        last = i == n - 1
        nxt: dict[tuple[int, int, int], tuple[float, tuple | None, int]] = {}
        for state, (idle, _, _) in layers[-1].items():
            K, dF, dB = state
            if K + cf > S or K + cb > S:  # F_i or B_i cannot fit even with everything sent away
                continue
            dfp, dbp = max(dF, 0), max(dB, 0)
            ef = max(0, K + dfp + cf - S)  # eq. (1), times beta, in slots
            eb = max(0, K + dbp + cb - S)  # eq. (6)
            cost = idle + ef * d.wf + eb * d.wb
            moves = [(0, K + x, dF - ef - uf, dB - eb - ub)]  # eqs. (4), (5), (8)
            if d.offloadable[i]:
                moves.append((1, K, dfp + x - ef - uf, x + max(dB - eb - ub, 0)))  # eqs. (2), (3), (7)
            for dec, nk, ndf, ndb in moves:
                if nk > S and not last:
                    continue
                new = (nk, max(ndf, df_min), max(ndb, db_min))
                assert new[1] <= top and new[2] <= top, "outside the kernel's key range"
                old = nxt.get(new)
                if old is None:
                    created += 1
                if old is None or _better(cost, dec, state, old):
                    nxt[new] = (cost, state, dec)
        if not nxt:
            return None
        layers.append(_pareto(nxt, same_df=len(d.g10) > 0))
    ranked = []
    for state, (idle, _, _) in layers[-1].items():
        K, dF, dB = state
        total = idle + eps_g(K, dF, dB, d.wf, d.wb, d.h9, d.g10)
        ranked.append(((total, -K, dF, dB), state))
    ranked.sort()
    found = []
    for rank, final in ranked[:max(1, candidates)]:
        offload = []
        state = final
        for i in range(n, 0, -1):
            _, parent, dec = layers[i][state]
            if dec:
                offload.append(i - 1)
            state = parent
        found.append((tuple(sorted(offload)), float(rank[0])))
    return Solution(found[0][0], found[0][1], created, candidates=tuple(found))


def idle_of_set(d: Discretised, offload) -> float | None:
    """The idle time the recurrences give one fixed offload set (None: it does not fit).

    The same equations as Algorithm 1 along a single path: what the DP minimises over sets.
    """
    chosen = set(offload)
    K = dF = dB = 0
    idle = 0.0
    S = d.slots
    for i in range(d.n_stages):
        x, cf, cb, uf, ub = int(d.x[i]), int(d.cf[i]), int(d.cb[i]), int(d.uf[i]), int(d.ub[i])
        if K + cf > S or K + cb > S or (i in chosen and not d.offloadable[i]):
            return None
        dfp, dbp = max(dF, 0), max(dB, 0)
        ef = max(0, K + dfp + cf - S)
        eb = max(0, K + dbp + cb - S)
        idle = idle + ef * d.wf + eb * d.wb
        if i in chosen:
            dF, dB = dfp + x - ef - uf, x + max(dB - eb - ub, 0)
        else:
            K, dF, dB = K + x, dF - ef - uf, dB - eb - ub
        if K > S and i < d.n_stages - 1:
            return None
        dF, dB = max(dF, d.df_min), max(dB, d.db_min)
    return idle + eps_g(K, dF, dB, d.wf, d.wb, d.h9, d.g10)
