"""The bounds every result is judged against (DESIGN.md, "Lower bounds").

- ``ideal_time``: the iteration with no offloading and unlimited memory;
- ``peak_memory``: M_peak, the device bytes of that iteration (the keep-all peak);
- ``min_memory``: the smallest budget any offloading schedule can run in (every saved
  tensor but the one in use offloaded; papers/004's M_GPU lower end of Figure 5);
- ``lower_bound``: papers/004 Prop. 3, LB = max(compute, 2 (M_peak - M) / beta), with
  beta split into the two directions, and overlapped when the copy engines are duplex.
"""

from __future__ import annotations

from harness.model import Profile, Schedule, training_ops
from harness.simulate.lowering import stage_profile


def ideal_time(profile: Profile) -> float:
    """Sum of forward and backward times with default algorithms."""
    return profile.compute_time


def peak_memory(profile: Profile) -> int:
    """M_peak: the peak device bytes of the keep-all iteration (no budget)."""
    from harness.simulate.executor import timing

    schedule = Schedule("keep-all", 0, training_ops(profile.n_stages))
    _, tm = timing(schedule, profile, budget=float("inf"))
    return int(tm.peak)


def op_needs(profile: Profile, memory_optimal: bool = False) -> list[tuple[str, int]]:
    """Bytes each operation needs on the device when everything offloadable is offloaded.

    F_i holds x_i, the rest of its saved data, its output and workspace; B_i holds its
    saved data, y_{i+1}, y_i and workspace (the last stage also the output and its
    gradient); the weights are always there. ``memory_optimal`` uses each stage's
    smallest-workspace algorithm.
    """
    n = profile.n_stages
    needs = []
    for i, s in enumerate(profile.stages):
        options = [s.algorithm(-1), *s.algorithms] if memory_optimal else [s.algorithm(-1)]
        ws_f = min(a.fwd_workspace for a in options)
        ws_b = min(a.bwd_workspace for a in options)
        out = profile.stages[i + 1].input_bytes if i + 1 < n else profile.output_bytes
        f = profile.weight_bytes + max(s.input_bytes, s.saved_bytes) + out + ws_f
        grad_in = profile.stages[i + 1].grad_bytes if i + 1 < n else 2 * profile.output_bytes
        b = profile.weight_bytes + s.saved_bytes + grad_in + s.grad_bytes + ws_b
        needs += [(f"F{i}", f), (f"B{i}", b)]
    return needs


def min_memory(profile: Profile, memory_optimal: bool = False) -> int:
    """The smallest budget in which some offloading schedule of ``profile`` can run."""
    return max(need for _, need in op_needs(profile, memory_optimal))


def lower_bound(profile: Profile, budget: float, duplex: bool = False, m_peak: int | None = None) -> float:
    """papers/004 Prop. 3: every schedule moves at least M_peak - M out and back in."""
    m_peak = peak_memory(profile) if m_peak is None else m_peak
    q = max(0.0, m_peak - budget)
    out, back = q / profile.d2h_bandwidth, q / profile.h2d_bandwidth
    return max(profile.compute_time, max(out, back) if duplex else out + back)


def schedule_lower_bound(profile: Profile, schedule: Schedule, budget: float, duplex: bool = False) -> float:
    """Prop. 3 for a schedule of n sub-batch passes: the sum of each pass's own bound.

    Every transfer of a pass happens between its first forward and its last backward, so
    each pass is bounded on its own; sub-batching moves less than the whole batch's
    M_peak - M would. With one pass this is ``lower_bound``.
    """
    if schedule.sub_batches <= 1:
        return lower_bound(profile, budget, duplex=duplex)
    return schedule.sub_batches * lower_bound(stage_profile(profile, schedule), budget, duplex=duplex)
