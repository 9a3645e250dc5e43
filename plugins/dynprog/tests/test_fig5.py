"""papers/004 section 6.2, Figure 5: makespan / LB on analytic V100-PCIe profiles (beta = 12.2 GB/s).

Eight torchvision models at 224x224, batch 32, eleven budgets from the minimum memory to
M_peak. The paper reports DYNPROG below 1.2 LB throughout and better than GREEDY.

The chains: the profiler cuts where one activation is live (section 6.1, "grouping each
non-linear part of the graph in a virtual layer"), after rewriting DenseNet's growing
concatenation into a chain (``harness.profilers.graph.chain_concatenations``), so that every
dense layer is a stage whose boundary is the concatenation of all previous features, as in
the sequential models the paper's chains came from. DenseNet-121/169/201 have 73/97/113 stages
(19 each when a dense block was one stage, up to 1.3 GB saved in one stage and max
makespan/LB 2.18/1.88/1.82; now at most 1.12).

ResNet-18 still misses 1.2: its BasicBlocks cannot be cut (the skip connection keeps two
tensors live), and its stem (conv1, bn1..relu, maxpool with its int64 indices) saves 276 MB
of its 710 MB in 2.1 of 18.9 ms of forward compute (at the minimum, B1's own need, the
DYNPROG schedule idles 20.5 ms before F3 for the stem's offloads and 22.6 ms before B2..B0
for its prefetches, which no memory is free to start earlier). From the minimum to 30% of the range
the table's own optimum, which bounds every ordered no-wait schedule from below up to the
rounding E (test_dynprog), is 1.28-1.39 LB, so no ordered schedule reaches the paper's
ratio there; it is an expected failure of the 1.2 check, and
``test_coarse_chains_cannot_reach_1_2`` asserts the reason. The 1.2 and the GREEDY checks
use ``candidates=64`` (the table's 64 best sets run in the simulator).

The paper's own DYNPROG (one set, ``candidates=1``) stays under 1.2 LB on ResNet-101/152 and
the DenseNets. On ResNet-50 (1.231 at 60 %) and Inception-v3 (1.207 at 50 %) it does not,
although the table's optimum there is 1.13 and 1.08 LB: that optimum is shared by many sets
(31 and 27 of them), the tie-break (most bytes kept, then the smaller Delta_F, Delta_B)
picks one that whole-tensor copies (assumption E: a prefetch reserves its whole tensor when
it starts) slow down, and the best of the tied sets runs at 1.182 and 1.135 LB. Prefetching
during the last forward operations (eq. (10), ``prefetch_during_forward``) changes no set and
no makespan on these chains: memory is full when every forward pass ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import pytest

from harness.bounds import lower_bound, min_memory, peak_memory
from harness.simulate.executor import simulate
from membudget_dynprog import discretise, plan_offload, solve

pytestmark = pytest.mark.slow

MODELS = ["resnet18", "resnet50", "resnet101", "resnet152", "densenet121", "densenet169", "densenet201",
          "inception_v3"]
COARSE = {"resnet18"}
DENSENETS = ["densenet121", "densenet169", "densenet201"]
FRACTIONS = [k / 10 for k in range(11)]
SLOTS = 500


@dataclass(frozen=True)
class Point:
    """One budget of Figure 5: every makespan divided by LB (papers/004 Prop. 3)."""

    fraction: float
    greedy: float
    dynprog: float  # the paper's: the table's best set (ties for it broken in the simulator)
    dynprog_k64: float  # the fastest of the table's 64 best sets
    predicted: float  # the table's optimum, compute + idle
    rounding: float  # E = (L + 2) slots of transfer time


def _profile(model: str):
    pytest.importorskip("torch")
    from harness.errors import UnknownPlugin
    from harness.plugins import registry
    from harness.protocols import Workload

    try:
        profiler = registry().profiler("analytic")
    except UnknownPlugin:
        pytest.skip("the analytic profiler (harness/profilers/analytic.py) is not registered")
    return profiler.profile(Workload(f"torchvision:{model}", 32, (3, 224, 224), "V100-PCIe"))


@cache
def figure_5(model: str) -> tuple[Point, ...]:
    from membudget_greedy import Greedy

    profile = _profile(model)
    assert profile.d2h_bandwidth == profile.h2d_bandwidth == 12.2e9
    lo, hi = min_memory(profile), peak_memory(profile)
    points = []
    for f in FRACTIONS:
        budget = lo + int((hi - lo) * f)
        lb = lower_bound(profile, budget, m_peak=hi)

        def ratio(schedule):
            run = simulate(schedule, profile, with_trace=False)
            assert run.feasible, run.message
            return run.makespan / lb

        paper = plan_offload(profile, budget, slots=SLOTS)
        if budget < hi:
            disc = discretise(profile, budget, SLOTS)
            idle = solve(disc).idle
            rounding = (profile.n_stages + 2) * disc.slot_bytes / profile.d2h_bandwidth
        else:
            idle, rounding = 0.0, 0.0
        points.append(Point(
            f, ratio(Greedy().plan(profile, budget)), ratio(paper.schedule),
            ratio(plan_offload(profile, budget, slots=SLOTS, candidates=64).schedule),
            (profile.compute_time + idle) / lb, rounding / lb,
        ))
    return tuple(points)


@pytest.mark.parametrize("model", [
    pytest.param(m, marks=pytest.mark.xfail(
        strict=True, reason="ResNet-18's stem saves 39% of the bytes in 4% of the compute: the DP's own optimum "
                                "(a lower bound of ordered no-wait schedules) is above 1.2 LB near the minimum"))
    if m in COARSE else m for m in MODELS])
def test_dynprog_stays_under_1_2_lb(model: str) -> None:
    """Section 6.2: "DYNPROG is able to consistently achieve a ratio below 1.2"."""
    worst = max(p.dynprog_k64 for p in figure_5(model))
    assert worst < 1.2, [(p.fraction, round(p.dynprog_k64, 3)) for p in figure_5(model)]


@pytest.mark.parametrize("model", [
    pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=(
        "ResNet-18: the DP's own optimum is above 1.2 LB near the minimum")))
    if m in COARSE else m for m in MODELS if m not in DENSENETS])
def test_paper_dynprog_stays_under_1_2_lb(model: str) -> None:
    """Section 6.2's 1.2 for the paper's DYNPROG itself: the table's best set (k = 1)."""
    points = figure_5(model)
    worst = max(p.dynprog for p in points)
    assert worst < 1.2, [(p.fraction, round(p.dynprog, 3)) for p in points]


