"""RECOMPUTE: conformance, brute force, torch-checkpoint, the kernel against the reference.

The schedules searched are single-level checkpointing by segments (``harness.schedules.
recompute_ops``), the vocabulary's only recomputations; rotor's multi-level schedules
(Beaumont et al., "Optimal checkpointing for heterogeneous chains") are not expressible.

Slot error bound used by the brute-force tests (see ``membudget_recompute.planner``). The
sizes rounded up put each piece's prefix and need at most one slot above the truth per
piece before it and one for its own need, so every schedule whose peak is at most
``B - (L + 1) (B - W) / S`` fits the rounded-up DP, and nothing the planner returns peaks
above B: the planner's time lies between the brute-force optimum at B and the one at
``B - (L + 1) (B - W) / S``. At budgets with no schedule's peak in that window (away from
the steps of the optimum) the two are equal, and so must the planner's be.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bounds import peak_memory
from harness.errors import InfeasibleBudget
from harness.memory import recompute_peak
from harness.model import Profile, Schedule, load
from harness.planners.torch_peers import TorchCheckpoint
from harness.schedules import recompute_ops
from harness.simulate.executor import makespan, simulate, timing
from harness.testing import PlannerConformance, budgets, chains
from harness.validate import validate
from membudget_recompute import (
    Recompute, discretise, peak_of, plan, plan_segments, recompute_time, segment_tables, solve,
)
from membudget_recompute.planner import Tables, leanest

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
FEW = settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
PROFILES = Path(__file__).resolve().parents[3] / "results" / "profiles"
REAL = ("resnet50_analytic_v100-pcie_b32.json", "vgg16_analytic_v100-pcie_b32.json",
        "resnet50-b32-h100-measured.json")


class TestRecomputeConformance(PlannerConformance):
    """The planner (S = 500) through the conformance kit: every schedule through ``harness.validate``."""

    planner = Recompute()


class TestCoarseRecomputeConformance(PlannerConformance):
    """Few slots: the relaxation rarely fits, the rounded-up DP and the exact candidates do the work."""

    planner = Recompute()
    options = {"slots": 5}


# --------------------------------------------------------------------------- brute force


def all_segmentations(n: int, start: int = 0):
    """Every valid F/Fc/Fn assignment of stages start..n-1, as its segments (Fn only after Fc/Fn)."""
    if start == n:
        yield []
        return
    for rest in all_segmentations(n, start + 1):  # stage `start` saves
        yield rest
    for b in range(start + 1, n + 1):  # a segment [start, b): Fc, then Fn
        for rest in all_segmentations(n, b):
            yield [(start, b), *rest]


def simulated(profile: Profile) -> list[tuple[int, float, list]]:
    """(peak, makespan, segments) of every assignment, from the simulator with no budget."""
    out = []
    for segments in all_segmentations(profile.n_stages):
        schedule = Schedule("brute", 0, recompute_ops(profile.n_stages, segments))
        _, tm = timing(schedule, profile, budget=math.inf)
        assert tm.ok
        out.append((int(tm.peak), tm.makespan, segments))
    return out


def best_under(table, budget: float) -> float:
    return min((t for peak, t, _ in table if peak <= budget), default=math.inf)


def check_against_brute_force(profile: Profile, slots: int, budgets_to_try: int = 6) -> int:
    """The sandwich of the module docstring at budgets between the schedules' peaks; equality where no
    peak lies in the slot window. Returns how many budgets were compared for equality."""
    table = simulated(profile)
    peaks = sorted({peak for peak, _, _ in table})
    w = profile.weight_bytes
    chosen = peaks if len(peaks) <= budgets_to_try else [peaks[round(k * (len(peaks) - 1) / (budgets_to_try - 1))]
                                                         for k in range(budgets_to_try)]
    equal = 0
    for budget in chosen:
        best = best_under(table, budget)
        found = plan(profile, budget, slots)
        run = simulate(Schedule("r", budget, recompute_ops(profile.n_stages, found.segments)), profile)
        assert run.feasible and run.peak_bytes <= budget
        assert math.isclose(run.makespan, found.time, rel_tol=1e-9, abs_tol=1e-15)
        window = budget - (profile.n_stages + 1) * (budget - w) / slots
        assert best * (1 - 1e-9) <= found.time <= best_under(table, window) * (1 + 1e-9) + 1e-15
        if found.optimal or not any(window < p <= budget for p in peaks):
            assert math.isclose(found.time, best, rel_tol=1e-9, abs_tol=1e-15), (budget, found, best)
            equal += 1
    return equal


@FEW
@given(profile=chains(min_stages=2, max_stages=8, with_algorithms=False))
def test_the_planner_is_the_brute_force_optimum(profile: Profile) -> None:
    """L in 2..8: every assignment simulated; the planner (S = 2000) is the best feasible time."""
    check_against_brute_force(profile, 2000)


@FEW
@given(profile=chains(min_stages=2, max_stages=8, with_algorithms=False), slots=st.integers(1, 6))
def test_the_exact_search_makes_the_planner_the_brute_force_optimum_at_any_slots(profile: Profile, slots: int) -> None:
    """With as few as one slot, where the DP alone is far from the optimum, the exact search in bytes
    finds the best feasible time of all assignments and says so (``optimal``)."""
    table = simulated(profile)
    for budget in sorted({peak for peak, _, _ in table}):
        found = plan(profile, budget, slots)
        assert found.optimal and math.isclose(found.time, best_under(table, budget), rel_tol=1e-9, abs_tol=1e-15)
        assert peak_of(segment_tables(profile), found.segments) <= budget


def test_the_exact_search_beats_the_slot_dp_where_it_can() -> None:
    """The ten-stage chain at 4 slots: without the search (``front_limit=0``) the planner is slower
    than the brute-force optimum at some budgets; with it, at none. A front limit the search passes
    gives the DP's answer back."""
    profile = _ten_stages()
    table = simulated(profile)
    slower = 0
    for budget in sorted({peak for peak, _, _ in table})[::40]:
        best = best_under(table, budget)
        dp_only, exact = plan(profile, budget, 4, front_limit=0), plan(profile, budget, 4)
        assert math.isclose(exact.time, best, rel_tol=1e-9, abs_tol=1e-15) and exact.optimal
        if dp_only.time > best * (1 + 1e-9):
            slower += 1
            gave_up = plan(profile, budget, 4, front_limit=1)
            assert gave_up.time == dp_only.time and not gave_up.optimal
    assert slower >= 3, slower


