"""The ``keep-all`` planner: no offloading, the baseline every strategy is compared with."""

from __future__ import annotations

from harness.errors import InfeasibleBudget
from harness.model import Profile, Schedule
from harness.schedules import keep_all_schedule
from harness.units import format_bytes


class KeepAll:
    """Keep every activation on the device: feasible only when the budget covers M_peak."""

    name = "keep-all"
    description = "No offloading (feasible only at or above the peak memory)"

    extra_options = ()  # none: a misspelt option is an error

    def plan(self, profile: Profile, budget_bytes: int, **options) -> Schedule:
        """The keep-all schedule, or ``InfeasibleBudget`` (``needed_bytes`` the peak) below the peak."""
        from harness.bounds import peak_memory

        peak = peak_memory(profile)
        if budget_bytes < peak:
            raise InfeasibleBudget(
                f"infeasible: keep-all needs at least {peak} bytes ({format_bytes(peak)}), the peak; "
                f"the budget is {budget_bytes} bytes ({format_bytes(budget_bytes)})",
                needed_bytes=peak,
            )
        return keep_all_schedule(profile, budget_bytes)
