"""HYBRID: per stage keep, offload or recompute, chosen jointly by one dynamic program.

The chain model and DYNPROG's recurrences (papers/004 section 5, ``membudget_dynprog``)
extended by one move, after Beaumont, Eyraud-Dubois and Shilova (NeurIPS 2021, section 4:
a recomputed segment behaves, seen from the offloading schedule, like one coarse stage).
The DP state after deciding stages 0..b-1 is DYNPROG's (K, Delta_F, Delta_B): K the
memory kept on the device for the backward pass (saved data of kept stages, checkpoints of
recomputed segments), Delta_F, Delta_B the offload and prefetch work still pending. From a
state of layer a:

- keep stage a / offload stage a (its saved data s_a): DYNPROG's moves, eqs. (1)-(8), to
  layer a + 1;
- recompute the segment [a, b) (``harness.schedules.recompute_ops``: Fc_a, Fn_{a+1..b-1},
  then R_a..R_{b-1} before B_{b-1}): one coarse stage to layer b whose saved data is the
  checkpoint x_a, whose forward need C^F is the largest of its forwards' and backward need
  C^B the largest of its recomputations' and backwards' (``harness.memory.segment_phase_needs``),
  whose overlap windows are its forwards' time (u_F) and its recomputations' plus backwards'
  time (u_B), and whose cost adds the recomputation time sum_{a<=j<b} f_j. Like a stage, the
  coarse stage is kept (DYNPROG's keep move: x_a stays on the device) or, with
  ``offload_checkpoints`` (the default), offloaded (DYNPROG's offload move: x_a goes to the
  host overlapping the following forwards and comes back before R_a overlapping the backward
  of the later stages), which Beaumont et al. find the most profitable offload. The plan
  realises it as an offload and a prefetch of stage a, whose tensor after ``Fc_a`` is its
  checkpoint (``harness.memory``); recomputed data (the stages inside, the extra R_a
  re-creates) never moves.

The value minimised is idle time plus recomputation time, i.e. makespan minus the compute
time of the unmodified chain. Pure DYNPROG (no segment) and pure recomputation (no
offload) are paths of the same table, so with ``beam=0`` the table's optimum is at most
either's in the table's own model (its rounded sizes, and DYNPROG's fractional copies, which
the simulator does not grant: plugins/dynprog/README.md). The planner's guarantee is the
simulated one: it returns the fastest of its own plans, DYNPROG's and RECOMPUTE's.

Discretisation (papers/004 section 5.3.2, as ``membudget_dynprog.discretise``): S slots of
(M - W) / S bytes; s_i rounded optimistically through their partial sums, C^F, C^B and
checkpoints rounded up, the u beta windows rounded down. eps_G (eqs. (9), (10) with
Av_F = 0) is DYNPROG's, computed on the stage chain (h9 takes the kept memory after B_j as
if every later stage were a kept single stage: an approximation on paths ending in a
segment). While no candidate of the table runs in the simulator, or the fastest that ran is
more than 1% slower than the table predicts, the DP is run again with the usable memory shrunk
by 1, 2, 4, ... slots (8 runs at most) and the fastest plan that ran is kept: a whole-tensor copy
needs more room than the fractional model grants it, and a smaller table leaves that room.

The planner returns the fastest, in the simulator, of its own plan, DYNPROG's and the
recomputation planner's (``membudget_recompute``, itself never slower than ``torch-checkpoint``),
so it is never slower than either by construction. Its own plan is the faster of the table's
plans with and without the checkpoint move: more moves do not make the simulated plan faster
(the beam, and the fractional model's price of a checkpoint's copy), so offloading checkpoints
is never slower than ``offload_checkpoints=False`` either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from harness.bounds import peak_memory
from harness.errors import InfeasibleBudget, MembudgetError
from harness.memory import movable_bytes, segment_phase_needs, stage_memory
from harness.model import Profile, Schedule
from harness.options import int_option
from harness.schedules import check_budget, fastest_ordered_schedule, keep_all_schedule
from membudget_dynprog import discretise
from membudget_dynprog.planner import link_slots, slots_up, slots_up_array
from membudget_recompute import Recompute

DEFAULT_SLOTS = 500
TIE_CANDIDATES = 4  # plans backtracked among those tied for the table's optimum, each simulated
SHRINK_ROUNDS = 8  # usable memory shrunk by 1, 2, 4, ... slots while no candidate runs, or runs slower than predicted
MISPREDICTION = 0.01  # a simulated plan more than this fraction above the table's prediction: shrink and try again
DEFAULT_BEAM = 2000  # states kept per layer (0: all, the exact table)


@dataclass(frozen=True)
class HybridTable:
    """DYNPROG's discretised chain (``membudget_dynprog.Discretised``) plus, per segment [a, b)
    (arrays indexed [a, b], -1: left out because it cannot fit), its checkpoint ``sx``, needs
    ``scf``, ``scb``, windows ``suf``, ``sub`` in slots, and recomputation time ``scost`` (s)."""

    disc: object
    sx: np.ndarray
    scf: np.ndarray
    scb: np.ndarray
    suf: np.ndarray
    sub: np.ndarray
    scost: np.ndarray


def discretise_hybrid(profile: Profile, budget: int, slots: int = DEFAULT_SLOTS) -> HybridTable:
    """Express ``profile`` under ``budget`` in ``slots`` slots: DYNPROG's stage arrays, and the segments'."""
    disc = discretise(profile, budget, slots)
    n = profile.n_stages
    usable = int(budget) - profile.weight_bytes
    S, q = disc.slots, disc.slot_bytes

    def up(nbytes: int) -> int:
        return slots_up(nbytes, S, usable)

    mem = [stage_memory(profile, i) for i in range(n)]
    fwd = np.concatenate([[0.0], np.cumsum([s.fwd_time for s in profile.stages])])
    bwd = np.concatenate([[0.0], np.cumsum([s.bwd_time for s in profile.stages])])
    shape = (n + 1, n + 1)
    sx, scf, scb = np.full(shape, -1, np.int64), np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    suf, sub, scost = np.zeros(shape, np.int64), np.zeros(shape, np.int64), np.zeros(shape)
    forward_needs, backward_needs = segment_phase_needs(mem)
    for a in range(n):  # the segments [a, b) of each a at once
        checkpoint = up(movable_bytes(mem[a], "Fc"))
        if checkpoint > S:
            continue
        cf = slots_up_array(forward_needs[a, a + 1:], S, usable)
        cb = slots_up_array(backward_needs[a, a + 1:], S, usable)
        fit = (cf <= S) & (cb <= S)
        ends = np.arange(a + 1, n + 1)[fit]
        sx[a, ends], scf[a, ends], scb[a, ends] = checkpoint, cf[fit], cb[fit]
        recompute = fwd[ends] - fwd[a]
        suf[a, ends] = link_slots(recompute, profile.d2h_bandwidth, q)
        sub[a, ends] = link_slots(recompute + bwd[ends] - bwd[a], profile.h2d_bandwidth, q)
        scost[a, ends] = recompute
    return HybridTable(disc, sx, scf, scb, suf, sub, scost)


@dataclass(frozen=True)
class Decisions:
    """One plan of the table: the stages offloaded, the segments recomputed, and its predicted cost."""

    offload: tuple[int, ...]  # stages offloaded: saving stages, and the first stage of a segment (its checkpoint)
    segments: tuple[tuple[int, int], ...]
    cost: float  # predicted idle + recomputation time (s)


def solve_hybrid(table: HybridTable, candidates: int = 1, beam: int = 0,
                 offload_checkpoints: bool = True) -> tuple[list[Decisions], int] | None:
    """The DP; the ``candidates`` best final states backtracked (best first), and the states kept.

    ``offload_checkpoints``: let the DP offload a recomputed segment's checkpoint (``Decisions.offload``
    then lists the segment's first stage a, whose checkpoint x_a moves).

    None when no state survives (the budget is too small for the table).
    """
    from membudget_dynprog._kernels import final_totals
    from membudget_hybrid._kernels import OFFLOAD, SEGMENT, SEGMENT_OFFLOAD, hybrid_dp

    d = table.disc
    n = d.n_stages
    RF, RB = d.key_ranges  # DYNPROG's; a segment's moves stay inside them while its needs cover its checkpoint
    segments = table.sx >= 0
    if np.any(table.sx[segments] > np.minimum(table.scf, table.scb)[segments]):
        raise MembudgetError("hybrid: a segment's checkpoint is above its forward or backward need, so the DP's "
                             "Delta_F and Delta_B could leave their key ranges; harness.memory's needs are wrong")
    K, dF, dB, cost, parent, move, offsets, built = hybrid_dp(
        d.x, d.cf, d.cb, d.uf, d.ub, d.offloadable, table.sx, table.scf, table.scb, table.suf, table.sub,
        table.scost, d.wf, d.wb, d.slots, d.df_min, d.db_min, RF, RB, beam, bool(offload_checkpoints))
    if built <= n:
        return None
    lo, hi = offsets[n], offsets[n + 1]
    totals = final_totals(K[lo:hi], dF[lo:hi], dB[lo:hi], cost[lo:hi], d.wf, d.wb, d.h9, np.zeros(0))
    order = np.lexsort((dB[lo:hi], dF[lo:hi], -K[lo:hi], totals))[:max(1, candidates)]
    found = []
    for s in order:
        offload, segments = [], []
        at, b = lo + int(s), n
        while b > 0:
            p = int(parent[at])
            a = int(np.searchsorted(offsets, p, side="right")) - 1  # the parent's layer
            if move[at] == SEGMENT:
                segments.append((a, b))
            elif move[at] == SEGMENT_OFFLOAD:  # the segment, and its checkpoint x_a offloaded
                segments.append((a, b))
                offload.append(a)
            elif move[at] == OFFLOAD:
                offload.append(a)
            at, b = p, a
        found.append(Decisions(tuple(sorted(offload)), tuple(sorted(segments)), float(totals[s])))
    return found, int(offsets[n + 1])


@dataclass
class Plan:
    """The outcome of ``plan_hybrid``: the schedule, where it came from, and the table's own plan."""

    schedule: Schedule
    makespan: float
    source: str  # hybrid | dynprog | recompute (the fastest of the three; ties go to hybrid)
    own: Decisions | None  # the table's plan that ran (None: none ran)
    own_makespan: float  # inf when none ran
    rivals: dict[str, float] = field(default_factory=dict)  # the others' makespans (inf: refused)
    states: int = 0
    rounds: int = 0
    table_times: tuple[float, ...] = ()  # the table's plans with and without the checkpoint move (s); (): without only


