"""The bounds every result is judged against (docs/architecture.md, "Lower bounds").

- ``ideal_time``: the iteration with no offloading and unlimited memory;
- ``peak_memory``: M_peak, the device bytes of that iteration (the keep-all peak);
- ``min_memory``: the smallest budget any offloading schedule can run in (every saved
  tensor but the one in use offloaded; papers/004's M_GPU lower end of Figure 5);
- ``lower_bound``: papers/004 Prop. 3, LB = max(compute, 2 (M_peak - M) / beta), with
  beta split into the two directions, and overlapped when the copy engines are duplex;
  where stages offer algorithms, the least such bound over every choice of algorithms
  (``algorithm_frontier``), so that it holds whatever algorithms a planner picks and is
  never below the ideal time of a choice that cannot beat the defaults. This is the
  *budget's* bound: the same for every strategy at a budget (the tables' common column);
- ``schedule_lower_bound``: the same bound for one schedule: its algorithms, the sum over
  its sub-batch passes, and no transfer term for a pass that recomputes (its compute
  term counts the recomputations).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Iterable

from harness.memory import pass_ops, stage_memory
from harness.model import Profile, Schedule, duplex_of, training_ops
from harness.simulate.lowering import pass_profiles


def ideal_time(profile: Profile) -> float:
    """Sum of forward and backward times with default algorithms."""
    return profile.compute_time


def peak_memory(profile: Profile) -> int:
    """M_peak: the peak device bytes of the keep-all iteration (no budget)."""
    from harness.simulate.executor import timing

    schedule = Schedule("keep-all", 0, training_ops(profile.n_stages))
    _, tm = timing(schedule, profile, budget=float("inf"))
    return int(tm.peak)


def op_needs(profile: Profile, algorithm: list[int] | None = None) -> list[tuple[str, int]]:
    """Bytes each operation needs on the device when everything offloadable is offloaded.

    The weights plus ``harness.memory``'s forward and backward needs: F_i holds x_i, the
    rest of its saved data, its output and workspace; B_i holds its saved data, the part
    of x_{i+1} it needs (``output_saved_bytes``), y_{i+1}, y_i and workspace (the last
    stage also the output and its gradient). ``algorithm`` gives each stage's algorithm
    index (default: the stage defaults).
    """
    needs = []
    for i in range(profile.n_stages):
        m = stage_memory(profile, i, algorithm[i] if algorithm else -1)
        needs += [(f"F{i}", profile.weight_bytes + m.forward_need), (f"B{i}", profile.weight_bytes + m.backward_need)]
    return needs


def min_memory(profile: Profile, memory_optimal: bool = False) -> int:
    """The smallest budget in which some offloading schedule of ``profile`` can run.

    With ``memory_optimal`` each stage takes the algorithm that minimises its larger need
    (one algorithm serves both F_i and B_i, as in ``Schedule.algorithms``).
    """
    if not memory_optimal:
        return max(need for _, need in op_needs(profile))
    worst = 0
    for i, s in enumerate(profile.stages):
        best = min(
            max(_stage_needs(profile, i, a)) for a in range(-1, len(s.algorithms))
        )
        worst = max(worst, best)
    return worst


def _stage_needs(profile: Profile, i: int, algorithm: int) -> tuple[int, int]:
    """F_i's and B_i's needs (``op_needs``) with stage i on ``algorithm``: they depend on its own alone."""
    m = stage_memory(profile, i, algorithm)
    return profile.weight_bytes + m.forward_need, profile.weight_bytes + m.backward_need


_HUGE = 2**50  # a workspace larger than any profile's memory: the peak is then at its operation


@cache
def algorithm_frontier(profile: Profile) -> tuple[tuple[int, float], ...]:
    """For each keep-all peak P some choice of algorithms reaches: (P, the least compute time of
    any choice whose keep-all peak is at most P), ascending in P.

    One algorithm serves both F_i and B_i (``Schedule.algorithms``) and only workspaces
    depend on it, so the keep-all peak of a choice c is max(P0, max_i need_i(c_i)), where P0
    is the peak with the choosable stages' workspaces at 0 and need_i(a) = max(base(F_i) +
    fwd_workspace(a), base(B_i) + bwd_workspace(a)); base(o) is the memory around operation
    o, read from the simulator by giving o alone a huge workspace. A profile without
    alternatives has one point: (M_peak, ideal time).
    """
    choosable = [i for i, s in enumerate(profile.stages) if s.algorithms]
    plain = replace(profile, variants=())
    if not choosable:
        return ((peak_memory(plain), plain.compute_time),)

    def with_workspaces(ws: dict[tuple[int, str], int]) -> Profile:
        stages = list(plain.stages)
        for i in choosable:
            stages[i] = replace(stages[i], algorithms=(), fwd_workspace=ws.get((i, "F"), 0),
                                bwd_workspace=ws.get((i, "B"), 0))
        return replace(plain, stages=tuple(stages))

    floor = peak_memory(with_workspaces({}))
    base = {(i, d): peak_memory(with_workspaces({(i, d): _HUGE})) - _HUGE for i in choosable for d in "FB"}
    options = {i: [profile.stages[i].algorithm(a) for a in range(-1, len(profile.stages[i].algorithms))]
               for i in choosable}
    need = {i: [max(floor, base[i, "F"] + a.fwd_workspace, base[i, "B"] + a.bwd_workspace) for a in options[i]]
            for i in choosable}
    fixed = sum(s.fwd_time + s.bwd_time for k, s in enumerate(profile.stages) if k not in options)
    points = []
    for peak in sorted({floor, *(n for i in choosable for n in need[i])}):
        allowed = [[a.fwd_time + a.bwd_time for a, n in zip(options[i], need[i]) if n <= peak] for i in choosable]
        if all(allowed):
            compute = fixed + sum(min(times) for times in allowed)
            if not points or compute < points[-1][1]:
                points.append((peak, compute))
    return tuple(points)


def lower_bound(profile: Profile, budget: float, duplex: bool = False, m_peak: int | None = None) -> float:
    """papers/004 Prop. 3: every schedule moves at least M_peak - M out and back in.

    Over a choice of algorithms, the least bound of any choice: min over the frontier's
    points (P, C) of max(C, transfer(P - M)). ``m_peak`` may pass in ``peak_memory(profile)``
    when it is already known (used only when no stage offers algorithms).
    """
    if m_peak is not None and not any(s.algorithms for s in profile.stages):
        frontier: Iterable[tuple[int, float]] = ((m_peak, profile.compute_time),)
    else:
        frontier = algorithm_frontier(profile)

    def bound(peak: float, compute: float) -> float:
        q = max(0.0, peak - budget)
        out, back = q / profile.d2h_bandwidth, q / profile.h2d_bandwidth
        return max(compute, max(out, back) if duplex else out + back)

    return min(bound(peak, compute) for peak, compute in frontier)


def schedule_lower_bound(profile: Profile, schedule: Schedule, budget: float, duplex: bool | None = None) -> float:
    """Prop. 3 for one schedule: its algorithms, summed over its sub-batch passes, for copy engines
    ``duplex`` (default: the schedule's).

    Every transfer of a pass happens between its first forward and its last backward, so
    each pass is bounded on its own. A pass that recomputes (``R`` operations) reduces
    memory without moving data, so only its compute term applies, its recomputations
    included.
    """
    duplex = duplex_of(schedule, duplex)
    total = 0.0
    passes = pass_ops(schedule, profile.n_stages)
    for sb, p in enumerate(pass_profiles(profile, schedule)):
        # the algorithms the schedule runs (the defaults when it names none), never the relaxation:
        # a keep-all schedule at the peak must meet its bound exactly
        p = replace(p, variants=(), stages=tuple(
            replace(s, **_as_default(s, schedule.algorithm_of(i))) for i, s in enumerate(p.stages)))
        recomputed = [i for i, r in enumerate(passes[sb].recompute) if r is not None]
        if recomputed:
            total += p.compute_time + sum(p.stages[i].fwd_time for i in recomputed)
        else:
            total += lower_bound(p, budget, duplex=duplex)
    return total


def _as_default(stage, index: int) -> dict:
    a = stage.algorithm(index)
    return dict(fwd_time=a.fwd_time, bwd_time=a.bwd_time, fwd_workspace=a.fwd_workspace,
                bwd_workspace=a.bwd_workspace, algorithms=())
