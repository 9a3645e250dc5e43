"""The capacity-based swap strategy (OOC-PALEO, papers/002 section 3.5) as a membudget plugin: planner ``capacity``."""

from harness import hookimpl

from membudget_capacity.planner import Capacity, capacity_schedule, op_peaks, prefetch_issue_points

__all__ = ["Capacity", "capacity_schedule", "op_peaks", "prefetch_issue_points"]


@hookimpl
def membudget_register_planners(register):
    """Register the ``capacity`` planner."""
    register(Capacity())
