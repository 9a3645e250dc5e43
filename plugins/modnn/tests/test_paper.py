"""papers/000 section V on analytic profiles of its networks on a K40m: Figures 6, 7 and 8.

The set-up of section V: VGG-16, VGG-19 and ResNet-34 at batch 256, VGG-101 and an FCN
at batch 128, one K40m (12 GB), compared with vDNN (``best_static_vdnn``, no
sub-batching) and vDNN+ (with moDNN's sub-batch selection). Profiles come from the
analytic profiler (roofline times, exact sizes); the simulator judges every schedule.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from harness.bounds import peak_memory
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
    "roofline profiles do not reproduce Fig. 8 with eq. (3): their time is linear in the batch, so a "
    "smaller sub-batch costs nothing and vDNN+ (whose sub-batch shrinks until vDNN fits) beats moDNN's "
    "eq. (3) sub-batch (the largest that fits, so the least headroom) on VGG-16; on measured profiles, "
    "where small batches run less efficiently, eq. (3) does hold it: "
    "test_fig8_eq3_on_measured_h100_profiles"))
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


# --------------------------------------------------------------------------- Fig. 8 on measured profiles

MEASURED = Path(__file__).resolve().parents[3] / "results" / "profiles"
MEASURED_PROFILES = {  # torch profiler on an H100, with variants measured at smaller batches
    "vgg16": "vgg16-b256-h100-scaling.json",  # variants 1..192
    "resnet34": "resnet34-b128-h100-scaling.json",  # variants 1..96
}
# Budgets as fractions of [M_min, keep-all peak]. The paper's Fig. 8 budgets for VGG-16 (2, 4, 8
# and 12 GB on a K40m at batch 256) are 0.05, 0.17, 0.40 and 0.63 of that span on the analytic
# K40m profile (M_min 1.07 GiB, keep-all peak 18.6 GiB); the measured H100 VGG-16 profile has
# nearly the same span (1.10 to 19.6 GiB), so these are the paper's budgets carried over. 0.25 and
# 0.5 are where eq. (3)'s sub-batch (64 and 128) only just fits keep-all, the tightest case for
# Algorithm 1's linked list; the span is the range where moDNN has something to schedule.
FIG8_FRACTIONS = (0.05, 0.17, 0.25, 0.40, 0.50, 0.63)


@functools.cache
def _measured(key: str):
    """The measured profile (``Profile.at_batch`` gives every pass the main profile's host link)."""
    from harness.model import Profile, load

    path = MEASURED / MEASURED_PROFILES[key]
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    return load(Profile, path)


def _budget(profile, fraction: float) -> int:
    low, high = m_min(profile), peak_memory(profile)
    return int(low + fraction * (high - low))


# resnet34 at 0.40 (sub-batch 128, one pass) once deadlocked in the simulator and fell back to
# offload-all (186.6 ms against vDNN+'s 157.1): Algorithm 1 decided the prefetches of stages 8, 7
# and 6 at F10, long before the busy copy engine could take them, and its tasks did not wait for
# the offloads that made their room. Both are fixed in membudget_modnn.scheduler
# (Algorithm1.should_start_now, Algorithm1.offload); each fix alone is not enough here (without
# the first, the plan runs but takes 161.5 ms).
FIG8_MEASURED_CASES = [(key, f) for key in MEASURED_PROFILES for f in FIG8_FRACTIONS]


@pytest.mark.parametrize("key,fraction", FIG8_MEASURED_CASES)
def test_fig8_eq3_on_measured_h100_profiles(key: str, fraction: float) -> None:
    """Fig. 8 with the paper's eq. (3) on measured profiles: moDNN <= vDNN+ <= vDNN (where vDNN fits).

    On a real GPU small batches run less efficiently (VGG-16 on the H100: 6.3 ms a sample at
    batch 1, 1.2 at 16, 0.79 at 256), which is what eq. (3)'s "large enough to fully utilize the
    GPU resources" (IV.A) counts on; ``Profile.at_batch`` interpolates between the measured
    batches. Wall-clock against wall-clock, every moDNN schedule checked by the validator.
    """
    profile = _measured(key)
    budget = _budget(profile, fraction)
    schedule = MoDNN().plan(profile, budget)  # sub_batch="eq3", the paper's rule
    assert not schedule.options.get("fallback"), schedule.notes
    assert not validate(schedule, profile, budget)
    modnn = _run(schedule, profile)
    plus_schedule = VDNNPlus().plan(profile, budget)
    plus = _run(plus_schedule, profile)
    assert modnn.makespan <= plus.makespan * (1 + 1e-9), (key, fraction, modnn.makespan, plus.makespan)
    vdnn = best_static_vdnn(profile, budget)
    if vdnn is not None:
        assert plus.makespan <= _run(vdnn, profile).makespan * (1 + 1e-9), (key, fraction)
    # the sub-batch is eq. (3)'s: no more passes than vDNN+ needs
    assert schedule.sub_batches <= plus_schedule.sub_batches


def test_measured_profiles_make_small_sub_batches_slower() -> None:
    """The premise of the measured Fig. 8: per-sample time falls with the batch (IV.A), so the
    batch split into more passes computes longer, which roofline profiles do not show."""
    profile = _measured("vgg16")
    passes = [1, 2, 4, 16, 64]
    compute = [profile.at_batch(profile.batch_size // n).compute_time * n for n in passes]
    assert all(a < b for a, b in zip(compute, compute[1:])), compute
