"""The capacity-based planner against the planner conformance kit (harness.testing), and its memory estimate."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from harness.bounds import min_memory, peak_memory
from harness.model import training_ops
from harness.schedules import keep_all_schedule, op_index
from harness.simulate.lowering import lower
from harness.testing import PlannerConformance, chains
from membudget_capacity import Capacity, op_peaks


class TestCapacityConformance(PlannerConformance):
    planner = Capacity()
    reaches_min_memory = True  # swapping every layer out, each back just in time, runs at the minimum


def test_registered_through_its_entry_point() -> None:
    from harness.plugins import registry

    entry = {e.name: e for e in registry(reload=True).entries("planner")}["capacity"]
    assert entry.plugin == "membudget-capacity"


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(profile=chains())
def test_static_memory_estimate_agrees_with_the_simulated_bounds(profile) -> None:
    """The estimate the planner stops the swap-out by (section 3.5) is the simulator's memory model:
    nothing offloaded gives M_peak, everything offloaded and brought back just in time min_memory."""
    low = lower(keep_all_schedule(profile, 0), profile)
    where = op_index(training_ops(profile.n_stages))
    assert op_peaks(low, set(), {}).max() == peak_memory(profile)
    every = [i for i, s in enumerate(profile.stages) if s.saved_bytes > 0]
    assert op_peaks(low, set(every), {i: where[("B", i, 0)] for i in every}).max() == min_memory(profile)