def plan_hybrid(profile: Profile, budget: int, *, slots: int = DEFAULT_SLOTS, duplex: bool = False,
                rivals: bool = True, beam: int = DEFAULT_BEAM, planner: str = "hybrid",
                offload_checkpoints: bool = True) -> Plan:
    """The table's plan, and (with ``rivals``) DYNPROG's and the recomputation planner's: the fastest.

    ``offload_checkpoints`` False leaves out the move that offloads a segment's checkpoint; with it, the
    table's plan is the faster of the tables' plans with and without the move (``_table_plan``)."""
    slots, beam = int_option(planner, "slots", slots, 1), int_option(planner, "beam", beam, 0)
    check_budget(profile, budget, planner)
    options: dict = {"slots": slots, "beam": beam}
    if not offload_checkpoints:
        options["offload_checkpoints"] = False
    if budget >= peak_memory(profile):
        schedule = keep_all_schedule(profile, budget, planner)
        return Plan(schedule, profile.compute_time, "hybrid", Decisions((), (), 0.0), profile.compute_time)
    from membudget_hybrid._kernels import warm_up

    warm_up()
    own, own_schedule, own_time, states, rounds, table_times = _table_plan(
        profile, budget, slots, beam, planner, options, duplex, bool(offload_checkpoints))
    best = ("hybrid", own_schedule, own_time)
    times: dict[str, float] = {}
    if rivals:
        from harness.simulate.executor import makespan

        for name, schedule in _rival_schedules(profile, budget, slots, duplex):
            t = math.inf if schedule is None else makespan(schedule, profile, budget=budget, duplex=duplex)
            times[name] = math.inf if t is None else t
            if times[name] < best[2]:
                best = (name, schedule, times[name])
    source, schedule, time_ = best
    if schedule is None:
        raise _refusal(profile, budget, planner)
    note = (f"hybrid: S={slots}, {rounds} DP run(s), {states} states; the table's plan "
            + (f"offloads {list(own.offload)}, recomputes {list(own.segments)}, predicted "
               f"+{own.cost:.6g} s (fractional model), simulated {own_time:.6g} s" if own else "did not run")
            + ("" if not table_times else "; the table with the checkpoint move {:.6g} s, without {:.6g} s".format(
                *table_times))
            + "".join(f"; {k} {v:.6g} s" for k, v in times.items())
            + f"; kept: {source}")
    schedule = replace(schedule, planner=planner, notes=note,
                       options={**schedule.options, **options, "source": source})
    return Plan(schedule, time_, source, own, own_time, times, states, rounds, table_times)


