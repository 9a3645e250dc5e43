"""The template planner through membudget's conformance kit, and its registration."""

from harness.plugins import registry
from harness.testing import PlannerConformance

from membudget_largest_first import LargestFirst


class TestLargestFirstConformance(PlannerConformance):
    """Random chains, every budget from the minimum to the peak: each schedule validated and
    simulated, never faster than papers/004's lower bound; refusals are ``InfeasibleBudget``
    with ``needed_bytes``."""

    planner = LargestFirst()
    reaches_min_memory = True  # its last set offloads everything, which fits from min_memory up


def test_registered_through_the_entry_point():
    entry = {e.name: e for e in registry(reload=True).entries("planner")}["largest-first"]
    assert entry.plugin == "membudget-largest-first"
