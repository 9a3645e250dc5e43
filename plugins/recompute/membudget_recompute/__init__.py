"""Optimal checkpointing by segments as a membudget plugin: planner ``recompute``.

The public API (``plan_segments`` for planners that build on it, e.g. a hybrid of
offloading and recomputation): see ``membudget_recompute.planner``.
"""

from harness import hookimpl

from membudget_recompute.planner import (
    DEFAULT_SLOTS, Discretised, Recompute, SegmentPlan, Tables, discretise, peak_of, plan, plan_segments,
    recompute_time, segment_tables, solve,
)

__all__ = [
    "DEFAULT_SLOTS", "Discretised", "Recompute", "SegmentPlan", "Tables", "discretise", "peak_of", "plan",
    "plan_segments", "recompute_time", "segment_tables", "solve",
]


@hookimpl
def membudget_register_planners(register):
    """Register the ``recompute`` planner."""
    register(Recompute())
