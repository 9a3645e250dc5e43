"""Every vDNN++ planner against the planner conformance kit (harness.testing)."""

from __future__ import annotations

from harness.testing import PlannerConformance
from membudget_vdnnpp import planners

BY_NAME = {p.name: p for p in planners()}


class TestVdnnppAllConformance(PlannerConformance):
    planner = BY_NAME["vdnnpp-all"]


class TestVdnnppAllMemoryOptimalConformance(PlannerConformance):
    planner = BY_NAME["vdnnpp-all"]
    options = {"algorithms": "memory"}


class TestVdnnppConvConformance(PlannerConformance):
    planner = BY_NAME["vdnnpp-conv"]


class TestVdnnppDynConformance(PlannerConformance):
    planner = BY_NAME["vdnnpp-dyn"]


def test_registered_planners_are_the_documented_ones() -> None:
    from harness.plugins import registry

    entries = {e.name: e for e in registry(reload=True).entries("planner")}
    for name in ("vdnnpp-all", "vdnnpp-conv", "vdnnpp-dyn"):
        assert entries[name].plugin == "membudget-vdnnpp"
        assert entries[name].description
