"""The bounds hold for whatever a planner chooses: algorithms, sub-batches, recomputation."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from harness.bounds import algorithm_frontier, lower_bound, min_memory, op_needs, peak_memory, schedule_lower_bound
from harness.model import Algorithm, Profile, Schedule, Stage, Transfer, training_ops
from harness.plugins import registry
from harness.schedules import best_ordered_schedule
from harness.simulate.executor import simulate
from harness.simulate.lowering import pass_sizes
from harness.testing import budgets, chains
from harness.validate import validate


def test_lower_bound_holds_when_an_algorithm_saves_workspace() -> None:
    """M_peak and compute of the bound come from the relaxation, not the default algorithm."""
    stage = Stage("c0", "conv", 1.0, 1.0, 100, 100, 100, fwd_workspace=10_000,
                  algorithms=(Algorithm("lean", 1.1, 1.0, 0, 0),))
    profile = Profile("t", 1, (1,), "x", 10**9, 1.0, 1.0, 0, 100, (stage,))
    budget = min_memory(profile, memory_optimal=True)
    schedule = Schedule("lean", budget, training_ops(1), algorithms=(0,))
    run = simulate(schedule, profile)
    assert run.feasible and not validate(schedule, profile)
    assert lower_bound(profile, budget) <= run.makespan
    assert lower_bound(profile, budget) <= schedule_lower_bound(profile, schedule, budget) <= run.makespan


def test_memory_optimal_minimum_takes_one_algorithm_per_stage() -> None:
    """The default wins forward, the alternative backward: no single choice needs less than 1200."""
    stage = Stage("c0", "conv", 1.0, 1.0, 100, 100, 100, fwd_workspace=1000,
                  algorithms=(Algorithm("a0", 1.0, 1.0, 0, 1000),))
    profile = Profile("t", 1, (1,), "x", 10**9, 1e6, 1e6, 0, 100, (stage,))
    need = min_memory(profile, memory_optimal=True)
    assert need == 1200
    assert simulate(Schedule("t", need, training_ops(1), algorithms=(-1,)), profile).feasible
    for choice in (-1, 0):
        assert not simulate(Schedule("t", need - 1, training_ops(1), algorithms=(choice,)), profile).feasible


def test_uneven_sub_batches_cover_the_batch_exactly() -> None:
    assert pass_sizes(4, 3) == [2, 1, 1] and pass_sizes(8, 2) == [4, 4]
    stage = Stage("s0", "conv", 1.0, 2.0, 400, 400, 400)
    profile = Profile("t", 4, (1,), "x", 10**9, 1e9, 1e9, 0, 400, (stage,))
    run = simulate(Schedule("x", 10**9, training_ops(1, 3), sub_batches=3), profile)
    assert run.compute_time == profile.compute_time  # 2 + 1 + 1 samples, not 3 x 2
    too_many = Schedule("x", 10**9, training_ops(1, 5), sub_batches=5)
    assert "between 1 and the batch size" in str(validate(too_many, profile)[0])


def test_checkpointing_is_judged_by_compute_only() -> None:
    """Recomputation reduces memory without moving data: Prop. 3's transfer term does not apply."""
    stages = tuple(Stage(f"s{i}", "conv", 1.0, 1.0, 1000, 1000, 10) for i in range(4))
    profile = Profile("t", 1, (1,), "x", 10**9, 1.0, 1.0, 0, 10, stages)
    schedule = registry().planner("torch-checkpoint").plan(profile, peak_memory(profile) - 1000)
    run = simulate(schedule, profile)
    assert run.feasible and not validate(schedule, profile)
    assert schedule_lower_bound(profile, schedule, schedule.budget_bytes) <= run.makespan


def test_zero_byte_transfers_wait_like_the_others() -> None:
    """A prefetch waits for its offload and a backward for its prefetch, even when 0 bytes move."""
    stages = (Stage("s0", "conv", 0.1, 1.0, 0, 1000, 0), Stage("s1", "conv", 0.1, 1.0, 0, 1000, 0))
    profile = Profile("t", 1, (1,), "x", 10**9, 1000.0, 1000.0, 0, 0, stages)
    transfers = (Transfer(0, "offload", 0), Transfer(1, "offload", 1, nbytes=0),
                 Transfer(0, "prefetch", 1, "end"), Transfer(1, "prefetch", 1, "end", nbytes=0))
    for duplex in (False, True):
        schedule = Schedule("x", 10**6, training_ops(2), transfers)
        assert simulate(schedule, profile, duplex=duplex).feasible
        assert validate(schedule, profile, duplex=duplex) == []


