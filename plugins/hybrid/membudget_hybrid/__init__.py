"""HYBRID (keep, offload or recompute per stage; Beaumont et al., NeurIPS 2021) as a membudget plugin."""

from harness import hookimpl

from membudget_hybrid.planner import (
    Decisions, Hybrid, HybridTable, Plan, discretise_hybrid, plan_hybrid, recompute_schedule, solve_hybrid,
)

__all__ = ["Decisions", "Hybrid", "HybridTable", "Plan", "discretise_hybrid", "plan_hybrid",
           "recompute_schedule", "solve_hybrid"]


@hookimpl
def membudget_register_planners(register):
    """Register the ``hybrid`` planner."""
    register(Hybrid())
