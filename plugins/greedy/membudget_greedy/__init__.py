"""GREEDY (papers/004 section 4.2) as a membudget plugin: planner ``greedy``."""

from harness import hookimpl

from membudget_greedy.planner import Greedy, greedy_amounts

__all__ = ["Greedy", "greedy_amounts"]


@hookimpl
def membudget_register_planners(register):
    """Register ``greedy``."""
    register(Greedy())
