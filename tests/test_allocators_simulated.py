"""Allocators on the memory traces of simulated runs: every registered planner's schedules.

Random chains (``harness.testing.chains``) are planned by every registered planner
(keep-all among them) at budgets from the minimum to the peak, simulated, and the trace
of every feasible run is placed by every registered allocator: each placement must pass
the conformance checks, and best-fit (when its plugin is installed) never needs more
than the caching-allocator model.

The quick suite's models (ResNet-50, VGG-16 through the analytic profiler) are placed
too when that profiler is registered: best-fit never above the caching model, and within
2% of the max-live bytes on the traces without offloading (keep-all, inference). The
quick suite's own traces (suites/quick.yaml: ResNet-18, VGG-11, every planner and
budget) hold best-fit to issue #7's criterion: within 2% of max-live on every one.
"""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import HealthCheck, given, settings

from harness.allocators.caching import CachingAllocator
from harness.errors import InfeasibleBudget, UnknownPlugin
from harness.plugins import registry
from harness.simulate.executor import simulate
from harness.testing import budgets, chains
from harness.testing_allocators import check_placement_conforms, deterministic_variant

EXACT_MAX_BLOCKS = 14


def feasible_runs(profile, points=4):
    """(planner, budget, run) for every registered planner and budget that plans and simulates."""
    reg = registry()
    for name in reg.names("planner"):
        planner = reg.planner(name)
        for budget in budgets(profile, points):
            try:
                schedule = planner.plan(profile, budget)
            except InfeasibleBudget:
                continue
            run = simulate(schedule, profile)
            if run.feasible:
                yield name, budget, run


def allocators():
    """Every registered allocator, deterministic; ``exact`` only with OR-Tools (its extra)."""
    reg = registry()
    names = [n for n in reg.names("allocator") if n != "exact" or importlib.util.find_spec("ortools") is not None]
    return [deterministic_variant(reg.allocator(name)) for name in names]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profile=chains(max_stages=8))
def test_every_allocator_places_every_planners_trace(profile):
    caching = CachingAllocator()
    seen_keep_all = False
    for planner, budget, run in feasible_runs(profile):
        seen_keep_all |= planner == "keep-all"
        trace = run.trace
        arenas = {}
        for alloc in allocators():
            if alloc.name == "exact" and len(trace) > EXACT_MAX_BLOCKS:
                continue
            arenas[alloc.name] = check_placement_conforms(alloc, trace).arena_bytes
        if "bestfit" in arenas:
            assert arenas["bestfit"] <= caching.place(trace).arena_bytes
    assert seen_keep_all  # the peak budget always admits keep-all


QUICK_MODELS = ["torchvision:resnet50", "torchvision:vgg16"]


@pytest.fixture(scope="module", params=QUICK_MODELS)
def quick_model_runs(request):
    """(model, profile, [(planner, budget, run)]) at batch 32 on the V100 spec, 5 budgets."""
    from harness.protocols import Workload

    reg = registry()
    profiler = reg.profiler("analytic")  # a core built-in: missing, the test fails
    try:
        profile = profiler.profile(Workload(request.param, 32, (3, 224, 224), "V100-PCIe"))
    except UnknownPlugin as exc:
        pytest.skip(f"{request.param} is not available: {exc}")
    return request.param, profile, list(feasible_runs(profile, points=5))


def _bestfit():
    reg = registry()
    if "bestfit" not in reg.names("allocator"):
        pytest.skip("membudget-bestfit is not installed")
    return reg.allocator("bestfit")


@pytest.mark.slow
def test_quick_models_every_allocator_and_bestfit_vs_caching(quick_model_runs):
    """ResNet-50 and VGG-16 training traces of every planner at 5 budgets: every allocator is
    valid on each, and best-fit never needs more than the caching model.

    Measured (analytic V100 profiles, batch 32): best-fit <= caching on all 121 runs; the
    caching model needs 2-80% more than max-live (median 41% ResNet-50, 26% VGG-16).
    """
    model, _, runs = quick_model_runs
    bestfit, caching = _bestfit(), CachingAllocator()
    assert runs
    for planner, budget, run in runs:
        for alloc in allocators():
            if alloc.name == "exact":
                continue  # ~100 blocks: CP-SAT would only time out here
            check_placement_conforms(alloc, run.trace)
        b, c = bestfit.place(run.trace), caching.place(run.trace)
        assert b.arena_bytes <= c.arena_bytes, (model, planner, budget)


@pytest.mark.slow
def test_quick_models_bestfit_at_max_live_without_offloading(quick_model_runs):
    """keep-all training and the inference pass: best-fit within 2% of max-live (measured: exactly at it).

    The offloading planners' traces of these bigger models are not held to 2%: measured
    with the default squeaky-wheel rounds, 4 of 127 runs above 2% (worst 4.8%, ResNet-50
    dynprog); the paper's single pass (``paper_only``) up to 16.5%, 44 above 2%.
    """
    from harness.allocators.trace import inference_trace

    model, profile, runs = quick_model_runs
    bestfit = _bestfit()
    traces = [run.trace for planner, _, run in runs if planner == "keep-all"]
    assert traces, "keep-all should be feasible at the peak budget"
    traces.append(inference_trace(profile))
    for trace in traces:
        p = bestfit.place(trace)
        assert p.arena_bytes <= 1.02 * p.max_live_bytes, (model, p.fragmentation)


# --------------------------------------------------------------------------- the quick suite


@pytest.fixture(scope="module")
def quick_suite_traces():
    """The simulated traces of suites/quick.yaml (ResNet-18, VGG-11; every planner, 5 budgets)."""
    from pathlib import Path

    from harness.testing_allocators import suite_traces

    registry().profiler("analytic")  # a core built-in: missing, the test fails
    traces = suite_traces(Path(__file__).resolve().parents[1] / "suites" / "quick.yaml")
    assert traces, "the quick suite should have feasible runs"
    return traces


@pytest.mark.slow
def test_quick_suite_bestfit_within_2pct_of_max_live_and_below_caching(quick_suite_traces):
    """Issue #7: on the quick suite's DNN traces best-fit stays within 2% of max-live bytes
    and never needs more than the caching-allocator model; every placement is valid.

    Measured (96 traces, analytic V100 profiles): the default (squeaky-wheel rounds,
    ``membudget_bestfit.improve``) places all 96 at exactly max-live (worst ratio 1.0000);
    the paper's single pass (``paper_only=True``) up to 9.4% above it (VGG-11, greedy /
    dynprog / capacity at the minimum budget), 21 of 96 above 2%. The second half holds
    the extension to never being worse than the paper's pass.
    """
    bestfit, caching = _bestfit(), CachingAllocator()
    paper = type(bestfit)(paper_only=True)
    worst = 1.0
    for model, planner, budget, trace in quick_suite_traces:
        case = (model, planner, budget)
        p = check_placement_conforms(bestfit, trace)
        assert p.arena_bytes <= 1.02 * p.max_live_bytes, (case, p.fragmentation)
        assert p.arena_bytes <= caching.place(trace).arena_bytes, case
        assert p.arena_bytes <= paper.place(trace).arena_bytes, case
        worst = max(worst, p.arena_bytes / p.max_live_bytes)
    print(f"quick suite: {len(quick_suite_traces)} traces, worst best-fit / max-live {worst:.4f}")