def _table_plan(profile: Profile, budget: int, slots: int, beam: int, planner: str, options: dict, duplex: bool,
                offload_checkpoints: bool):
    """``_own_plan`` of the table without the checkpoint move and, with ``offload_checkpoints``, of the table
    with it: the faster in the simulator (ties go to the table with the move), the states and rounds of both,
    and the two plans' makespans, with the move first (empty when only the checkpoint-free table ran).

    More moves do not make the table's plan faster in the simulator: the beam keeps other states (and can
    drop those that lead to the checkpoint-free table's best), and the fractional model (assumption E)
    prices an offloaded checkpoint below what its whole-tensor copy costs (README, "Never slower").

    Both runs shrink the memory the same way, so they share the tables they build (``tables``).
    """
    tables: dict[int, HybridTable] = {}
    without = _own_plan(profile, budget, slots, beam, planner, options, duplex, offload_checkpoints=False,
                        tables=tables)
    if not offload_checkpoints:
        return (*without, ())
    with_move = _own_plan(profile, budget, slots, beam, planner, options, duplex, offload_checkpoints=True,
                          tables=tables)
    best = with_move if with_move[2] <= without[2] else without
    return (*best[:3], with_move[3] + without[3], with_move[4] + without[4], (with_move[2], without[2]))


