"""papers/004 section 6.2, Figure 5: makespan / LB on analytic V100-PCIe profiles (beta = 12.2 GB/s).

Eight torchvision models at 224x224, batch 32, eleven budgets from the minimum memory to
M_peak. The paper reports DYNPROG below 1.2 LB throughout and better than GREEDY.

The chains: the profiler cuts where one activation is live (section 6.1, "grouping each
non-linear part of the graph in a virtual layer"), after rewriting DenseNet's growing
concatenation into a chain (``harness.chain.graph.chain_concatenations``), so that every
dense layer is a stage whose boundary is the concatenation of all previous features, as in
the sequential models the paper's chains came from. DenseNet-121/169/201 have 73/97/113 stages
(19 each when a dense block was one stage, up to 1.3 GB saved in one stage and max
makespan/LB 2.18/1.88/1.82; now at most 1.12).

The profiles count what each backward allocates beyond y_i and y_{i+1}
(``harness.profilers.allocations``). Before, an in-place ReLU's input and output gradients
were one storage to the profiler, so a conv/bn + ReLU stage had no backward workspace:
ResNet-18's minimum was B_1's need without the 103 MB gradient of bn1's output, and the
table's own optimum there was 1.41 LB (1.665 simulated); ResNet-50 and Inception-v3 needed
ties broken in the simulator and 64 candidates to stay under 1.2.

Now every model but ResNet-18 stays under 1.2 LB with the paper's DYNPROG (the table's best
set, its ties broken in the simulator): at most 1.18 (ResNet-50), 1.17 (Inception-v3),
1.10-1.12 elsewhere. ResNet-18 misses it at the two lowest budgets (1.336 and 1.272 LB), and
no schedule of the paper's kind can do better: ``test_resnet18_minimum_is_out_of_reach_of_every_ordered_schedule``
runs all 2^13 offload sets, each with every prefetch window and lead, and DYNPROG's set is
the fastest of them. The table's optimum there is 1.10 LB: it is the fractional model's,
where memory frees as an offload proceeds. With whole tensors (assumption E) the 103 MB
block outputs of the stem and layer1 hold their memory for 8.4 ms each: at the minimum
(B_1's need) F4 and F6 wait 5.4 and 4.0 ms for the offloads of stage 1 and 3, and B3, B1, B0
wait 3.8, 3.2 and 1.6 ms for their prefetches, which only the end of B5, B3 and B1 leaves
room for.
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
SHORT = {"resnet18": [0.0, 0.1]}  # the fractions of the span where it misses 1.2 (see the module docstring)
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
    from harness.plugins import registry
    from harness.protocols import Workload

    profiler = registry().profiler("analytic")  # a core built-in: missing, the test fails
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


def _over_1_2(points: tuple[Point, ...], ratio: str) -> list[float]:
    """The fractions where ``ratio`` (a Point field) is 1.2 LB or more."""
    return [p.fraction for p in points if getattr(p, ratio) >= 1.2]


@pytest.mark.parametrize("model", MODELS)
def test_dynprog_stays_under_1_2_lb(model: str) -> None:
    """Section 6.2: "DYNPROG is able to consistently achieve a ratio below 1.2": at every budget, but
    ResNet-18's two lowest (1.336 and 1.272 LB: whole-tensor copies of the stem's 103 MB blocks;
    ``test_resnet18_minimum_is_out_of_reach_of_every_ordered_schedule``), exactly those."""
    points = figure_5(model)
    assert _over_1_2(points, "dynprog_k64") == SHORT.get(model, []), \
        [(p.fraction, round(p.dynprog_k64, 3)) for p in points]


@pytest.mark.parametrize("model", [m for m in MODELS if m not in DENSENETS])
def test_paper_dynprog_stays_under_1_2_lb(model: str) -> None:
    """Section 6.2's 1.2 for the paper's DYNPROG itself (the table's best set, k = 1), with the same two
    exceptions on ResNet-18."""
    points = figure_5(model)
    assert _over_1_2(points, "dynprog") == SHORT.get(model, []), [(p.fraction, round(p.dynprog, 3)) for p in points]


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


@pytest.mark.parametrize("fraction", SHORT["resnet18"])
def test_resnet18_minimum_is_out_of_reach_of_every_ordered_schedule(fraction: float) -> None:
    """Why ResNet-18 misses 1.2 LB at the two lowest budgets: every one of the 2^13 offload sets, each
    with every prefetch window and lead (``fastest_ordered_schedule``), is at least 1.2 LB, and
    DYNPROG's schedule is as fast as the fastest of them. The table's own optimum (the
    fractional model's) is under 1.2 at the minimum, so the loss is assumption E's, not the table's."""
    from harness.schedules import fastest_ordered_schedule

    profile = _profile("resnet18")
    lo, hi = min_memory(profile), peak_memory(profile)
    point = next(p for p in figure_5("resnet18") if p.fraction == fraction)
    budget = lo + int((hi - lo) * fraction)
    lb = lower_bound(profile, budget, m_peak=hi)
    n = profile.n_stages
    fastest = min(
        fastest_ordered_schedule(profile, budget, [i for i in range(n) if mask >> i & 1], planner="enumerate",
                                 prefetch_during_forward=True)[1]
        for mask in range(1 << n))
    assert fastest / lb > 1.2
    assert point.dynprog == pytest.approx(fastest / lb, rel=1e-9)
    assert point.predicted < 1.2


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
