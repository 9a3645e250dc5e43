"""The plugin module the ``membudget`` entry point names: it registers the planner."""

from harness import hookimpl

from membudget_largest_first.planner import LargestFirst

__all__ = ["LargestFirst"]


@hookimpl
def membudget_register_planners(register):
    """Register the template's planner (rename it with the distribution)."""
    register(LargestFirst())
