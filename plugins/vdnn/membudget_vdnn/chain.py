"""VDNN for chains whose stages are not annotated (papers/004 section 6.1): planner ``vdnn-chain``.

Beaumont et al. cannot tell convolutions apart, so they rank the stages by u_F / |x_i|
(forward time per byte to move: a long computation hides its transfer best), and for
every threshold consider the no-wait ordered schedule offloading every stage whose ratio
is at least the threshold, and the one offloading every other of them (vDNN++'s "every
convolution or every other convolution"). VDNN outputs the best of these schedules.

|x_i| is the stage's saved bytes here, the unit offloading moves in this chain model;
stages with nothing saved have nothing to offload and are left out.
"""

from __future__ import annotations

from harness.errors import InfeasibleBudget
from harness.model import Profile, Schedule
from harness.schedules import check_budget, fastest_ordered_schedule, just_in_time_need
from harness.units import format_bytes


def candidate_sets(profile: Profile) -> list[tuple[int, ...]]:
    """The offload sets VDNN tries: per threshold, all stages at or above it, and every other one.

    The empty set (a threshold above every ratio) comes first; duplicates are dropped.
    """
    ratio = {i: s.fwd_time / s.saved_bytes for i, s in enumerate(profile.stages) if s.saved_bytes > 0}
    sets: list[tuple[int, ...]] = [()]
    for threshold in sorted(set(ratio.values()), reverse=True):
        chosen = tuple(i for i in sorted(ratio) if ratio[i] >= threshold)
        for candidate in (chosen, chosen[::2]):
            if candidate not in sets:
                sets.append(candidate)
    return sets


class VdnnChain:
    """VDNN of papers/004 section 6.1: the best ratio-threshold offload set, no-wait and ordered.

    Options: ``duplex`` (copy engines per direction).
    """

    name = "vdnn-chain"
    description = "VDNN for unannotated chains: best u_F/|x| threshold offload set (Beaumont et al. 2020, sec. 6.1)"

    def plan(self, profile: Profile, budget_bytes: int, duplex: bool = False, **options) -> Schedule:
        """The fastest feasible candidate schedule; ``InfeasibleBudget`` when none fits."""
        check_budget(profile, budget_bytes, self.name)
        best, best_time = None, float("inf")
        for offload in candidate_sets(profile):
            schedule, makespan = fastest_ordered_schedule(profile, budget_bytes, offload, planner=self.name,
                                                          duplex=duplex, options={"offload": list(offload)})
            if schedule is not None and makespan < best_time:
                best, best_time = schedule, makespan
        if best is None:
            need = min(just_in_time_need(profile, offload, duplex) for offload in candidate_sets(profile))
            raise InfeasibleBudget(
                f"infeasible: {self.name} found no feasible threshold offload set for {profile.model}; the "
                f"leanest needs {need} bytes ({format_bytes(need)}) with just-in-time prefetches, the budget is "
                f"{budget_bytes} bytes ({format_bytes(budget_bytes)})",
                needed_bytes=need,
            )
        return best