def _own_plan(profile: Profile, budget: int, slots: int, beam: int, planner: str, options: dict, duplex: bool,
              offload_checkpoints: bool = True, tables: dict[int, HybridTable] | None = None):
    """The table's fastest runnable plan: (decisions, schedule, makespan, states, rounds); (None, None,
    inf, ...) when none runs. The memory is shrunk by 1, 2, 4, ... slots while none runs or the fastest
    found so far is more than ``MISPREDICTION`` above the prediction of the latest table (its model,
    fractional copies among them, saw a faster plan than the simulator grants; a smaller table leaves
    the whole-tensor copies room: GPT-2 in ``tests/test_hybrid.py``). ``tables``: the tables built so
    far, by the budget they were built for (read and filled)."""
    tables = {} if tables is None else tables
    usable = budget - profile.weight_bytes
    states = rounds = 0
    shrink = 0
    best = (None, None, math.inf)
    for _ in range(SHRINK_ROUNDS):
        table_budget = budget - (usable * shrink) // slots
        if table_budget <= profile.weight_bytes:
            break
        if table_budget not in tables:
            tables[table_budget] = discretise_hybrid(profile, table_budget, slots)
        solved = solve_hybrid(tables[table_budget], TIE_CANDIDATES, beam=beam, offload_checkpoints=offload_checkpoints)
        rounds += 1
        if solved is None:
            break
        found, made = solved
        states += made
        best_cost = found[0].cost
        tied = [c for c in found if c.cost <= best_cost + 1e-12 * max(1.0, abs(best_cost))]
        chosen, chosen_schedule, chosen_time = None, None, math.inf
        for c in tied:
            schedule, t = fastest_ordered_schedule(profile, budget, set(c.offload), planner=planner, duplex=duplex,
                                                   options=options, recompute=list(c.segments))
            if schedule is not None and t < chosen_time:
                chosen, chosen_schedule, chosen_time = c, schedule, t
        if chosen_time < best[2]:
            best = (chosen, chosen_schedule, chosen_time)
        if best[2] <= (profile.compute_time + best_cost) * (1 + MISPREDICTION):
            break
        shrink = max(1, 2 * shrink)
    return (*best, states, rounds)