def test_ties_for_the_optimum_differ_in_the_simulator() -> None:
    """Why DYNPROG breaks ties for the table's optimum in the simulator: on ResNet-50 at half the
    span the sets tied for the smallest idle time are many, and the first one backtracked runs
    over 1.2 LB where the fastest of them stays under it (same predicted idle)."""
    profile = _profile("resnet50")
    lo, hi = min_memory(profile), peak_memory(profile)
    budget = lo + int((hi - lo) * 0.6)
    lb = lower_bound(profile, budget, m_peak=hi)
    first = plan_offload(profile, budget, slots=SLOTS, ties=False)
    fastest = plan_offload(profile, budget, slots=SLOTS)
    assert first.idle == pytest.approx(fastest.idle, rel=1e-12)
    assert first.offload != fastest.offload
    t_first = simulate(first.schedule, profile, with_trace=False).makespan
    t_fast = simulate(fastest.schedule, profile, with_trace=False).makespan
    assert t_fast < 1.2 * lb <= t_first


@pytest.mark.parametrize("model", DENSENETS)
def test_paper_dynprog_is_almost_optimal_on_densenet(model: str) -> None:
    """Section 6.2: "except for the DenseNet networks where DYNPROG is able to consistently obtain
    almost optimal solutions": with one stage per dense layer the paper's own set (k = 1) stays
    under 1.2 LB at every budget, and its worst budget is better than GREEDY's worst."""
    points = figure_5(model)
    worst = max(p.dynprog for p in points)
    assert worst < 1.2, [(p.fraction, round(p.dynprog, 3)) for p in points]
    assert worst < max(p.greedy for p in points)


@pytest.mark.parametrize("model", sorted(COARSE))
def test_coarse_chains_cannot_reach_1_2(model: str) -> None:
    """Why the 1.2 check fails on these chains: the table's optimum, a lower bound of every
    ordered no-wait schedule up to E, is above 1.2 LB at some budget (and GREEDY agrees)."""
    points = figure_5(model)
    beyond = [p for p in points if p.predicted - p.rounding > 1.2]
    assert beyond
    assert all(p.greedy >= p.predicted - p.rounding - 1e-9 for p in beyond)


@pytest.mark.parametrize("model", MODELS)
def test_dynprog_never_worse_than_greedy(model: str) -> None:
    """Section 6.2: DYNPROG outperforms GREEDY; at every budget no worse than it up to E."""
    for p in figure_5(model):
        assert p.dynprog_k64 <= p.greedy + p.rounding + 1e-9, p


@pytest.mark.parametrize("model", MODELS)
def test_paper_dynprog_predicts_no_worse_than_greedy(model: str) -> None:
    """The paper's DYNPROG: its table's optimum is at most GREEDY's makespan up to E (GREEDY's
    set is one of those the table ranks), it never beats LB, and the peak budget costs nothing."""
    points = figure_5(model)
    for p in points:
        assert p.predicted <= p.greedy + p.rounding + 1e-9, p
        assert min(p.dynprog, p.dynprog_k64, p.greedy) >= 1 - 1e-9
    assert points[-1].dynprog == pytest.approx(1.0, rel=1e-12)
