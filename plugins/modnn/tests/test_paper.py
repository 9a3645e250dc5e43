"""papers/000 section V on analytic profiles of its networks on a K40m: Figures 6, 7 and 8.

The set-up of section V: VGG-16, VGG-19 and ResNet-34 at batch 256, VGG-101 and an FCN
at batch 128, one K40m (12 GB), compared with vDNN (``best_static_vdnn``, no
sub-batching) and vDNN+ (with moDNN's sub-batch selection). Profiles come from the
analytic profiler (roofline times, exact sizes); the simulator judges every schedule.
"""

from __future__ import annotations

import pytest

from harness.simulate.executor import simulate
from harness.validate import validate
from membudget_modnn import MoDNN, VDNNPlus, ideal_memory, m_min
from membudget_modnn.planner import best_static_vdnn

pytestmark = pytest.mark.slow

GiB = 2**30
NETWORKS = {
    "vgg16": ("torchvision:vgg16", 256),
    "vgg19": ("torchvision:vgg19", 256),
    "resnet34": ("torchvision:resnet34", 256),
    "vgg101": ("modnn:vgg101", 128),
    "fcn": ("modnn:fcn32s", 128),
}
VGG_FAMILY = ("vgg16", "vgg19", "vgg101")


@pytest.fixture(scope="module")
def profiles():
    """Analytic profiles of the five networks on the K40m spec (skipped without the profiler)."""
    pytest.importorskip("torch")
    from harness.plugins import registry
    from harness.protocols import Workload

    try:
        profiler = registry().profiler("analytic")
    except Exception as exc:  # the profiler is a core built-in; say why when it is missing
        pytest.skip(f"the analytic profiler is not available: {exc}")
    return {key: profiler.profile(Workload(model, batch, (3, 224, 224), "K40m"))
            for key, (model, batch) in NETWORKS.items()}


def _run(schedule, profile):
    run = simulate(schedule, profile, with_trace=False)
    assert run.feasible, run.message
    return run


def _plan(planner, profile, budget, **options):
    from harness.errors import InfeasibleBudget

    try:
        return planner.plan(profile, budget, **options)
    except InfeasibleBudget:
        return None


def test_fig6_m_min_is_about_50x_below_the_ideal_case(profiles) -> None:
    """Fig. 6: "Compared with the ideal case, the lower bound is reduced by 50x on average";
    every network needs more than 12 GB in the ideal case; VGG-101 "nearly 100GB"."""
    ratios = {key: ideal_memory(p) / m_min(p) for key, p in profiles.items()}
    assert all(ideal_memory(p) > 12 * GiB for p in profiles.values())
    assert 40 <= sum(ratios.values()) / len(ratios) <= 65, ratios
    assert all(r >= 25 for r in ratios.values()), ratios
    assert 80e9 <= ideal_memory(profiles["vgg101"]) <= 120e9
    assert m_min(profiles["vgg101"]) < 4 * GiB  # "can easily fit into almost all low-end GPUs"


def test_fig7_at_12gb_moDNN_fits_everything_moves_less_and_loses_little(profiles) -> None:
    """Fig. 7 at 12 GB: moDNN trains all five (the paper: 8% average loss vs the ideal case)
    and moves less data than vDNN+ for the VGG family (Fig. 7b; vDNN itself does not fit
    VGG-16/19 at 12 GB in this memory model)."""
    budget = 12 * GiB
    losses = []
    for key, profile in profiles.items():
        schedule = MoDNN().plan(profile, budget)
        assert not schedule.options.get("fallback")
        if schedule.sub_batches * profile.n_stages <= 400:  # the reference simulator is quadratic
            assert not validate(schedule, profile, budget)
        run = _run(schedule, profile)
        losses.append(run.makespan / profile.compute_time - 1)
        if key in VGG_FAMILY:
            plus = _run(VDNNPlus().plan(profile, budget), profile)
            assert run.moved_bytes < plus.moved_bytes, (key, run.moved_bytes, plus.moved_bytes)
    assert sum(losses) / len(losses) <= 0.08, losses


FIG8_BUDGETS_GIB = (2, 4, 8, 12)
FIG8_NETWORKS = ("vgg16", "vgg19", "resnet34", "fcn")


def test_fig8_vdnn_plus_is_not_slower_than_vdnn(profiles) -> None:
    """Fig. 8: sub-batch selection benefits vDNN; vDNN fails below some budget, vDNN+ does not."""
    failed = 0
    for key in FIG8_NETWORKS:
        profile = profiles[key]
        for gib in FIG8_BUDGETS_GIB:
            budget = gib * GiB
            plus = _run(VDNNPlus().plan(profile, budget), profile)
            vdnn = best_static_vdnn(profile, budget)
            if vdnn is None:
                failed += 1
                continue
            assert plus.makespan <= _run(vdnn, profile).makespan * (1 + 1e-9), (key, gib)
    assert failed  # vDNN fails at the small budgets


def _overhead(run) -> float:
    """Makespan over the schedule's own compute time (its passes' sum): the cost of its transfers."""
    return run.makespan / run.compute_time


def test_fig8_moDNN_schedules_are_not_slower_than_vdnn_plus(profiles) -> None:
    """Fig. 8: "moDNN is always better than both vDNN and vDNN+ ... due to our new data transfer
    scheduling and CONV algorithm selection".

    Checked with the sub-batch search (``sub_batch="search"``), on the overhead over each
    schedule's own compute: n passes of ceil(B/n) samples compute up to n - 1 samples
    more than the batch (``harness.simulate.lowering.stage_profile``), which is the
    core's accounting, not a scheduling cost.
    """
    for key in FIG8_NETWORKS:
        profile = profiles[key]
        for gib in FIG8_BUDGETS_GIB:
            budget = gib * GiB
            modnn = _run(MoDNN().plan(profile, budget, sub_batch="search"), profile)
            plus = _run(VDNNPlus().plan(profile, budget), profile)
            assert _overhead(modnn) <= _overhead(plus) * (1 + 1e-9), (key, gib, modnn.makespan, plus.makespan)


@pytest.mark.xfail(strict=True, reason=(
    "eq. (3) takes the largest sub-batch whose heaviest task fits with its fastest algorithm, which "
    "leaves the least headroom; on roofline profiles a smaller sub-batch costs nothing, so vDNN+ (whose "
    "sub-batch shrinks until vDNN fits) beats moDNN on VGG-16 at 2, 4 and 12 GiB"))
def test_fig8_eq3_moDNN_is_not_slower_than_vdnn_plus_on_vgg16(profiles) -> None:
    """Fig. 8 with the paper's own sub-batch rule (eq. 3), wall-clock against wall-clock."""
    profile = profiles["vgg16"]
    for gib in FIG8_BUDGETS_GIB:
        budget = gib * GiB
        modnn = _run(MoDNN().plan(profile, budget), profile)
        plus = _run(VDNNPlus().plan(profile, budget), profile)
        assert modnn.makespan <= plus.makespan * (1 + 1e-9), gib


def test_fig8_moDNN_fits_every_budget_down_to_m_min(profiles) -> None:
    """Fig. 8 / section V.B: moDNN "can fit any user-specified memory budget ... not smaller than the
    theoretical lower bound"; vDNN cannot."""
    profile = profiles["vgg16"]
    budget = m_min(profile)
    schedule = MoDNN().plan(profile, budget)
    assert schedule.sub_batches == profile.batch_size
    assert simulate(schedule, profile, with_trace=False).peak_bytes <= budget
    assert best_static_vdnn(profile, budget) is None
    assert _plan(MoDNN(), profile, budget - 1) is None
