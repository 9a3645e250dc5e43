"""papers/000 section V on analytic profiles of its networks on a K40m: Figures 6, 7 and 8.

The set-up of section V: VGG-16, VGG-19 and ResNet-34 at batch 256, VGG-101 and an FCN
at batch 128, one K40m (12 GB), compared with vDNN (``best_static_vdnn``, no
sub-batching) and vDNN+ (with moDNN's sub-batch selection). Profiles come from the
analytic profiler (roofline times, exact sizes); the simulator judges every schedule.
"""

from __future__ import annotations

import functools
import itertools
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

    profiler = registry().profiler("analytic")  # a core built-in: missing, the test fails
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
    every network needs more than 12 GB in the ideal case, the three VGGs more than 24 GB;
    VGG-101 "requires nearly 100GB by the ideal case, the lower bound of moDNN is only 1.4GB"
    (a ratio of about 71).

    Our VGG-101 (the paper gives no layer count) needs about 1.5x the paper's sizes in both
    figures (149 GB and 2.1 GB), so its ratio is checked, not its gigabytes."""
    ratios = {key: ideal_memory(p) / m_min(p) for key, p in profiles.items()}
    assert all(ideal_memory(p) > 12 * GiB for p in profiles.values())
    assert all(ideal_memory(profiles[key]) > 24 * GiB for key in VGG_FAMILY)
    assert 40 <= sum(ratios.values()) / len(ratios) <= 65, ratios
    assert all(r >= 25 for r in ratios.values()), ratios
    assert 100 / 1.4 * 0.75 <= ratios["vgg101"] <= 100 / 1.4 * 1.25, ratios
    assert m_min(profiles["vgg101"]) < 4 * GiB  # "can easily fit into almost all low-end GPUs"


def test_fig7_at_12gb_moDNN_fits_everything_moves_less_and_loses_little(profiles) -> None:
    """Fig. 7 at 12 GB: moDNN trains all five (the paper: 8% average loss vs the ideal case)
    and moves no more data than vDNN+, less for the VGG family, and less than vDNN where vDNN
    fits (Fig. 7b; vDNN does not fit VGG-16/19 at 12 GB in this memory model)."""
    budget = 12 * GiB
    losses, fitted = [], 0
    for key, profile in profiles.items():
        schedule = MoDNN().plan(profile, budget)
        assert not schedule.options.get("fallback")
        if schedule.sub_batches * profile.n_stages <= 400:  # the reference simulator is quadratic
            assert not validate(schedule, profile, budget)
        run = _run(schedule, profile)
        losses.append(run.makespan / profile.compute_time - 1)
        plus = _run(VDNNPlus().plan(profile, budget), profile)
        assert run.moved_bytes <= plus.moved_bytes, (key, run.moved_bytes, plus.moved_bytes)
        if key in VGG_FAMILY:
            assert run.moved_bytes < plus.moved_bytes, (key, run.moved_bytes, plus.moved_bytes)
        vdnn = best_static_vdnn(profile, budget)
        if vdnn is not None:
            fitted += 1
            assert run.moved_bytes < _run(vdnn, profile).moved_bytes, key
    assert fitted >= 2
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


# Fig. 8 with eq. (3) on the analytic VGG profiles, with B_i holding the part of x_{i+1} it needs
# (Stage.output_saved_bytes: for VGG, x_1 and x_2 are held whole until B_0 and B_1 end). Loss vs
# the ideal case, moDNN eq. (3) against vDNN+ (sub-batch x passes):
#             2 GiB                   4 GiB              8 GiB               12 GiB
#   VGG-16  +2.15% vs +28.2% (20x13)  +0.00% vs +0.08%   +2.04% vs +0.08%    +0.00% vs +0.08% (128x2)
#   VGG-19  +1.62% vs +0.06% (19x14)  +0.00% vs +0.06%   +0.00% vs +0.06%    +0.00% vs +0.06% (128x2)
# (4 GiB: 52x5 both, 8 GiB: 128x2 both). vDNN+'s 28% on VGG-16 at 2 GiB is in its own compute
# time (its stalls add 8 ms), not in waiting. At 12 GiB moDNN's passes fit whole (nothing moves).
# moDNN's loss at VGG-16 2/8 GiB and VGG-19 2 GiB is one stall per pass, before B_1 (conv1_2's
# backward): the prefetch of x_1 (stage 1's saved data) is issued only at B_2's start (B_2, the
# first pooling's backward, is short) - test_fig8_eq3_vgg_loss_is_the_late_stage1_prefetch. At
# B_3's start Algorithm 1 wants it (line 16 fits, eq. 4 says start now) but the linked list has
# no contiguous hole of x_1's size and lines 20-25 find no scheme ("else Break"); the free bytes
# would hold it (fragmentation only) except for VGG-16 at 2 GiB, where they fall short by a hair.
# vDNN+ is judged by the byte-counting simulator, which charges nothing for fragmentation.
# Placement inside the list is not the paper's (it cites an OS textbook, [23]):
# membudget_modnn._kernels.ll_alloc's best fit (long-lived data at a hole's low end, short-lived
# at its high end) is ours. With short-lived data at the high end of the highest hole instead
# (not best fit), VGG-16 at 4 GiB and VGG-19 at 4 and 8 GiB lost +2.04%/+1.62%: the gradients
# cut the large hole the offloads of x_1 and x_2 leave, and x_1's prefetch came late.


@pytest.mark.parametrize("key,gib", [(k, g) for k in FIG8_NETWORKS for g in FIG8_BUDGETS_GIB],
                         ids=lambda v: v if isinstance(v, str) else f"{v}GiB")
def test_fig8_eq3_moDNN_is_not_slower_than_vdnn_plus(profiles, key: str, gib: int) -> None:
    """Fig. 8 with the paper's own sub-batch rule (eq. 3), wall-clock against wall-clock."""
    profile = profiles[key]
    assert any(s.output_saved_bytes for s in profile.stages)  # the held x_{i+1} is in the model
    budget = gib * GiB
    schedule = MoDNN().plan(profile, budget)
    if schedule.sub_batches * profile.n_stages <= 400:  # the reference simulator is quadratic
        assert not validate(schedule, profile, budget)
    modnn = _run(schedule, profile)
    plus = _run(VDNNPlus().plan(profile, budget), profile)
    assert modnn.makespan <= plus.makespan * (1 + 1e-9), (key, gib, modnn.makespan, plus.makespan)