def test_the_lower_bound_is_below_every_schedule_and_an_optimal_plan_meets_it() -> None:
    """``SegmentPlan.lower_bound``: no schedule of the vocabulary (brute force, simulated) is faster, and where
    the plan says it is optimal, as the exact search in bytes proves at 4 slots, the bound is its time. (A QA
    mutant that left the relaxation's bound in place after the search had proven the optimum passed every
    other test: the planner's note printed "optimal" with a bound below the time.)"""
    profile = _mixed_stages(7, 10)  # the first seven of _ten_stages
    table = simulated(profile)
    searched = 0
    for budget in sorted({peak for peak, _, _ in table})[::12]:
        best = best_under(table, budget)
        found = plan(profile, budget, 4)
        assert found.lower_bound <= best * (1 + 1e-12) and math.isclose(found.time, best, rel_tol=1e-9)
        assert found.optimal and math.isclose(found.lower_bound, found.time, rel_tol=1e-12), (budget, found)
        searched += plan(profile, budget, 4, front_limit=0).lower_bound < best * (1 - 1e-9)
    assert searched  # budgets where the slot DP's bound is below the optimum: the exact search set it


def test_a_rounded_up_schedule_as_fast_as_the_relaxation_is_optimal_without_the_search() -> None:
    """Found by a QA probe: at 1145 bytes and 100 slots the relaxation's own schedule does not fit, but the DP
    on sizes rounded up finds one as fast; its time meets the lower bound, so without the exact search
    (``front_limit=0``) the plan is still proven optimal, and it is the brute-force optimum."""
    from harness.model import Stage

    figures = [(2.0, 200, 100), (2.0, 200, 200), (1.0, 200, 200), (2.0, 100, 100), (1.0, 200, 100),
               (2.0, 200, 100), (2.0, 100, 100), (1.0, 100, 100)]
    stages = tuple(Stage(f"s{i}", "conv", f, 2.0, x, s, 100) for i, (f, x, s) in enumerate(figures))
    profile = Profile("ties", 4, (1,), "synthetic", 10**9, 1e9, 1e9, 0, 100, stages)
    found = plan(profile, 1145, 100, front_limit=0)
    assert found.source == "dp (sizes rounded up)" and found.optimal
    assert found.lower_bound == found.time == best_under(simulated(profile), 1145)


