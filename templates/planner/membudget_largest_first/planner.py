"""LARGEST-FIRST: offload the biggest saved activations until M_peak - M bytes are out.

A template planner: it shows the helpers a planner is built from. ``check_budget``
refuses a budget no schedule fits (``InfeasibleBudget`` with ``needed_bytes``);
``peak_memory`` (harness.bounds) says how much must leave the device;
``best_ordered_schedule`` turns an offload set into papers/004's ordered no-wait
schedule, trying prefetch windows in the simulator; ``offload_set_refusal`` refuses with
what a set needs (just-in-time prefetches) when no order of it fits. Replace
``offload_order`` with your idea.
"""

from __future__ import annotations

from harness.bounds import peak_memory
from harness.model import Profile, Schedule
from harness.schedules import best_ordered_schedule, check_budget, keep_all_schedule, offload_set_refusal


def offload_order(profile: Profile) -> list[int]:
    """The stages worth offloading, best first: here the largest saved activations."""
    stages = [i for i, s in enumerate(profile.stages) if s.saved_bytes > 0]
    return sorted(stages, key=lambda i: (-profile.stages[i].saved_bytes, i))


class LargestFirst:
    """Offload the largest activations first, ordered and no-wait (papers/004 Prop. 1)."""

    name = "largest-first"
    description = "Offload the largest activations until M_peak - M is out (template planner)"
    extra_options = ()  # the options plan() reads from **options: none

    def plan(self, profile: Profile, budget_bytes: int, duplex: bool = False, **options) -> Schedule:
        """The fastest ordered schedule of the smallest largest-first set that fits."""
        check_budget(profile, budget_bytes, self.name)  # InfeasibleBudget below min_memory
        excess = peak_memory(profile) - budget_bytes
        if excess <= 0:
            return keep_all_schedule(profile, budget_bytes, self.name)
        order = offload_order(profile)
        chosen: list[int] = []
        out = 0
        for stage in order:
            chosen.append(stage)
            out += profile.stages[stage].saved_bytes
            if out < excess:
                continue  # not enough out yet: no schedule of this set can fit
            schedule = best_ordered_schedule(profile, budget_bytes, set(chosen), planner=self.name,
                                             duplex=duplex)
            if schedule is not None:
                return schedule
        # every set tried fails: say how many bytes offloading everything would need
        raise offload_set_refusal(profile, budget_bytes, set(order), self.name, duplex)
