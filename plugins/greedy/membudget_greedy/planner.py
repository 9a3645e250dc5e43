"""GREEDY: offload the first activations until M_peak - M bytes are out (papers/004 Theorem 2).

Theorem 2: in the fractional relaxation (an activation may be partly offloaded), the
no-wait, eager, ordered schedule that offloads exactly M_peak - M bytes is optimal.
GREEDY rounds it up for the integral problem: it offloads, entirely, the first k
activations, k the smallest index with sum_{i<=k} |x_i| >= M_peak - M (section 4.2).
"""

from __future__ import annotations

from harness.bounds import peak_memory
from harness.model import Profile, Schedule
from harness.schedules import best_ordered_schedule, check_budget, keep_all_schedule, offload_set_refusal


def greedy_amounts(profile: Profile, budget: int, fractional: bool = False) -> dict[int, int | None]:
    """Stage -> bytes to offload: the eager prefix that covers M_peak - M.

    Integral (GREEDY): whole activations (None = all saved bytes). Fractional (the
    relaxation of Theorem 2): the last one only in part, so exactly M_peak - M moves.
    """
    need = peak_memory(profile) - budget
    amounts: dict[int, int | None] = {}
    for i, stage in enumerate(profile.stages):
        if need <= 0:
            break
        if stage.saved_bytes == 0:
            continue
        if fractional and stage.saved_bytes > need:
            amounts[i] = int(need)
        else:
            amounts[i] = None
        need -= stage.saved_bytes
    return amounts


class Greedy:
    """GREEDY of Beaumont et al. (papers/004 section 4.2): eager, ordered, no-wait offloading.

    Option ``fractional=True`` plans the fractional relaxation instead (Theorem 2's optimum).
    """

    name = "greedy"
    description = "Offload the first activations until M_peak - M is out (Beaumont et al. 2020, Thm. 2)"

    def plan(self, profile: Profile, budget_bytes: int, fractional: bool = False, duplex: bool = False,
             **options) -> Schedule:
        """GREEDY's offload set (the first stages until M_peak - budget is out) as papers/004's
        ordered schedule with the fastest feasible prefetch window; ``duplex``: two copy engines."""
        check_budget(profile, budget_bytes, self.name)
        amounts = greedy_amounts(profile, budget_bytes, fractional)
        if not amounts:
            return keep_all_schedule(profile, budget_bytes, self.name)
        schedule = best_ordered_schedule(
            profile, budget_bytes, amounts, planner=self.name, duplex=duplex,
            options={"fractional": fractional} if fractional else {},
        )
        if schedule is None:  # only a partial offload can fail to fit; say so plainly
            raise offload_set_refusal(profile, budget_bytes, amounts, self.name, duplex)
        return schedule