def test_the_quick_search_lets_the_exact_search_finish_within_a_small_front_limit() -> None:
    """``plan`` first searches with each front thinned to ``QUICK_FRONT`` points: that schedule's time tightens
    the upper bound of the exact search, which then prunes enough to finish within 64 points per front where
    the slot DP's candidates' bound would not (30 stages, 4 slots). The plan is then proven optimal, as fast as
    with the default front limit and faster than the candidates alone. (A QA mutant that ignored the quick
    search's schedule passed every other test.)"""
    profile = _mixed_stages(30, 10)
    lo, hi = leanest(segment_tables(profile))[1], peak_memory(profile)
    budget = int(lo + (hi - lo) * 0.6)
    small, full = plan(profile, budget, 4, front_limit=64), plan(profile, budget, 4)
    dp_only = plan(profile, budget, 4, front_limit=0)
    assert small.optimal and full.optimal and math.isclose(small.time, full.time, rel_tol=1e-12)
    assert small.time < dp_only.time * (1 - 1e-9)


def test_a_front_limit_of_one_point_is_a_search_that_can_finish() -> None:
    """``front_limit`` is the most points the search may keep per stage, and 1 is a valid limit: on four stages
    (1 slot, a third of the way from the leanest peak to keep-all) the best candidate's time prunes every front
    to one point, so the search finishes and proves the candidate optimal (the brute-force optimum), where the
    planner without the search (``front_limit=0``) cannot say so. (A QA mutant that skipped the search at a
    limit of 1 passed every other test.)"""
    profile = _mixed_stages(4, 10)
    lo, hi = leanest(segment_tables(profile))[1], peak_memory(profile)
    budget = int(lo + (hi - lo) * 13 / 40)
    without, one = plan(profile, budget, 1, front_limit=0), plan(profile, budget, 1, front_limit=1)
    assert not without.optimal and one.optimal
    assert math.isclose(one.time, best_under(simulated(profile), budget), rel_tol=1e-12)


def _large_stages(n: int, seed: int) -> Profile:
    """``n`` stages of nearly 2**48 bytes each: sizes the profile allows (they add up to under 2**53)."""
    from harness.model import Stage

    rng = random.Random(seed)
    stages = tuple(Stage(f"s{i}", "conv", rng.uniform(1e-3, 3e-3), 2e-3, 2**48 - rng.randint(0, 2**46),
                         2**48 - rng.randint(0, 2**46), 2**48 - rng.randint(0, 2**46)) for i in range(n))
    return Profile("large", 1, (1,), "synthetic", 2**50, 1e9, 1e9, 0, 0, stages)


def _budgets_past_64_bits(profile: Profile) -> tuple[Tables, list[int]]:
    """``profile``'s tables and two budgets (a fifth and half of the way from the leanest schedule's peak to
    keep-all's) whose room in slots, (usable - peak) * 8000, is past 64 bits."""
    tables = segment_tables(profile)
    lo, hi = leanest(tables)[1], peak_memory(profile)
    budgets = [int(lo + (hi - lo) * where) for where in (0.2, 0.5)]
    assert all((budget - tables.weights) * 8000 >= 2**63 for budget in budgets)
    return tables, budgets


def test_the_exact_search_stays_exact_with_sizes_near_the_profile_limit() -> None:
    """The room a point leaves, in slots, is (usable - peak) * S: past 64 bits at S = 8000 here (the kernel
    then read its bound table out of range); fewer slots for the bound keep the search exact."""
    profile = _large_stages(10, 3)
    tables, budgets = _budgets_past_64_bits(profile)
    for budget in budgets:
        kernel, reference = plan(profile, budget, 8000), plan(profile, budget, 8000, engine="reference")
        assert kernel == reference and kernel.optimal
        assert math.isclose(kernel.time, plan(profile, budget, 2).time, rel_tol=1e-12)  # exact: any slots


