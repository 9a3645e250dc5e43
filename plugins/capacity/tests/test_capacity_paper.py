"""The capacity-based strategy against the vDNN-like one (papers/002 sections 3.4-3.5, Figures 3-4).

The vDNN-like strategy (section 3.4) swaps every layer out during the forward pass and
swaps layer l-1 in while layer l computes, layer l waiting for both: that is vDNN_all
(``vdnn-all``, default algorithms). Figure 4's claim: where the GPU has room to keep the
last layers, the capacity-based schedule saves the time wasted waiting for the last
swap-out (and its swap back in) and swaps in much earlier, so it is faster.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from harness.bounds import min_memory, peak_memory
from harness.errors import InfeasibleBudget
from harness.model import Profile, Stage, training_ops
from harness.schedules import keep_all_schedule, op_index
from harness.simulate.executor import simulate
from harness.simulate.lowering import lower
from harness.testing import budgets, chains
from membudget_capacity import Capacity, op_peaks

membudget_vdnn = pytest.importorskip("membudget_vdnn", reason="the vDNN-like strategy is membudget-vdnn's vdnn-all")
from membudget_vdnn import shapes, synchronous, offload_set  # noqa: E402

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
VDNN_ALL = {p.name: p for p in membudget_vdnn.planners()}["vdnn-all"]
MB = 10**6


def vdnn_like(profile: Profile, budget: int):
    """papers/002 section 3.4's schedule: vDNN_all with the profile's algorithms, even where all fits."""
    return VDNN_ALL.plan(profile, budget, always=True, algorithms="default")


def vdnn_like_need(profile: Profile) -> int:
    return synchronous(profile, 10**18, offload_set(profile, "all"), (), planner="probe").needed


def figure_4_chain() -> Profile:
    """Four equal layers (1 ms forward, 2 ms backward, 10 MB each) and a slow link: 4 ms per copy."""
    layers = tuple(Stage(f"conv{i}", "conv", 1e-3, 2e-3, 10 * MB, 10 * MB, 10 * MB) for i in range(4))
    return Profile("figure-4", 1, (1,), "toy", 10**9, 2.5e9, 2.5e9, 0, 10 * MB, layers)


def test_figure_4_stops_swapping_out_once_the_rest_fits() -> None:
    """With room for two of the four layers, layers 1-2 go out and 3-4 stay ("stop the swap-out from layer 3")."""
    profile = figure_4_chain()
    budget = 50 * MB
    schedule = Capacity().plan(profile, budget)
    assert schedule.offloaded_stages == (0, 1)
    where = op_index(schedule.ops)
    issue = {t.stage: t.issue_op for t in schedule.transfers if t.direction == "prefetch"}
    # swap-in as early as capacity allows: layer 1 comes back while layer 3 is processed, not while layer 2 is
    assert issue[0] < where[("B", 1, 0)], "vDNN-like issues it only when B1 starts"
    ours, theirs = simulate(schedule, profile), simulate(vdnn_like(profile, budget), profile)
    assert ours.feasible and theirs.feasible and ours.peak_bytes <= budget
    assert ours.makespan < theirs.makespan
    # the vDNN-like run waits for the last layer to go out and come back before the backward pass
    events = {e.label: e for e in theirs.timeline}
    assert events["B3"].start >= events["prefetch 3"].end >= events["offload 3"].end


def test_figure_4_backward_starts_as_soon_as_the_forward_ends() -> None:
    """"When the backward phase starts, the data needed still remains in the GPU memory" (section 3.5)."""
    profile = figure_4_chain()
    run = simulate(Capacity().plan(profile, 60 * MB), profile)
    events = {e.label: e for e in run.timeline}
    assert events["B3"].start == events["F3"].end


@SETTINGS
@given(profile=chains())
def test_capacity_is_never_slower_than_the_vdnn_like_strategy(profile: Profile) -> None:
    """Wherever the vDNN-like strategy fits a budget, the capacity-based one fits it too and is no slower."""
    for budget in budgets(profile, 6):
        try:
            theirs = vdnn_like(profile, budget)
        except InfeasibleBudget:
            continue
        ours = Capacity().plan(profile, budget)
        assert simulate(ours, profile).makespan <= simulate(theirs, profile).makespan * (1 + 1e-9) + 1e-15


@SETTINGS
@given(profile=chains())
def test_capacity_swaps_out_the_shortest_prefix_that_lets_the_rest_fit(profile: Profile) -> None:
    """Section 3.5: the swap-out stops at the first layer from which the rest fits (a static estimate)."""
    low = lower(keep_all_schedule(profile, 0), profile)
    where = op_index(training_ops(profile.n_stages))
    with_data = [i for i, s in enumerate(profile.stages) if s.saved_bytes > 0]
    for budget in budgets(profile, 5):
        offloaded = list(Capacity().plan(profile, budget).offloaded_stages)
        assert offloaded == with_data[:len(offloaded)], "a prefix of the layers"
        if offloaded:
            shorter = offloaded[:-1]
            just_in_time = {i: where[("B", i, 0)] for i in shorter}
            assert op_peaks(low, set(shorter), just_in_time).max() > budget, "a shorter prefix would have fitted"
        else:
            assert peak_memory(profile) <= budget


SHAPES = [shapes.alexnet(128), shapes.vgg16(16), shapes.nin(128), shapes.resnet(50, 8, 500)]


@pytest.mark.parametrize("profile", SHAPES, ids=lambda p: f"{p.model}({p.batch_size})")
def test_capacity_beats_vdnn_like_where_memory_allows_on_synthetic_networks(profile: Profile) -> None:
    """Figure 4's setting on the papers' networks: budgets from the vDNN-like need up to M_peak."""
    lo, hi = vdnn_like_need(profile), peak_memory(profile)
    assert min_memory(profile) <= lo < hi
    for f in (0.0, 0.25, 0.5, 0.75, 1.0):
        budget = int(lo + f * (hi - lo))
        ours, theirs = simulate(Capacity().plan(profile, budget), profile), simulate(vdnn_like(profile, budget), profile)
        assert ours.makespan < theirs.makespan, (f, ours.makespan, theirs.makespan)


@pytest.mark.slow
@pytest.mark.parametrize("model, batch, device", [("torchvision:alexnet", 128, "GTX-970"),
                                                  ("torchvision:vgg16", 16, "GTX-970"),
                                                  ("torchvision:resnet50", 32, "V100-PCIe")])
def test_capacity_beats_vdnn_like_where_memory_allows_on_analytic_profiles(analytic, model, batch, device) -> None:
    profile = analytic(model, batch, device)
    test_capacity_beats_vdnn_like_where_memory_allows_on_synthetic_networks(profile)