def _rival_schedules(profile: Profile, budget: int, slots: int, duplex: bool):
    """DYNPROG's schedule and the recomputation planner's, None for one that refuses the budget."""
    from membudget_dynprog import plan_offload

    try:
        yield "dynprog", plan_offload(profile, budget, slots=slots, duplex=duplex).schedule
    except (InfeasibleBudget, MembudgetError):
        yield "dynprog", None
    yield "recompute", recompute_schedule(profile, budget, slots)


def recompute_schedule(profile: Profile, budget: int, slots: int = DEFAULT_SLOTS) -> Schedule | None:
    """The recomputation planner's schedule at ``slots`` (None when it refuses the budget):
    ``membudget_recompute``'s optimal segmentation, which is never slower than torch-checkpoint."""
    try:
        return Recompute().plan(profile, budget, slots=slots)
    except (InfeasibleBudget, MembudgetError):  # a refusal, or a self-check that failed: no rival, as for DYNPROG
        return None


def _refusal(profile: Profile, budget: int, planner: str) -> InfeasibleBudget:
    need = peak_memory(profile)  # only reached below the keep-all peak
    return InfeasibleBudget(f"infeasible: {planner} found no schedule for {profile.model} under {budget} bytes; "
                            f"keep-all needs {need} bytes", needed_bytes=need)


class Hybrid:
    """Per stage keep, offload or recompute, by one DP over DYNPROG's state with a segment move.

    Options: ``slots`` (S, default 500), ``duplex`` (passed to the simulator), ``rivals``
    (default True: also run DYNPROG and the recomputation planner and keep the fastest of the
    three; False: the table's plan alone, for study), ``beam`` (states kept per layer, default
    2000; 0 keeps every undominated state: the exact table, slow on long chains),
    ``offload_checkpoints`` (default True: the DP may offload a recomputed segment's checkpoint, and the
    DP without that move runs too, the faster plan kept; False: checkpoints stay on the device, for study).
    """

    name = "hybrid"
    description = ("Keep, offload or recompute per stage, chosen jointly by DYNPROG's DP with a recomputed-segment "
                   "move (Beaumont et al. 2021); never slower than DYNPROG or recompute")

    def plan(self, profile: Profile, budget_bytes: int, slots: int = DEFAULT_SLOTS, duplex: bool = False,
             rivals: bool = True, beam: int = DEFAULT_BEAM, offload_checkpoints: bool = True) -> Schedule:
        """The fastest of the table's plan, DYNPROG's and the recomputation planner's."""
        return plan_hybrid(profile, budget_bytes, slots=slots, duplex=duplex, rivals=rivals, beam=beam,
                           planner=self.name, offload_checkpoints=offload_checkpoints).schedule