def test_the_exact_search_decides_by_its_bound_exactly_with_sizes_near_the_profile_limit() -> None:
    """The test above plans where the DP's own schedule is proven optimal, so its exact search never runs.
    Here the search runs alone with the optimum as its upper bound, where the bound decides what is pruned,
    and with the bound ``plan`` gives it (``prefix_bound`` from tables rounded at 8000 slots): with the room
    (usable - peak) * 8000 past 64 bits, the kernel pruned the optimum (a QA mutant that dropped the cap of
    the bound's slots, or reused the caller's 8000-slot tables, passed every other test)."""
    from membudget_recompute.planner import exact_segments, prefix_bound

    profile = _large_stages(10, 3)
    tables, budgets = _budgets_past_64_bits(profile)
    for budget in budgets:
        best = plan(profile, budget, 2)  # the exact search at 2 slots: no room passes 64 bits
        assert best.optimal
        extra = best.time - tables.compute_time
        for engine in ("kernel", "reference"):
            bound = prefix_bound(tables, budget, 8000, engine, discretise(tables, budget, 8000, down=True))
            found = exact_segments(tables, budget, extra * (1 + 1e-9), engine=engine, bound=bound)
            assert found is not None, (budget, engine)
            assert math.isclose(found[1], extra, rel_tol=1e-9) and peak_of(tables, found[0]) <= budget


