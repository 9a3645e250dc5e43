"""DYNPROG (papers/004 section 5) as a membudget plugin: planner ``dynprog``."""

from harness import hookimpl

from membudget_dynprog.planner import (
    CurvePoint, Discretised, Dynprog, Plan, Solution, discretise, plan_offload, solve, tradeoff_curve,
)

__all__ = [
    "CurvePoint", "Discretised", "Dynprog", "Plan", "Solution", "discretise", "plan_offload", "solve",
    "tradeoff_curve",
]


@hookimpl
def membudget_register_planners(register):
    """Register the ``dynprog`` planner."""
    register(Dynprog())