def test_a_whole_transfer_may_be_written_with_or_without_its_size() -> None:
    stages = (Stage("s0", "conv", 1.0, 1.0, 100, 100, 0), Stage("s1", "conv", 1.0, 1.0, 100, 100, 0))
    profile = Profile("t", 1, (1,), "x", 10**6, 100.0, 100.0, 0, 0, stages)
    schedule = Schedule("x", 10**6, training_ops(2), (Transfer(0, "offload", 0), Transfer(0, "prefetch", 1, nbytes=100)))
    assert validate(schedule, profile) == []


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(profile=chains(max_stages=8))
def test_no_planner_beats_its_schedule_bound(profile: Profile) -> None:
    """Every registered planner, every budget: makespan >= the bound of its own schedule >= LB's relaxation."""
    reg = registry()
    for budget in budgets(profile, 4):
        for name in ("greedy", "dynprog", "modnn", "vdnn-dyn", "vdnnpp-dyn", "torch-checkpoint"):
            if name not in reg.names("planner"):
                continue
            try:
                schedule = reg.planner(name).plan(profile, budget)
            except Exception as exc:  # noqa: BLE001 - refusals are the conformance kit's business
                assert "needs at least" in str(exc) or "infeasible" in str(exc)
                continue
            run = simulate(schedule, profile)
            assert run.feasible, (name, run.message)
            assert run.makespan >= schedule_lower_bound(profile, schedule, budget) * (1 - 1e-9) - 1e-15, name


def test_offload_everything_reaches_the_minimum() -> None:
    stage = Stage("s", "conv", 1.0, 1.0, 100, 100, 100)
    profile = Profile("t", 1, (1,), "x", 10**9, 100.0, 100.0, 0, 100, (stage,) * 4)
    lo = min_memory(profile)
    assert best_ordered_schedule(profile, lo, set(range(4)), planner="t") is not None
    assert best_ordered_schedule(profile, lo - 1, set(range(4)), planner="t") is None


def _with_choice(profile: Profile, choice: tuple[int, ...]) -> Profile:
    """``profile`` with each stage's default replaced by its algorithm ``choice[i]`` (-1: the default)."""
    from dataclasses import replace

    stages = []
    for s, a in zip(profile.stages, choice):
        alg = s.algorithm(a)
        stages.append(replace(s, fwd_time=alg.fwd_time, bwd_time=alg.bwd_time, fwd_workspace=alg.fwd_workspace,
                              bwd_workspace=alg.bwd_workspace, algorithms=()))
    return replace(profile, stages=tuple(stages), variants=())