def _compute_stalls(run) -> list[tuple[str, float]]:
    """(operation, idle time before it) for every gap on the compute stream."""
    ops = [e for e in run.timeline if e.stream == "compute"]
    return [(b.label, b.start - a.end) for a, b in itertools.pairwise(ops) if b.start - a.end > 1e-9]


def _at_task(algorithm, task: int, probe) -> list:
    """Run Algorithm 1, calling ``probe(algorithm, start, finish)`` when lines 15-27 run for ``task``."""
    seen = []
    ahead = algorithm.prefetch_ahead

    def wrapped(k, start, finish):
        if k == task:
            seen.append(probe(algorithm, start, finish))
        return ahead(k, start, finish)

    algorithm.prefetch_ahead = wrapped
    plan = algorithm.run()
    return plan, seen


@pytest.mark.parametrize("key", ["vgg16", "vgg19"])
def test_fig8_eq3_vgg_prefetches_x1_in_time(profiles, key: str) -> None:
    """Why moDNN loses next to nothing on the analytic VGG profiles (eq. 3's sub-batch).

    x_1's prefetch, the largest of the last ones, is issued at B_3's start wherever x_1 is
    offloaded: the linked list has a contiguous hole of its size there and line 16 and
    eq. (4) both say prefetch now. No backward operation but B_0 ever waits (for the
    image, x_0: 0.75 ms a pass at VGG-16 2 GiB, +0.1%, where vDNN+ loses 28%).

    Until the profiler counted the gradient an in-place ReLU's backward creates (ex^B of
    every conv + ReLU stage, ``harness.profilers.allocations``), eq. (3) chose other
    sub-batches, and at VGG-16 2 and 8 GiB and VGG-19 2 GiB the hole was missing: x_1's
    prefetch came at B_2 and B_1 stalled in every pass (+2.04% and +1.62% against vDNN+).
    """
    from membudget_modnn.scheduler import Algorithm1
    from membudget_modnn.subbatch import select_sub_batch

    profile = profiles[key]
    offloaded_x1 = 0
    for gib in FIG8_BUDGETS_GIB:
        budget = gib * GiB
        run = simulate(MoDNN().plan(profile, budget), profile)
        stalls = _compute_stalls(run)
        assert {label.split("/")[0] for label, _ in stalls} <= {"B0"}, (gib, stalls)
        assert sum(d for _, d in stalls) < 0.002 * run.makespan, (gib, stalls)
        # how it happens, in Algorithm 1 on eq. (3)'s sub-batch
        sb = select_sub_batch(profile, budget, "modnn")
        n = sb.profile.n_stages
        b3 = 2 * n - 4  # operation index of B_3

        def probe(a, start, finish):
            s = 2 * n - 2  # B_1
            waiting = a.latest_starts(b3, finish)  # the tasks with data still to prefetch
            if s not in waiting:
                return None
            return (a.fits(b3, s, extra=1), a.should_start_now(s, start, finish, waiting[s][1]),
                    a.mem.largest_free(), a.saved[1])

        plan, seen = _at_task(Algorithm1(sb.profile, budget), b3, probe)
        pre = [c for c in plan.copies if c.stage == 1 and c.prefetch]
        if pre and seen[0] is not None:
            offloaded_x1 += 1
            fits, due, hole, x1 = seen[0]
            assert fits and due and hole >= x1, (gib, seen)
            assert [c.issue_op for c in pre] == [b3], (gib, pre)
    assert offloaded_x1  # the early prefetch of x_1 happened at some budget