def test_a_long_segment_of_large_stages_is_rounded_exactly() -> None:
    """A segment's need times S = 8000 passes 64 bits: discretise wrapped it negative and the DP indexed
    outside its tables (an IndexError; silent out-of-range writes in the kernel). Found by a QA fuzzer."""
    profile = _large_stages(10, 4)
    tables = segment_tables(profile)
    budget = leanest(tables)[1]
    usable = budget - tables.weights
    d = discretise(tables, budget, 8000, down=True)
    i, j = np.triu_indices(10, 1, 11)
    assert int(tables.segment[i, j].max()) * 8000 >= 2**63
    assert [int(v) for v in d.segment[i, j]] == [min(int(v) * 8000 // usable, 8001) for v in tables.segment[i, j]]
    kernel, reference = plan(profile, budget, 8000), plan(profile, budget, 8000, engine="reference")
    assert kernel == reference and peak_of(tables, kernel.segments) <= budget and kernel.optimal


def test_the_engines_break_a_tie_in_floats_alike() -> None:
    """A stage of 5e-324 s: two points of one front have equal peaks and, with the segment's time added,
    equal times; the kernel kept the last, the reference the first. Found by a QA fuzzer."""
    from harness.model import Stage
    from membudget_recompute import _kernels, reference

    stages = (Stage("s0", "conv", 0.002, 1e-3, 0, 200, 200), Stage("s1", "conv", 0.001, 1e-3, 0, 200, 0),
              Stage("s2", "conv", 5e-324, 1e-3, 0, 100, 100), Stage("s3", "conv", 0.0, 1e-3, 0, 200, 0))
    profile = Profile("tie", 1, (1,), "synthetic", 10**9, 1e9, 1e9, 0, 0, stages)
    assert plan(profile, 500, 1) == plan(profile, 500, 1, engine="reference")
    tables = segment_tables(profile)
    d = discretise(tables, 500, 1, down=True)
    bound = _kernels.prefix_bounds(d.slots, d.keep_saved, d.keep_checkpoint, d.saving, d.segment, d.cost)
    args = (500, 1.0, 100, bound, tables.keep_saved, tables.keep_checkpoint, tables.saving, tables.segment, tables.cost)
    for x, y in zip(_kernels.pareto_fronts(*args), reference.pareto_fronts(*args)):
        assert np.array_equal(x, y)


@pytest.mark.slow
def test_the_planner_is_the_brute_force_optimum_on_ten_stages() -> None:
    """One 10-stage chain (10946 assignments, about 10 s in the simulator), stages of mixed sizes and
    times, at the default slots."""
    assert check_against_brute_force(_ten_stages(), 500, budgets_to_try=8) >= 4


def _ten_stages() -> Profile:
    return _mixed_stages(10, 10, "ten")


def _mixed_stages(n: int, seed: int, model: str = "mixed") -> Profile:
    """``n`` stages of mixed sizes and times (``_ten_stages`` is ``n`` = 10, seed 10)."""
    from harness.model import Stage

    rng = random.Random(seed)
    stages = []
    for i in range(n):
        size = rng.randint(50, 400)
        stages.append(Stage(f"s{i}", "conv", rng.uniform(1e-3, 5e-3), rng.uniform(2e-3, 8e-3), size,
                            rng.randint(size // 2, 2 * size), rng.randint(50, 400), rng.randint(0, 100),
                            rng.randint(0, 100), output_saved_bytes=0))
    return Profile(model, 4, (3, 8, 8), "synthetic", 10**9, 1e9, 1e9, 1000, 64, tuple(stages))


def test_the_enumeration_counts_the_assignments() -> None:
    """t(n) = 2 t(n-1) + g(n-1), g(n) the assignments ending in Fc or Fn (an Fn may follow them): the
    odd Fibonacci numbers F(2n+1)."""
    counts = [sum(1 for _ in all_segmentations(n)) for n in range(1, 6)]
    assert counts == [2, 5, 13, 34, 89]
    assert sum(1 for _ in all_segmentations(10)) == 10946


# --------------------------------------------------------------------------- torch-checkpoint


def assert_never_slower_than_torch_checkpoint(profile: Profile, budget: int) -> None:
    for every in ("auto", "sqrt"):
        try:
            theirs = TorchCheckpoint().plan(profile, budget, every=every)
        except InfeasibleBudget:
            continue
        ours = Recompute().plan(profile, budget)
        t_ours, t_theirs = makespan(ours, profile), makespan(theirs, profile)
        assert t_ours is not None and t_theirs is not None
        assert t_ours <= t_theirs * (1 + 1e-12), (every, budget, t_ours, t_theirs)


@SETTINGS
@given(profile=chains(max_stages=14))
def test_never_slower_than_torch_checkpoint_on_random_chains(profile: Profile) -> None:
    for budget in budgets(profile, 5):
        assert_never_slower_than_torch_checkpoint(profile, budget)


@pytest.mark.parametrize("name", REAL)
def test_never_slower_than_torch_checkpoint_on_real_profiles(name: str) -> None:
    """The analytic V100 profiles of ResNet-50 and VGG-16 (batch 32) and ResNet-50 measured on an H100."""
    profile = load(Profile, PROFILES / name)
    lo = leanest(segment_tables(profile))[1]
    hi = peak_memory(profile)
    for fraction in (0.0, 0.1, 0.25, 0.5, 0.75, 1.0):
        assert_never_slower_than_torch_checkpoint(profile, int(lo + (hi - lo) * fraction))


# --------------------------------------------------------------------------- kernel and reference


@SETTINGS
@given(profile=chains(max_stages=10), slots=st.integers(1, 40), where=st.floats(0.0, 1.2), down=st.booleans())
def test_the_kernel_is_the_reference(profile: Profile, slots: int, where: float, down: bool) -> None:
    """Same tables (values and choices) and so the same segments, on random chains, both roundings."""
    from membudget_recompute._kernels import dp_table as kernel
    from membudget_recompute.reference import dp_table as reference

    tables = segment_tables(profile)
    lo, hi = leanest(tables)[1], peak_memory(profile)
    budget = int(lo + (hi - lo) * where)
    if budget <= profile.weight_bytes:
        return
    d = discretise(tables, budget, slots, down)
    args = (d.slots, d.keep_saved, d.keep_checkpoint, d.saving, d.segment, d.cost)
    (v1, c1), (v2, c2) = kernel(*args), reference(*args)
    assert np.array_equal(v1, v2) and np.array_equal(c1, c2)
    assert solve(d, "kernel") == solve(d, "reference")


@pytest.mark.parametrize("n", [4, 6, 10])
def test_the_dps_own_schedule_takes_its_time_and_rounded_up_fits(n: int) -> None:
    """``solve`` alone, before the candidates and the exact search that would hide a wrong walk: the segments
    it backtracks from its choice table take the time its table says (both roundings), and rounded up they
    fit the budget in bytes (the module docstring's plans that always fit). (A QA mutant that forgot the
    checkpoint's slots while walking the choices passed every other test: the candidates hid it.)"""
    profile = _mixed_stages(n, 10)  # the first n of _ten_stages
    tables = segment_tables(profile)
    lo, hi = leanest(tables)[1], peak_memory(profile)
    for where in (0.05, 0.2, 0.4, 0.7):
        budget = int(lo + (hi - lo) * where)
        for slots in (3, 10, 40):
            for down in (False, True):
                found = solve(discretise(tables, budget, slots, down))
                if found is None:
                    assert not down  # the leanest schedule fits, and so fits the relaxation
                    continue
                segments, extra = found
                assert math.isclose(recompute_time(tables, segments), extra, rel_tol=1e-9), (where, slots, down)
                assert down or peak_of(tables, segments) <= budget, (where, slots, segments)


@SETTINGS
@given(profile=chains(max_stages=9), slots=st.integers(1, 40), where=st.floats(0.0, 1.2), slack=st.floats(0.0, 2.0),
       limit=st.integers(1, 30), thin=st.sampled_from([0, 2, 3, 5]))
def test_the_exact_search_kernels_are_the_references(profile: Profile, slots: int, where: float, slack: float,
                                                     limit: int, thin: int) -> None:
    """The prefix bounds and the Pareto fronts (points, choices, links, and whether the search gave up)
    are the same from both engines, with upper bounds below and above the optimum, whole or thinned."""
    from membudget_recompute import _kernels, reference

    tables = segment_tables(profile)
    lo, hi = leanest(tables)[1], peak_memory(profile)
    budget = int(lo + (hi - lo) * where)
    if budget <= profile.weight_bytes:
        return
    d = discretise(tables, budget, slots, down=True)
    args = (d.slots, d.keep_saved, d.keep_checkpoint, d.saving, d.segment, d.cost)
    bound = _kernels.prefix_bounds(*args)
    assert np.array_equal(bound, reference.prefix_bounds(*args))
    upper = float(tables.cost[0, -1]) * slack
    fronts = (budget - tables.weights, upper, limit, bound, tables.keep_saved, tables.keep_checkpoint,
              tables.saving, tables.segment, tables.cost)
    got, expected = _kernels.pareto_fronts(*fronts, thin), reference.pareto_fronts(*fronts, thin)
    assert thin < 2 or max(got[5]) <= max(thin, 1)
    assert got[-1] == expected[-1]
    for x, y in zip(got[:-1], expected[:-1]):
        assert np.array_equal(x, y)


@SETTINGS
@given(runs=st.lists(st.lists(st.integers(-5, 5), max_size=6), max_size=9))
def test_merging_sorted_runs_sorts(runs: list[list[int]]) -> None:
    """``_merge_runs``, which orders an exact search's candidates (each window's come by rising peak)."""
    from membudget_recompute._kernels import _merge_runs

    runs = [sorted(r) for r in runs if r]
    value = np.array([v for r in runs for v in r], dtype=np.int64)
    bounds = np.cumsum([0] + [len(r) for r in runs]).astype(np.int64)
    order = _merge_runs(value, bounds, len(runs))
    assert sorted(order.tolist()) == list(range(len(value)))
    assert value[order].tolist() == sorted(value.tolist())


# --------------------------------------------------------------------------- the public API


@SETTINGS
@given(profile=chains(max_stages=12))
def test_plan_segments_is_what_the_simulator_runs(profile: Profile) -> None:
    """The segments fit (the simulator's peak, harness.memory's ``recompute_peak``) and take the predicted time."""
    tables = segment_tables(profile)
    for budget in budgets(profile, 4):
        try:
            segments, time = plan_segments(profile, budget)
        except InfeasibleBudget as exc:
            lean, need = leanest(tables)
            assert exc.needed_bytes == need > budget
            assert need == profile.weight_bytes + recompute_peak(profile, lean)
            continue
        schedule = Schedule("r", budget, recompute_ops(profile.n_stages, segments))
        run = simulate(schedule, profile)
        assert run.feasible and run.peak_bytes <= budget
        assert run.peak_bytes == peak_of(tables, segments) == profile.weight_bytes + recompute_peak(profile, segments)
        assert math.isclose(run.makespan, time, rel_tol=1e-9, abs_tol=1e-15)
        assert not validate(schedule, profile, budget)


def test_a_worked_example() -> None:
    """Four 100-byte stages (F 1 s, B 2 s), worked by hand. Keep-all peaks at 700 (B3: x0..x3, the
    output, y3, the output gradient). A one-stage segment frees nothing (Fc keeps x_a, all F_a saves);
    a two-stage one frees one x (600, 2 s of recomputation): [0, 2), [1, 3) and [2, 4) tie, and the
    ties go to saving stage 0. At 500 two x must go: [0, 3) (3 s) beats [0, 2) + [2, 4) (4 s), and it
    is the leanest schedule: nothing fits 499."""
    from harness.model import Stage

    stage = Stage("s", "conv", 1.0, 2.0, 100, 100, 100)
    profile = Profile("uniform", 4, (1,), "synthetic", 10**9, 1e9, 1e9, 0, 100, (stage,) * 4)
    assert peak_memory(profile) == 700
    assert plan_segments(profile, 700) == ([], 12.0)
    assert plan_segments(profile, 600) == ([(1, 3)], 14.0)
    assert plan_segments(profile, 500) == ([(0, 3)], 15.0)
    with pytest.raises(InfeasibleBudget) as refused:
        plan_segments(profile, 499)
    assert refused.value.needed_bytes == 500


def test_the_refusal_names_the_leanest_schedule_in_one_short_line() -> None:
    """The refusal listed every segment of the leanest schedule as Python tuples: a 150-stage chain
    made a line of hundreds of characters."""
    from harness.model import Stage

    stage = Stage("s", "conv", 1.0, 2.0, 100, 100, 100)
    profile = Profile("uniform", 4, (1,), "synthetic", 10**9, 1e9, 1e9, 0, 100, (stage,) * 150)
    with pytest.raises(InfeasibleBudget) as refused:
        plan_segments(profile, 1)
    text = str(refused.value)
    need = refused.value.needed_bytes
    assert f"needs at least {need} bytes" in text and "\n" not in text and len(text) < 300
    lean = leanest(segment_tables(profile))[0]
    first, last = lean[0], lean[-1]
    assert f"with its leanest checkpointing schedule ({len(lean)} recomputed segments, stages {first[0]}.." in text
    assert ", ..., " in text and f"{last[0]}..{last[1] - 1}); the budget is 1 bytes" in text


def test_options_are_checked() -> None:
    stage_profile = _ten_stages()
    with pytest.raises(TypeError):
        Recompute().plan(stage_profile, 10**9, slot=3)
    with pytest.raises(ValueError):
        plan(stage_profile, int(0.9 * peak_memory(stage_profile)), engine="fortran")
    for budget in (10**9, 1):  # keep-all fits / nothing fits: the engine is refused before either answer
        with pytest.raises(ValueError, match="option engine must be one of kernel, reference, got 'bogus'"):
            Recompute().plan(stage_profile, budget, engine="bogus")


# --------------------------------------------------------------------------- the torch executor


def test_the_torch_executor_runs_the_schedule_with_the_plain_gradients() -> None:
    """builtin:tiny-cnn on the CPU, planned a third of the way from the leanest schedule's peak to
    keep-all's (so some stages are recomputed and some save): every parameter gradient equals the
    unmodified model's (harness.executors.grad_check, as tests/test_torch_executor.py checks every
    planner)."""
    torch = pytest.importorskip("torch")
    from harness.executors._torch_chain import build_chain
    from harness.executors.grad_check import largest_relative_error, reference_gradients
    from harness.executors.torch_executor import TorchExecutor
    from harness.plugins import registry
    from harness.protocols import Workload

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)  # weights and batch reproducible
        chain = build_chain(Workload("builtin:tiny-cnn", 4, (3, 32, 32), "cpu"), "cpu")
        profile = registry().profiler("analytic").profile(Workload("builtin:tiny-cnn", 4, (3, 32, 32), "V100-PCIe"))
        lo, hi = leanest(segment_tables(profile))[1], peak_memory(profile)
        schedule = Recompute().plan(profile, lo + (hi - lo) // 3)
        kinds = {op.kind for op in schedule.ops}
        assert {"Fc", "R"} <= kinds, schedule.ops
        expected = reference_gradients(chain, 1)
        run = TorchExecutor(warmup=0, iterations=1).execute(schedule, profile, chain)
        assert run.status == "ok", run.message
        got = {n: p.grad for n, p in chain.model.named_parameters() if p.grad is not None}
        assert set(got) == set(expected)
        for name, grad in expected.items():
            torch.testing.assert_close(got[name], grad, msg=lambda m, name=name: f"{name}: {m}")
        assert largest_relative_error(got, expected) <= 1e-6
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("value", [-1, 1.5, True, "abc", None])
def test_a_bad_front_limit_is_refused_by_name(value):
    profile = _ten_stages()
    with pytest.raises(ValueError, match="option front_limit must be an integer >= 0"):
        Recompute().plan(profile, peak_memory(profile), front_limit=value)


@pytest.mark.parametrize("value", [0, -3, 1.5, True, "abc", None])
def test_a_bad_slots_is_refused_by_name(value):
    # slots=1.5 used to plan with S=1.5, slots="abc" to fail with "'<' not supported between ..."
    profile = _ten_stages()
    with pytest.raises(ValueError, match="option slots must be an integer >= 1"):
        Recompute().plan(profile, peak_memory(profile), slots=value)