def _least_bound_over_choices(profile: Profile, budget: int, duplex: bool) -> float:
    """Brute force: Prop. 3 of every choice of algorithms, the least of them."""
    import itertools

    ranges = [range(-1, len(s.algorithms)) for s in profile.stages]
    best = float("inf")
    for choice in itertools.product(*ranges):
        p = _with_choice(profile, choice)
        best = min(best, lower_bound(p, budget, duplex=duplex))
    return best


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains(max_stages=6))
def test_budget_bound_is_the_least_prop3_bound_over_every_algorithm_choice(profile: Profile) -> None:
    """papers/004 Prop. 3 taken over every choice of algorithms, exactly (not a looser relaxation)."""
    lo, hi = min_memory(profile, memory_optimal=True), peak_memory(profile)
    for budget in {lo, (lo + hi) // 2, hi}:
        for duplex in (False, True):
            want = _least_bound_over_choices(profile, budget, duplex)
            assert lower_bound(profile, budget, duplex=duplex) == pytest.approx(want, rel=1e-12)


def test_keep_all_at_the_peak_meets_its_bound_where_a_faster_algorithm_needs_more_workspace() -> None:
    """The measured CPU profile's shape (oneDNN default, a faster native kernel with workspace):
    keep-all at the peak is 1.000 of its own bound, and of the budget's bound where the faster
    kernel does not fit."""
    fast = Algorithm("native", 0.5, 0.5, 4000, 4000)
    stages = (Stage("c0", "conv", 1.0, 1.0, 100, 100, 100, algorithms=(fast,)),
              Stage("c1", "conv", 1.0, 1.0, 100, 100, 100))
    profile = Profile("t", 1, (1,), "x", 10**9, 1e3, 1e3, 0, 100, stages)
    hi = peak_memory(profile)
    keep_all = Schedule("keep-all", hi, training_ops(2))
    run = simulate(keep_all, profile)
    assert run.makespan == profile.compute_time == 4.0
    assert schedule_lower_bound(profile, keep_all, hi) == pytest.approx(run.makespan)
    assert lower_bound(profile, hi) == pytest.approx(run.makespan)  # native cannot run within hi
    # with room for the native kernel, the budget's bound is its time: 3.0, below keep-all
    roomy = peak_memory(_with_choice(profile, (0, -1)))
    assert lower_bound(profile, roomy) == pytest.approx(3.0)


def _profile(d2h: float, h2d: float, algorithms=(), workspace: int = 10**5) -> Profile:
    stages = tuple(Stage(f"s{i}", "conv", 1e-3, 1e-3, 10**6, 10**6, 10**6, fwd_workspace=workspace,
                         algorithms=algorithms) for i in range(6))
    return Profile("t", 1, (1,), "x", 10**12, d2h, h2d, 0, 10**6, stages)


def test_duplex_engines_overlap_the_two_directions_of_the_bound() -> None:
    """Prop. 3 with two engines: the out and back terms overlap, so the bound is at most the one-engine
    bound and at least half of it (each direction still has to move M_peak - M), strictly below it when
    the transfer term dominates; with very unequal links the slower direction alone bounds it."""
    profile = _profile(1e4, 1e7)  # slow device-to-host
    budget = min_memory(profile)
    single, duplex = lower_bound(profile, budget, duplex=False), lower_bound(profile, budget, duplex=True)
    assert single > profile.compute_time  # transfer-bound
    assert duplex < single <= 2 * duplex
    moved = peak_memory(profile) - budget
    assert duplex >= moved / profile.d2h_bandwidth


def test_a_known_peak_does_not_hide_the_algorithm_choices() -> None:
    """lower_bound(m_peak=...) is a shortcut for profiles without algorithms only: with a leaner
    alternative, passing the default keep-all peak must not change the bound (the frontier decides)."""
    lean = Algorithm("lean", 1.5e-3, 1.5e-3, 0, 0)
    profile = _profile(1e5, 1e5, algorithms=(lean,), workspace=10**7)
    assert len(algorithm_frontier(profile)) >= 2  # the lean choices peak lower
    m_peak = peak_memory(profile)
    for budget in (min_memory(profile), (min_memory(profile) + m_peak) // 2):
        assert lower_bound(profile, budget, m_peak=m_peak) == lower_bound(profile, budget)


def test_the_frontier_trades_memory_for_time_only() -> None:
    """algorithm_frontier: ascending peaks, each point strictly faster than the one before (a point
    that is not faster is dominated and not part of the frontier)."""
    fast = Algorithm("fast", 0.5e-3, 0.5e-3, 10**7, 10**7)
    slow_fat = Algorithm("slow-fat", 2e-3, 2e-3, 10**7 // 2, 10**7 // 2)
    profile = _profile(1e5, 1e5, algorithms=(fast, slow_fat))
    points = algorithm_frontier(profile)
    assert len(points) >= 2
    for (p0, c0), (p1, c1) in zip(points, points[1:]):
        assert p0 < p1 and c1 < c0


def test_op_needs_reads_the_algorithm_asked_for() -> None:
    """op_needs(profile, algorithm): for one stage kept whole, the larger need is the simulated keep-all
    peak of the schedule running that algorithm."""
    hungry = Algorithm("hungry", 1e-3, 1e-3, 5 * 10**6, 7 * 10**6)
    stage = Stage("s", "conv", 1e-3, 1e-3, 10**6, 10**6, 10**6, algorithms=(hungry,))
    profile = Profile("t", 1, (1,), "x", 10**12, 1e5, 1e5, 123, 10**6, (stage,))
    for choice in (-1, 0):
        run = simulate(Schedule("k", 10**12, training_ops(1), algorithms=(choice,)), profile)
        assert max(need for _, need in op_needs(profile, [choice])) == run.peak_bytes