def test_vgg101_at_4gib_loses_to_vdnn_plus_for_lack_of_headroom(profiles) -> None:
    """Where "moDNN is always better than vDNN+" fails in suites/modnn-k40.yaml: VGG-101 at 4 GiB
    (moDNN +2.7% against the ideal case, vDNN+ +0.01%).

    Eq. (3) takes sub-batch 32 (4 passes), which leaves less free memory beside the heaviest
    task (a B_i with the fastest algorithm) than one saved block of the high-resolution stages:
    no prefetch can overlap those B_i (line 16 breaks, rightly), so B_10..B_1 each wait one
    transfer in every pass. vDNN+ needs 5 passes to fit; moDNN with more passes
    (``sub_batch="search"``, our option, not the paper's) loses nothing."""
    from membudget_modnn.subbatch import max_task_bytes, select_sub_batch

    profile, budget = profiles["vgg101"], 4 * GiB
    eq3 = MoDNN().plan(profile, budget)
    plus = _run(VDNNPlus().plan(profile, budget), profile)
    assert _run(eq3, profile).makespan > 1.02 * plus.makespan
    sb = select_sub_batch(profile, budget, "modnn")
    headroom = budget - profile.weight_bytes - max_task_bytes(sb.profile, fastest=True)
    assert 0 <= headroom < max(s.saved_bytes for s in sb.profile.stages[1:12])
    search = MoDNN().plan(profile, budget, sub_batch="search")
    assert search.sub_batches > eq3.sub_batches
    assert _run(search, profile).makespan <= plus.makespan * (1 + 1e-9)


def test_defragmentation_offloads_only_what_the_request_needs(profiles) -> None:
    """FCN-32s: before F21 (an 8.6 GB workspace at sub-batch 64) no contiguous scheme exists,
    because F21's own input and the output bound the free hole, although the bytes to free are
    fewer than the offloadable ones. The paper's text offloads all data (``defragment="all"``):
    4.8 GB a pass each way, and F21 waits for the last copy. By default moDNN offloads the
    earliest blocks until the compacted memory holds the request: it moves no more than vDNN+
    at any budget, and nothing waits."""
    profile = profiles["fcn"]
    for gib in FIG8_BUDGETS_GIB:
        budget = gib * GiB
        enough = MoDNN().plan(profile, budget)
        literal = MoDNN().plan(profile, budget, defragment="all")
        assert "defragmentations per pass: 1" in literal.notes
        assert (enough.options["defragment"], literal.options["defragment"]) == ("enough", "all")
        ours, paper = simulate(enough, profile), simulate(literal, profile)
        plus = _run(VDNNPlus().plan(profile, budget), profile)
        assert ours.moved_bytes <= min(paper.moved_bytes, plus.moved_bytes), gib
        assert ours.makespan <= paper.makespan * (1 + 1e-9), gib
        assert not _compute_stalls(ours) and _compute_stalls(paper), gib
        if gib == 12:
            assert ours.moved_bytes < 0.6 * paper.moved_bytes
    with pytest.raises(ValueError, match="defragment must be one of"):
        MoDNN().plan(profile, 12 * GiB, defragment="some")


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
    "vgg19": "vgg19-b256-h100-scaling.json",  # variants 1..192
    "resnet34": "resnet34-b128-h100-scaling.json",  # variants 1..96
    "resnet34-b256": "resnet34-b256-h100-scaling.json",  # variants 1..192
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
    assert path.exists(), f"{path} is committed: the Fig. 8 checks on measured profiles need it"
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
# ResNet-34 at half the span: eq. (3) takes the largest sub-batch whose heaviest task fits
# (the whole batch), and moDNN must then move 7.9 GB (batch 128) where vDNN+'s smaller
# sub-batch (64 x 2) keeps almost everything (0.15 GB moved): 145 vs 62 ms, 282 vs 102 ms at
# batch 256. Measured with B_i holding the part of x_{i+1} it needs (the profiles' output_saved_bytes).
# Those two cases are checked the other way round: moDNN slower than vDNN+, with fewer passes.
EQ3_TAKES_TOO_LARGE_A_SUB_BATCH = {("resnet34", 0.50), ("resnet34-b256", 0.50)}


@pytest.mark.parametrize("key,fraction", [(key, f) for key in MEASURED_PROFILES for f in FIG8_FRACTIONS])
def test_fig8_eq3_on_measured_h100_profiles(key: str, fraction: float) -> None:
    """Fig. 8 with the paper's eq. (3) on measured profiles: moDNN <= vDNN+ <= vDNN (where vDNN fits),
    but where eq. (3) takes too large a sub-batch (``EQ3_TAKES_TOO_LARGE_A_SUB_BATCH``), moDNN > vDNN+.

    On a real GPU small batches run less efficiently (VGG-16 on the H100: 12.1 ms a sample at
    batch 1, 1.36 at 16, 0.80 at 256), which is what eq. (3)'s "large enough to fully utilize the
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
    if (key, fraction) in EQ3_TAKES_TOO_LARGE_A_SUB_BATCH:  # the paper's deviation, pinned as it is
        assert modnn.makespan > plus.makespan and schedule.sub_batches < plus_schedule.sub_batches, \
            (key, fraction, modnn.makespan, plus.makespan)
    else:
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
