"""Every vDNN planner against the planner conformance kit (harness.testing)."""

from __future__ import annotations

from harness.testing import PlannerConformance
from membudget_vdnn import DynamicVdnn, StaticVdnn, VdnnChain, planners

BY_NAME = {p.name: p for p in planners()}


class TestVdnnAllConformance(PlannerConformance):
    planner = BY_NAME["vdnn-all"]


class TestVdnnAllMemoryOptimalConformance(PlannerConformance):
    planner = BY_NAME["vdnn-all"]
    options = {"algorithms": "memory"}


class TestVdnnConvConformance(PlannerConformance):
    planner = BY_NAME["vdnn-conv"]


class TestVdnnDynConformance(PlannerConformance):
    planner = BY_NAME["vdnn-dyn"]


class TestVdnnChainConformance(PlannerConformance):
    planner = BY_NAME["vdnn-chain"]
    reaches_min_memory = True  # its lowest threshold offloads everything, as GREEDY does at the minimum


def test_registered_planners_are_the_documented_ones() -> None:
    from harness.plugins import registry

    entries = {e.name: e for e in registry(reload=True).entries("planner")}
    for name in ("vdnn-all", "vdnn-conv", "vdnn-dyn", "vdnn-chain"):
        assert entries[name].plugin == "membudget-vdnn"
        assert entries[name].description
    assert isinstance(BY_NAME["vdnn-all"], StaticVdnn)
    assert isinstance(BY_NAME["vdnn-dyn"], DynamicVdnn)
    assert isinstance(BY_NAME["vdnn-chain"], VdnnChain)
