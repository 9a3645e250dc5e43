"""The bounds every result is judged against (DESIGN.md, "Lower bounds").

- ``ideal_time``: the iteration with no offloading and unlimited memory;
- ``peak_memory``: M_peak, the device bytes of that iteration (the keep-all peak);
- ``min_memory``: the smallest budget any offloading schedule can run in (every saved
  tensor but the one in use offloaded; papers/004's M_GPU lower end of Figure 5);
- ``lower_bound``: papers/004 Prop. 3, LB = max(compute, 2 (M_peak - M) / beta), with
  beta split into the two directions, and overlapped when the copy engines are duplex;
  where stages offer algorithms, compute and M_peak are those of the relaxation that takes
  each operation's fastest time and smallest workspace, so that the bound holds whatever
  algorithms a planner picks;
- ``schedule_lower_bound``: the same bound for one schedule: its algorithms, the sum over
  its sub-batch passes, and no transfer term for a pass that recomputes (its compute
  term counts the recomputations).
"""

from __future__ import annotations

from dataclasses import replace

from harness.memory import stage_memory
from harness.model import Profile, Schedule, training_ops
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
    choice = [-1] * profile.n_stages
    choice[i] = algorithm
    needs = op_needs(profile, choice)
    return needs[2 * i][1], needs[2 * i + 1][1]


def relaxed(profile: Profile) -> Profile:
    """The profile whose every operation takes its fastest time and smallest workspace.

    No single algorithm choice beats it in compute time or in memory, so bounds computed
    on it hold for every choice a planner can make.
    """
    if not any(s.algorithms for s in profile.stages):
        return profile
    stages = []
    for s in profile.stages:
        options = [s.algorithm(-1), *s.algorithms]
        stages.append(replace(
            s, fwd_time=min(a.fwd_time for a in options), bwd_time=min(a.bwd_time for a in options),
            fwd_workspace=min(a.fwd_workspace for a in options),
            bwd_workspace=min(a.bwd_workspace for a in options), algorithms=(),
        ))
    return replace(profile, stages=tuple(stages), variants=())


def lower_bound(profile: Profile, budget: float, duplex: bool = False, m_peak: int | None = None) -> float:
    """papers/004 Prop. 3: every schedule moves at least M_peak - M out and back in.

    ``m_peak`` may pass in ``peak_memory(relaxed(profile))`` when it is already known.
    """
    profile = relaxed(profile)
    m_peak = peak_memory(profile) if m_peak is None else m_peak
    q = max(0.0, m_peak - budget)
    out, back = q / profile.d2h_bandwidth, q / profile.h2d_bandwidth
    return max(profile.compute_time, max(out, back) if duplex else out + back)


def schedule_lower_bound(profile: Profile, schedule: Schedule, budget: float, duplex: bool = False) -> float:
    """Prop. 3 for one schedule: its algorithms, summed over its sub-batch passes.

    Every transfer of a pass happens between its first forward and its last backward, so
    each pass is bounded on its own. A pass that recomputes (``R`` operations) reduces
    memory without moving data, so only its compute term applies, its recomputations
    included.
    """
    total = 0.0
    for sb, p in enumerate(pass_profiles(profile, schedule)):
        if schedule.algorithms:
            p = replace(p, variants=(), stages=tuple(
                replace(s, **_as_default(s, schedule.algorithm_of(i))) for i, s in enumerate(p.stages)))
        recomputed = [op.stage for op in schedule.ops if op.kind == "R" and op.sub_batch == sb]
        if recomputed:
            total += p.compute_time + sum(p.stages[i].fwd_time for i in recomputed)
        else:
            total += lower_bound(p, budget, duplex=duplex)
    return total


def _as_default(stage, index: int) -> dict:
    a = stage.algorithm(index)
    return dict(fwd_time=a.fwd_time, bwd_time=a.bwd_time, fwd_workspace=a.fwd_workspace,
                bwd_workspace=a.bwd_workspace, algorithms=())
