"""The capacity-based swap strategy of papers/002 section 3.5 (Figure 4): planner ``capacity``.

"We can get a good estimation of the memory consumption from the parameters of the
layers in the model. This means even before the forward starting, we can know when to
stop the swap-out": the planner walks the chain's memory model (``harness.simulate.
lowering``) and swaps out the first layers only until the rest fits, so the last layers
stay resident and the backward pass starts as soon as the forward ends (no wait for the
last layer to go out and come back, Figure 3). Swap-in "is only affected by the memory
capacity of the GPU [...] we should keep on swapping in as far as we have enough memory
space": each prefetch is issued at the earliest backward operation from which holding
its data leaves every operation up to its use within the budget (so it never takes
memory a computation needs), in decreasing layer order. Nothing waits but memory and data
(the no-wait rule).
"""

from __future__ import annotations

import numpy as np

from harness.bounds import peak_memory
from harness.errors import InfeasibleBudget
from harness.model import Profile, Schedule, Transfer, training_ops
from harness.schedules import check_budget, keep_all_schedule, op_index, unconstrained_peak
from harness.simulate.executor import timing
from harness.simulate.lowering import Lowered, lower
from harness.units import format_bytes


def op_peaks(low: Lowered, offloaded: set[int], reserve_at: dict[int, int]) -> np.ndarray:
    """Device bytes during each operation of ``low`` (one sub-batch) under a static plan.

    Offloaded data leaves the device when its forward ends (its copy assumed done) and
    comes back at operation ``reserve_at[stage]``, counted from that operation's start.
    """
    extra = np.zeros(low.n_ops, dtype=np.int64)
    for stage, k in reserve_at.items():
        extra[k] += low.t_size[stage]
    mem = low.base_bytes
    peaks = np.zeros(low.n_ops, dtype=np.int64)
    for k in range(low.n_ops):
        mem += extra[k]
        peaks[k] = mem + low.op_alloc[k]
        mem += low.op_alloc[k] - low.op_free[k]
        t = int(low.op_tensor[k])
        if low.op_is_b[k] or t in offloaded:
            mem -= low.t_size[t]
    return peaks


def prefetch_issue_points(low: Lowered, where: dict, offloaded: list[int], budget: int) -> dict[int, int]:
    """Stage -> the operation whose start issues its prefetch: as early as capacity allows.

    Prefetches go in decreasing stage order, none issued before the previous one nor before
    B_{L-1}; each starts at B_{i+1} at the latest (B_{L-1} for the last stage, whose own
    backward starts the backward pass; then it may wait there for memory, as the simulator
    lets a prefetch do).
    """
    n = len(low.t_size)
    reserve = {i: where[("B", i, 0)] for i in offloaded}
    peaks = op_peaks(low, set(offloaded), reserve)
    issue: dict[int, int] = {}
    earliest = where[("B", n - 1, 0)]
    for i in sorted(offloaded, reverse=True):
        b = where[("B", i, 0)]
        size = int(low.t_size[i])
        chosen, running = None, -1
        for k in range(b - 1, earliest - 1, -1):
            running = max(running, int(peaks[k]))
            if running + size > budget:
                break
            chosen = k
        if chosen is None:
            issue[i] = max(b - 1, earliest)  # B_{i+1}: just in time
        else:
            issue[i] = chosen
            peaks[chosen:b] += size
        earliest = issue[i]
    return issue


def capacity_schedule(profile: Profile, budget: int, offloaded: list[int], low: Lowered,
                      planner: str = "capacity") -> Schedule:
    """Offload ``offloaded`` (a prefix) at their forwards' starts; prefetch by capacity."""
    ops = training_ops(profile.n_stages)
    where = op_index(ops)
    issue = prefetch_issue_points(low, where, offloaded, budget)
    transfers = [Transfer(i, "offload", where[("F", i, 0)]) for i in offloaded]
    transfers += [Transfer(i, "prefetch", issue[i]) for i in sorted(offloaded, reverse=True)]
    return Schedule(planner, int(budget), ops, tuple(transfers),
                    options={"kept_from": offloaded[-1] + 1 if offloaded else 0},
                    notes="capacity-based: swap out until the rest fits, swap in as early as memory allows "
                          "(papers/002 section 3.5)")


class Capacity:
    """The capacity-based strategy of OOC-PALEO (papers/002 section 3.5, Figure 4).

    Options: ``duplex`` (copy engines per direction in the feasibility trial).
    """

    name = "capacity"
    description = "Capacity-based swapping: swap out until the rest fits, swap in as early as memory allows (papers/002)"

    def plan(self, profile: Profile, budget_bytes: int, duplex: bool = False, **options) -> Schedule:
        """The shortest swapped-out prefix whose plan fits ``budget_bytes``."""
        check_budget(profile, budget_bytes, self.name)
        if peak_memory(profile) <= budget_bytes:
            return keep_all_schedule(profile, budget_bytes, self.name)
        low = lower(keep_all_schedule(profile, budget_bytes), profile)
        where = op_index(training_ops(profile.n_stages))
        swappable = [i for i, s in enumerate(profile.stages) if s.saved_bytes > 0]
        for k in range(1, len(swappable) + 1):
            prefix = swappable[:k]
            just_in_time = {i: where[("B", i, 0)] for i in prefix}
            if op_peaks(low, set(prefix), just_in_time).max() > budget_bytes:
                continue  # the rest does not fit yet: swap out one more layer
            schedule = capacity_schedule(profile, budget_bytes, prefix, low, self.name)
            _, tm = timing(schedule, profile, duplex=duplex)
            if tm.ok:
                return schedule
        everything = capacity_schedule(profile, budget_bytes, swappable, low, self.name)
        need = unconstrained_peak(everything, profile, duplex)
        raise InfeasibleBudget(
            f"infeasible: {self.name} found no swap-out prefix that fits {budget_bytes} bytes "
            f"({format_bytes(budget_bytes)}) for {profile.model} at batch {profile.batch_size}; swapping out "
            f"every layer needs {need} bytes ({format_bytes(need)})",
            needed_bytes=need,
        )
