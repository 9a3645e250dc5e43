"""DYNPROG (papers/004 section 5): the best ordered no-wait offload set by dynamic programming.

The chain of the paper mapped onto ours
---------------------------------------
The paper's offloadable ``x_i`` is our stage's ``saved_bytes`` s_i (what F_i keeps for B_i,
the unit ``harness.schedules`` moves). Every other size enters only through the memory an
operation needs, taken from ``harness.memory`` (weights W are resident all the
time, so the DP works in the usable memory M' = budget - W):

- F_i needs, besides the saved data of earlier stages still on the device,
  ``C^F_i = max(|x_i|, s_i) + |x_{i+1}| + ex^F_i`` (its input, the saved part beyond its
  input, its output, its workspace): the paper's ``|x_i| + ex^F_i + |x_{i+1}|`` of eq. (1);
- B_i holds, at its end (its peak: prefetches issued during B_i reserve memory while B_i's
  buffers are still allocated), ``C^B_i = s_i + h_i + |y_{i+1}| + |y_i| + ex^B_i`` (for the
  last stage ``|y_{i+1}|`` is twice the output: the output and its gradient; ``h_i`` is
  ``output_saved_bytes``, the part of x_{i+1} that B_i needs, held after B_{i+1}), the
  paper's ``x_{i+1}, |y_{i+1}|, ex^B_i`` terms of eq. (6).

The DP state after deciding stages 0..i-1 is (K, Delta_F, Delta_B): K the saved bytes of the
kept (not offloaded) stages, so that M_F = K + Delta_F^+ (+ |x_i|, inside C^F_i) and
M_B = K + Delta_B^+ (+ |y_i|, inside C^B_i), which is the paper's identity
``M_B - Delta_B = |y_i| + M_F - Delta_F`` (section 5.2.1) used to drop M_B from the state.

Offloads run at the device-to-host bandwidth, prefetches at the host-to-device one (the
paper has one beta): a slot offloaded costs ``wf`` seconds, a slot prefetched ``wb``.

Idle between the phases, eqs. (9) and (10), is evaluated as
``max(0, Delta_F wf + Delta_B wb, (K + Delta_F^+) wf + h9, eq. (10)'s term)``, h9 the
maximum over every B_j of eq. (9)'s R_j-terms. Eq. (9) takes that maximum only over the
B_j that start before the first prefetch; a later B_j runs once every offload is done, so
its term is below Delta_F / beta - Av_B, the second one, and the maximum over all j is the
same number, O(1) per state and non-decreasing in Delta_F and Delta_B. By default eq. (10)
is taken with Av_F = 0 and the schedule issues no prefetch before the last forward has
ended; ``prefetch_during_forward=True`` evaluates eq. (10) as the paper writes it and lets
the schedule issue prefetches during the last forward operations (``harness.schedules``'
``prefetch_lead``, searched in the simulator), which realises it. On the Figure 5 chains
(analytic V100 profiles, 224x224, batch 32) it changes no set and no makespan: at every
budget the memory is full when the forward pass ends, so no prefetch can start before the
backward frees some; it pays where an early operation's workspace forced data out
(test_prefetch_during_forward_is_realised_by_the_schedule). It stays off by default: it
costs 1.7-5x the planning time there (a larger table: only states of equal Delta_F
compare) for no gain.

Every step and eps_G are non-decreasing in Delta_F and Delta_B, so a state that another
state of the same K dominates (no larger Delta_F, Delta_B, idle) is dropped: the optimum
is kept and the table shrinks by orders of magnitude (with eq. (10), which is not
monotone in Delta_F, only states of the same Delta_F compare).

Discretisation (section 5.3.2): memory in S slots of M'/S bytes; C^F, C^B rounded up; the
partial sums of u_F beta and u_B beta rounded down; the s_i rounded optimistically (their
partial sums rounded up) and, while the chosen set does not run in the simulator, one of
them raised by a slot (``_bump``).

The paper's recurrences free memory as bytes leave and reserve it as they arrive
(section 5.2.1, "released by offloading data at rate beta"); the simulator moves whole
tensors (assumption E). The table's optimum is thus a lower bound of every ordered no-wait
schedule up to the rounding, and its set a heuristic for the whole-tensor problem, as the
paper says (section 5.3.1). That relaxation is the whole difference between the predicted
idle of the notes and the simulated one: with its copies split into chunks (memory freed and
reserved chunk by chunk) the same schedule runs in the predicted time (README.md, with the
gap measured: ResNet-18 at 30 % on H100 predicts 12.26 ms and simulates 14.07 ms, VGG-11
on V100-PCIe up to 29 % over the prediction). ``candidates=k`` (an extension, default 1 = the paper) runs the
table's k best sets in the simulator and keeps the fastest.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from harness.bounds import peak_memory
from harness.errors import InfeasibleBudget, MembudgetError
from harness.memory import stage_memory
from harness.model import Profile, Schedule
from harness.options import choice_option, int_option, seconds_option
from harness.schedules import (best_ordered_schedule, check_budget, fastest_ordered_schedule, keep_all_schedule,
                               offload_set_refusal)

DEFAULT_SLOTS = 500
TIE_CANDIDATES = 64  # sets backtracked to find those tied for the optimum (``ties``)
ENGINES = ("kernel", "reference")
INT64_MAX = 2**63 - 1
LINK_SLOTS_CAP = 2**40  # far beyond any table's slots: a window that moves this much moves everything


def link_slots(seconds: Any, bandwidth: float, slot_bytes: float) -> np.ndarray:
    """The slots a link of ``bandwidth`` moves in ``seconds``, rounded down and capped at ``LINK_SLOTS_CAP``
    (an absurdly fast link, 1e23 B/s, took the count past 64 bits: garbage here, an OverflowError in HYBRID)."""
    moved = np.asarray(seconds, dtype=float) * bandwidth / slot_bytes
    return np.floor(np.minimum(moved, LINK_SLOTS_CAP)).astype(np.int64)


@dataclass(frozen=True)
class Discretised:
    """A chain and a budget in DP units: slots of ``slot_bytes``, integer arrays per stage.

    ``x``: rounded s_i; ``cf``, ``cb``: rounded C^F_i, C^B_i; ``uf``, ``ub``: rounded
    u_F beta, u_B beta (from the rounded-down partial sums); ``wf``, ``wb``: seconds one slot
    takes to offload, to prefetch; ``h9``: the stage-independent part of eq. (9)'s inner
    maximum; ``g10``: eq. (10)'s inner maximum by Av_F in slots (empty: no prefetching
    during the forward phase); ``df_min``, ``db_min``: the clamps of Delta_F, Delta_B below
    which the future no longer depends on them.
    """

    slots: int
    slot_bytes: float
    x: np.ndarray
    x_true: np.ndarray  # s_i in slots, unrounded
    cf: np.ndarray
    cb: np.ndarray
    uf: np.ndarray
    ub: np.ndarray
    offloadable: np.ndarray
    wf: float
    wb: float
    h9: float
    g10: np.ndarray
    df_min: int
    db_min: int

    @property
    def n_stages(self) -> int:
        """L."""
        return len(self.x)

    @property
    def key_ranges(self) -> tuple[int, int]:
        """Sizes of the Delta_F and Delta_B ranges, for the dense state key of ``_kernels``."""
        top = self.slots + int(self.x.max(initial=0)) + 1
        return top - self.df_min + 1, top - self.db_min + 1


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def slots_up(nbytes: int, slots: int, usable: int) -> int:
    """``nbytes`` in slots of ``usable / slots`` bytes, rounded up with exact integer arithmetic."""
    return _ceil_div(int(nbytes) * slots, usable)


def slots_up_array(nbytes: np.ndarray, slots: int, usable: int) -> np.ndarray:
    """``slots_up`` of every entry of an int64 array, in numpy (exact: where a product could pass 63 bits,
    entry by entry in Python integers), capped at the int64 maximum (far beyond any table's slots)."""
    nbytes = np.asarray(nbytes, dtype=np.int64)
    if nbytes.size and (int(nbytes.max()) + 1) * int(slots) >= 2**62:
        return np.array([min(slots_up(v, slots, usable), INT64_MAX) for v in nbytes.tolist()], dtype=np.int64)
    return -((-nbytes * int(slots)) // int(usable))


def discretise(profile: Profile, budget: int, slots: int = DEFAULT_SLOTS, bumps: np.ndarray | None = None,
               prefetch_during_forward: bool = False) -> Discretised:
    """Express ``profile`` under ``budget`` in ``slots`` memory slots (papers/004 section 5.3.2).

    Sizes are rounded with exact integer arithmetic: a size n bytes is n * S / M' slots.
    ``bumps[i]`` raises the rounded s_i by that many slots (the feasibility loop).
    """
    stages = profile.stages
    n = len(stages)
    usable = int(budget) - profile.weight_bytes
    if usable <= 0 or slots < 1:
        raise ValueError("discretise needs a budget above the weights and at least one slot")
    S = int(slots)
    q = usable / S

    def up(nbytes: int) -> int:
        return slots_up(nbytes, S, usable)

    saved = [s.saved_bytes for s in stages]
    # C^F_i and C^B_i: the forward's and the backward's needs (harness.memory; B_i's includes
    # the part of x_{i+1} it needs, left by B_{i+1})
    mem = [stage_memory(profile, i) for i in range(n)]
    cf = np.array([up(m.forward_need) for m in mem], dtype=np.int64)
    cb = np.array([up(m.backward_need) for m in mem], dtype=np.int64)
    # optimistic rounding of |x_i|: the partial sums rounded up
    prefix = np.array([up(v) for v in np.concatenate([[0], np.cumsum(saved, dtype=np.int64)])], dtype=np.int64)
    x = np.diff(prefix)
    if bumps is not None:
        x = x + bumps.astype(np.int64)
    x_true = np.array(saved, dtype=float) * S / usable

    # partial sums of u beta, rounded down (in slots of the direction's bandwidth)
    def down_steps(times: list[float], beta: float) -> np.ndarray:
        sigma = link_slots(np.concatenate([[0.0], np.cumsum(times)]), beta, q)
        return np.diff(sigma)

    uf = down_steps([s.fwd_time for s in stages], profile.d2h_bandwidth)
    ub = down_steps([s.bwd_time for s in stages], profile.h2d_bandwidth)
    wf, wb = q / profile.d2h_bandwidth, q / profile.h2d_bandwidth

    x_prefix = np.concatenate([[0], np.cumsum(x)])
    total_x = int(x_prefix[-1])
    top = S + int(x.max(initial=0)) + 1  # no Delta_F or Delta_B exceeds this (see _kernels)
    # eq. (9): term_j = (K_L - X_L + X_j + Delta_F + C^B_j - S) wf - U^B_j, U^B_j the rounded
    # time of B_{L-1}..B_{j+1}; K_L + Delta_F factors out, the rest is h9
    ub_after = np.concatenate([np.cumsum(ub[::-1])[::-1][1:], [0]])  # sum_{k>j} ub_k
    h9 = max(float((int(x_prefix[j]) - total_x + int(cb[j]) - S) * wf - int(ub_after[j]) * wb) for j in range(n))
    if prefetch_during_forward:
        uf_after = np.concatenate([np.cumsum(uf[::-1])[::-1][1:], [0]])
        df_min = -(math.ceil(top * wb / wf) + int(uf.sum()) + 1)
        g10 = _eq10_table(x_prefix, cf, uf, uf_after, S, wf, wb, -df_min)
    else:
        df_min, g10 = 0, np.zeros(0)
    db_min = -(math.ceil(top * wf / wb) + 1)
    return Discretised(
        slots=S, slot_bytes=q, x=x, x_true=x_true, cf=cf, cb=cb, uf=uf, ub=ub,
        offloadable=np.array([s > 0 for s in saved], dtype=np.bool_),
        wf=wf, wb=wb, h9=h9, g10=g10, df_min=int(df_min), db_min=int(db_min),
    )


def _eq10_table(x_prefix, cf, uf, uf_after, S: int, wf: float, wb: float, a_max: int) -> np.ndarray:
    """eq. (10)'s inner maximum for every Av_F = a slots: over F_j that end within Av_F of the end.

    F_j's peak is at its end (C^F_j plus the prefetches reserved meanwhile). An F_j that
    starts after the last offload keeps every later and its own stage, so K_j = K_L - (X_L - X_j);
    the one during which the last offload ends may have offloaded its own, and is charged
    K_L - (X_L - X_{j+1}) (at most one slot-rounded stage pessimistic).
    """
    total_x = int(x_prefix[-1])
    g = np.full(a_max + 1, -np.inf)
    for j in range(len(cf)):
        ends, starts = int(uf_after[j]), int(uf_after[j]) + int(uf[j])
        inside = float((int(x_prefix[j]) - total_x + int(cf[j]) - S) * wb - ends * wf)
        boundary = float((int(x_prefix[j + 1]) - total_x + int(cf[j]) - S) * wb - ends * wf)
        g[ends + 1:starts + 1] = np.maximum(g[ends + 1:starts + 1], boundary)
        g[starts + 1:] = np.maximum(g[starts + 1:], inside)
    return g


def eps_g(K: int, dF: int, dB: int, wf: float, wb: float, h9: float, g10: np.ndarray) -> float:
    """The idle time between the phases, eqs. (9) and (10) (same arithmetic as the kernel's)."""
    e = dF * wf + dB * wb
    if e < 0.0:
        e = 0.0
    if dF > 0:
        t = (K + dF) * wf + h9
        if t > e:
            e = t
    if dF < 0 and dB > 0 and len(g10) > 0:
        a = -dF
        if a >= len(g10):
            a = len(g10) - 1
        t = (K + dB) * wb + g10[a]
        if t > e:
            e = t
    return e


@dataclass(frozen=True)
class Solution:
    """What Algorithm 1 found: the offload decisions and the idle time it predicts."""

    offload: tuple[int, ...]
    idle: float  # predicted total idle time (seconds), eqs. (1), (6), (9), (10)
    states: int  # DP states created, over all layers
    timed_out: bool = False
    candidates: tuple[tuple[tuple[int, ...], float], ...] = ()  # best sets first, with their idle


def solve(disc: Discretised, engine: str = "kernel", deadline: float | None = None,
          candidates: int = 1) -> Solution | None:
    """Run Algorithm 1 on ``disc``; None when no state survives (the budget is too small).

    ``candidates`` > 1 also backtracks the runner-up last states (``Solution.candidates``).
    """
    choice_option("dynprog", "engine", engine, ENGINES)
    if engine == "kernel":
        from membudget_dynprog._kernels import solve_kernel

        return solve_kernel(disc, deadline, candidates)
    from membudget_dynprog.reference import solve_reference

    return solve_reference(disc, deadline, candidates)


def _bump(disc: Discretised, offload: tuple[int, ...]) -> int | None:
    """The stage whose rounded size to raise by one slot (section 5.3.2's iterative scheme).

    The paper raises "the discretized value which is below, but closest to |x_i|". Only
    kept stages count in the memory the DP checks, so we look among the kept stages
    rounded below their size first (any stage if none), and take the one for which one more
    slot lands closest to the true size (the largest shortfall).
    """
    short = disc.x_true - disc.x
    kept = np.ones(disc.n_stages, dtype=bool)
    kept[list(offload)] = False
    for mask in (kept & (short > 1e-12), short > 1e-12):
        if mask.any():
            candidates = np.flatnonzero(mask)
            return int(candidates[np.argmax(short[candidates])])
    return None


@dataclass
class Plan:
    """The outcome of ``plan_offload``: the set, the schedule, and how they were found."""

    offload: tuple[int, ...]
    schedule: Schedule
    idle: float | None  # what the DP predicted (None: fallback)
    rounds: int  # DP runs (the feasibility loop)
    states: int
    notes: list[str] = field(default_factory=list)


class Dynprog:
    """DYNPROG of Beaumont et al. (papers/004 section 5.3): Algorithm 1's offload set, run no-wait.

    Options: ``slots`` (S of section 5.3.2, default 500), ``time_limit`` (seconds for the
    DP; past it the planner falls back to GREEDY's set and says so in the schedule's notes),
    ``prefetch_during_forward`` (eq. (10) as in the paper, and prefetches issued during the
    last forward operations to realise it; default False, see the module docstring),
    ``candidates`` (k > 1: run the table's k best sets in the simulator and keep the
    fastest, an extension; default 1, the
    paper), ``ties`` (default True: when several sets share the table's smallest idle
    time, the fastest of them in the simulator; False: the first one backtracked),
    ``engine`` (``kernel`` or ``reference``), ``duplex`` (passed to the simulator that picks
    the prefetch window).
    """

    name = "dynprog"
    description = "Optimal offload set for fractional communications by dynamic programming (Beaumont et al. 2020, Alg. 1)"

    def plan(self, profile: Profile, budget_bytes: int, slots: int = DEFAULT_SLOTS, time_limit: float | None = None,
             prefetch_during_forward: bool = False, candidates: int = 1, engine: str = "kernel",
             duplex: bool = False, ties: bool = True, **options) -> Schedule:
        """The ordered no-wait schedule offloading the DP's set; raises ``InfeasibleBudget`` below the minimum."""
        return plan_offload(profile, budget_bytes, slots=slots, time_limit=time_limit,
                            prefetch_during_forward=prefetch_during_forward, candidates=candidates,
                            engine=engine, duplex=duplex, ties=ties).schedule


def plan_offload(profile: Profile, budget: int, *, slots: int = DEFAULT_SLOTS, time_limit: float | None = None,
                 prefetch_during_forward: bool = False, candidates: int = 1, engine: str = "kernel",
                 duplex: bool = False, planner: str = "dynprog", ties: bool = True) -> Plan:
    """DYNPROG with its details: Algorithm 1 inside the feasibility loop of section 5.3.2.

    With ``candidates`` = k > 1 the k best sets of the table (by predicted idle) are each
    run in the simulator and the fastest is kept (an extension: the paper outputs the best
    one, k = 1, which is always among them).

    ``ties``: the paper outputs "the" set of the smallest value in TOTALIDLE (section
    5.3.1) and leaves ties open; on real chains dozens of sets often share it (ResNet-50 at
    batch 32: 31), and whole-tensor copies (assumption E) make them differ in the
    simulator. With ``ties`` (the default) every set tied for the optimum (up to
    ``TIE_CANDIDATES``) is run in the simulator and the fastest kept; without, the first
    one backtracked.
    """
    slots = int_option(planner, "slots", slots, 1)
    candidates = int_option(planner, "candidates", candidates, 1)
    time_limit = seconds_option(planner, "time_limit", time_limit)
    check_budget(profile, budget, planner)
    options: dict = {"slots": slots}
    if prefetch_during_forward:
        options["prefetch_during_forward"] = True
    if candidates > 1:
        options["candidates"] = int(candidates)
    if not ties:
        options["ties"] = False
    if budget >= peak_memory(profile):
        return Plan((), keep_all_schedule(profile, budget, planner), 0.0, 0, 0)
    if engine == "kernel":
        from membudget_dynprog._kernels import warm_up

        warm_up()  # compile (or load the cache) before the clock starts
    deadline = None if time_limit is None else time.perf_counter() + float(time_limit)
    bumps = np.zeros(profile.n_stages, dtype=np.int64)
    rounds = states = 0
    while True:
        disc = discretise(profile, budget, slots, bumps, prefetch_during_forward)
        tied = ties and candidates <= 1
        solution = solve(disc, engine, deadline, TIE_CANDIDATES if tied else candidates)
        rounds += 1
        if solution is None:
            # the all-offload path always survives from min_memory up; say so if it did not
            raise MembudgetError(f"dynprog: no DP state survived for a budget of {budget} bytes (S={slots})")
        states += solution.states
        if solution.timed_out:
            return _greedy_fallback(profile, budget, planner, options, rounds, states, time_limit, duplex,
                                    prefetch_during_forward)
        # time_limit bounds the ties' trials too: past it, the first set backtracked
        if tied and (deadline is None or time.perf_counter() < deadline) and solution.candidates:
            best = solution.candidates[0][1]
            solution = replace(solution, candidates=tuple(
                c for c in solution.candidates if c[1] <= best + 1e-12 * max(1.0, abs(best))))
        else:
            tied = False
        chosen = _fastest(profile, budget, solution, planner, options, duplex,
                          simulate_all=candidates > 1 or (tied and len(solution.candidates) > 1),
                          prefetch_during_forward=prefetch_during_forward)
        if chosen is not None:
            offload, idle, schedule = chosen
            note = (f"dynprog: S={slots}, slot {disc.slot_bytes:.0f} B, predicted idle {idle:.6g} s "
                    f"(fractional model: a lower bound), {rounds} DP run(s), {states} states")
            schedule = Schedule(schedule.planner, schedule.budget_bytes, schedule.ops, schedule.transfers,
                                schedule.algorithms, schedule.sub_batches, schedule.options, note)
            return Plan(offload, schedule, idle, rounds, states, [note])
        stage = _bump(disc, solution.offload)
        if stage is None:
            raise MembudgetError(
                f"dynprog: the set {list(solution.offload)} does not run under {budget} bytes although no size "
                "is rounded down; this is a bug in the DP's memory model")
        bumps[stage] += 1


def _fastest(profile: Profile, budget: int, solution: Solution, planner: str, options: dict, duplex: bool,
             simulate_all: bool, prefetch_during_forward: bool = False):
    """The first candidate set that runs (or, with ``simulate_all``, the fastest): (set, idle, schedule)."""
    best, best_time = None, math.inf
    for offload, idle in solution.candidates:
        schedule, makespan = fastest_ordered_schedule(profile, budget, set(offload), planner=planner, duplex=duplex,
                                                      prefetch_during_forward=prefetch_during_forward, options=options)
        if schedule is None:
            continue
        if not simulate_all:
            return offload, idle, schedule
        if makespan < best_time:
            best, best_time = (offload, idle, schedule), makespan
    return best


def _greedy_fallback(profile: Profile, budget: int, planner: str, options: dict, rounds: int, states: int,
                     time_limit: float | None, duplex: bool, prefetch_during_forward: bool = False) -> Plan:
    """GREEDY's set (papers/004 Theorem 2, rounded up) when the DP ran out of time."""
    from membudget_greedy import greedy_amounts

    offload = tuple(sorted(greedy_amounts(profile, budget)))
    note = f"dynprog: time limit of {time_limit} s exceeded after {states} states; fell back to GREEDY's set"
    schedule = best_ordered_schedule(profile, budget, set(offload), planner=planner, duplex=duplex,
                                     prefetch_during_forward=prefetch_during_forward,
                                     options={**options, "fallback": "greedy"})
    if schedule is None:
        raise offload_set_refusal(profile, budget, set(offload), f"{planner} (timed out, GREEDY's set)", duplex)
    schedule = Schedule(schedule.planner, schedule.budget_bytes, schedule.ops, schedule.transfers,
                        schedule.algorithms, schedule.sub_batches, schedule.options, note)
    return Plan(offload, schedule, None, rounds, states, [note])


@dataclass(frozen=True)
class CurvePoint:
    """One budget of the makespan/memory trade-off: DYNPROG's schedule and its simulated makespan."""

    budget_bytes: int
    offload: tuple[int, ...]
    makespan: float  # nan when infeasible
    predicted_idle: float | None
    status: str  # ok | infeasible


def tradeoff_curve(profile: Profile, budgets, **options) -> list[CurvePoint]:
    """DYNPROG's makespan for each budget (the paper's Figure 5 curves), one DP per budget.

    One table cannot serve several budgets: M_GPU enters every step of the recurrences
    (eqs. (1), (6) compare M_F, M_B with it, which decides the idle times and so the state
    that follows) and the slot size M/S of the discretisation. Rewriting the state with the
    free memory M - K makes the steps budget-free, but then the budget is an initial state
    and a state's value depends on its future, so sharing one table would need a backward
    pass over the whole (free memory, Delta_F, Delta_B) grid, O(L S^3), far more than one
    sparse forward DP per budget. So this loops, with the compiled kernel reused.
    """
    from harness.simulate.executor import simulate

    points = []
    for budget in budgets:
        try:
            plan = plan_offload(profile, int(budget), **options)
        except InfeasibleBudget:
            points.append(CurvePoint(int(budget), (), float("nan"), None, "infeasible"))
            continue
        run = simulate(plan.schedule, profile, duplex=options.get("duplex", False), with_trace=False)
        points.append(CurvePoint(int(budget), plan.offload, run.makespan if run.feasible else float("nan"),
                                 plan.idle, "ok" if run.feasible else "infeasible"))
    return points
