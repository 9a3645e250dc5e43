"""moDNN and vDNN+ against the conformance kit, M_min, and the rules of Algorithm 1."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bounds import min_memory, peak_memory
from harness.errors import InfeasibleBudget
from harness.model import Algorithm, Profile, Stage
from harness.simulate.executor import simulate
from harness.testing import PlannerConformance, budgets, chains
from harness.validate import validate
from membudget_modnn import MoDNN, VDNNPlus, m_min
from membudget_modnn.planner import best_static_vdnn
from membudget_modnn.scheduler import Algorithm1

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))


class _ModnnChecks:
    """moDNN's floor for the kit: M_min (papers/000 eq. 2).

    The kit's default floor is the unsplit chain's minimum, which sub-batching can
    legitimately go below; the lower bound is taken per pass by the kit itself.
    """

    def minimum_budget(self, profile: Profile) -> int:
        return m_min(profile)

    # The kit's checks apply to whatever moDNN returns, its fallback included: on some random
    # chains Algorithm 1's plan does not run in the simulator and moDNN falls back to
    # offload-all (a known defect, pinned by test_zero_time_chain_falls_back below).


class TestModnnConformance(_ModnnChecks, PlannerConformance):
    planner = MoDNN()
    reaches_min_memory = True


class TestModnnSearchConformance(_ModnnChecks, PlannerConformance):
    planner = MoDNN()
    options = {"sub_batch": "search"}
    reaches_min_memory = True


class TestModnnDuplexConformance(_ModnnChecks, PlannerConformance):
    planner = MoDNN()
    options = {"duplex": True}
    duplex = True
    reaches_min_memory = True


class TestVdnnPlusConformance(PlannerConformance):
    """vDNN+ sub-batches with moDNN's selection, so its floor is M_min too."""

    planner = VDNNPlus()

    def minimum_budget(self, profile: Profile) -> int:
        return m_min(profile)


# --------------------------------------------------------------------------- below the batch's minimum

def _below_minimum_budgets(profile: Profile, points: int = 5) -> list[int]:
    lo, hi = m_min(profile), min_memory(profile, memory_optimal=True)
    return sorted({lo + (hi - 1 - lo) * k // (points - 1) for k in range(points)}) if hi > lo else []


@SETTINGS
@given(profile=chains(min_stages=2, max_stages=10), batch=st.sampled_from([4, 8, 16]))
def test_plans_reach_down_to_m_min_where_vdnn_cannot(profile: Profile, batch: int) -> None:
    """Walk budgets from just below the batch's minimum down to M_min (papers/000 eq. 2, Fig. 8).

    moDNN plans every one of them (with more than one pass: the whole batch could not run
    in any of them) and the validator accepts the plans; vDNN without sub-batching
    declares them all infeasible.
    """
    from dataclasses import replace

    profile = replace(profile, batch_size=batch)
    for budget in _below_minimum_budgets(profile):
        schedule = MoDNN().plan(profile, budget)
        assert schedule.sub_batches > 1
        assert not schedule.options["fallback"], schedule.notes
        assert not validate(schedule, profile, budget), schedule.notes
        assert best_static_vdnn(profile, budget) is None
        assert simulate(schedule, profile).peak_bytes <= budget


def test_m_min_is_reached_exactly() -> None:
    """At M_min itself the plan has one sample per pass and runs; one byte less is refused."""
    profile = _uniform_chain(batch=8)
    budget = m_min(profile)
    schedule = MoDNN().plan(profile, budget)
    assert schedule.sub_batches == 8
    assert not validate(schedule, profile, budget)
    with pytest.raises(InfeasibleBudget, match=str(budget)):
        MoDNN().plan(profile, budget - 1)


# --------------------------------------------------------------------------- Algorithm 1

def _uniform_chain(n: int = 8, batch: int = 4, size: int = 1000, time: float = 1e-3, bw: float = 1e7,
                   algorithms: tuple[Algorithm, ...] = ()) -> Profile:
    stages = tuple(
        Stage(f"conv{i}", "conv", time, 2 * time, size, size, size, algorithms=algorithms) for i in range(n)
    )
    return Profile("uniform", batch, (1,), "synthetic", 10**9, bw, bw, 100, size, stages)


def test_estimate_matches_the_simulator_on_a_plain_chain() -> None:
    """Algorithm 1's own clock (its record of both streams) is the simulator's on a chain it plans."""
    profile = _uniform_chain(n=12)
    for budget in budgets(profile, 6)[:-1]:
        schedule = MoDNN().plan(profile, budget)
        run = simulate(schedule, profile)
        assert math.isclose(run.makespan, schedule.options["estimated_makespan"], rel_tol=1e-9)


def test_offloads_only_when_an_allocation_fails() -> None:
    """Enough memory for everything but one saved block: moDNN moves exactly one block, out and back."""
    profile = _uniform_chain(n=8)
    budget = peak_memory(profile) - 1
    schedule = MoDNN().plan(profile, budget)
    assert schedule.sub_batches == 1
    assert len(schedule.offloaded_stages) == 1
    run = simulate(schedule, profile)
    assert run.moved_bytes == 2 * profile.stages[0].saved_bytes
    assert math.isclose(run.makespan, profile.compute_time)  # the transfer hides behind compute


def test_the_block_needed_last_is_offloaded_first() -> None:
    """Among schemes without delay, the one whose data is needed again latest (stage 0) wins."""
    profile = _uniform_chain(n=8)
    schedule = MoDNN().plan(profile, peak_memory(profile) - 1)
    assert schedule.offloaded_stages == (0,)


def test_prefetch_starts_just_in_time() -> None:
    """eq. (4): a prefetch is issued at the last task before which waiting would delay its task."""
    profile = _uniform_chain(n=8, bw=2e6)  # a 1000-byte copy takes 0.5 ms, a backward 2 ms
    schedule = MoDNN().plan(profile, peak_memory(profile) - 1)
    (prefetch,) = [t for t in schedule.transfers if t.direction == "prefetch"]
    b = [k for k, op in enumerate(schedule.ops) if op.kind == "B" and op.stage == prefetch.stage][0]
    # issued during B_1, the task just before B_0: after B_1 it would be 0.5 ms late
    assert (prefetch.issue_op, prefetch.issue_at) == (b - 1, "start")
    assert math.isclose(simulate(schedule, profile).makespan, profile.compute_time)


def test_faster_algorithm_is_chosen_when_its_workspace_is_free() -> None:
    """eq. (5): the gain of a faster algorithm whose workspace fits is its time saving."""
    algos = (Algorithm("implicit", 2e-3, 4e-3, 0, 0), Algorithm("fast", 1e-3, 2e-3, 200, 200))
    profile = _uniform_chain(n=6, algorithms=algos)
    budget = peak_memory(profile) - 1
    schedule = MoDNN().plan(profile, budget)
    assert set(schedule.algorithms) <= {-1, 1}  # the default or "fast", equally quick; never "implicit"


def test_workspace_that_forces_a_delaying_offload_loses_to_the_baseline() -> None:
    """eq. (5): T_off,alg counts; a workspace whose offload delays the task more than it saves is not taken.

    Stages 0 and 1 find room for the fast algorithm's workspace; from stage 2 on it needs
    an offload first. With a slow link that offload costs a second against 0.3 ms saved,
    and the baseline wins; with a fast link it hides behind compute and "fast" wins.
    """
    algos = (Algorithm("implicit", 1.0e-3, 2.0e-3, 0, 0), Algorithm("fast", 0.9e-3, 1.8e-3, 900, 900))
    chosen = {}
    for bw in (1e3, 1e12):
        profile = _uniform_chain(n=4, bw=bw, algorithms=algos)
        chosen[bw] = Algorithm1(profile, budget=min_memory(profile, memory_optimal=True) + 500).run().algorithms
    assert chosen[1e3][:2] == (1, 1) and 1 not in chosen[1e3][2:]
    assert chosen[1e12][2] == 1


def test_planning_is_deterministic_and_reports_its_sub_batch() -> None:
    profile = _uniform_chain(n=10, batch=16)
    budget = (m_min(profile) + min_memory(profile)) // 2
    a, b = MoDNN().plan(profile, budget), MoDNN().plan(profile, budget)
    assert a == b
    assert a.options["sub_batch"] == math.ceil(16 / a.sub_batches)
    assert "sub-batch" in a.notes and "M_min" in a.notes


def test_registers_both_planners_and_the_models() -> None:
    from harness.plugins import registry

    reg = registry(reload=True)
    planners = {e.name: e for e in reg.entries("planner")}
    assert planners["modnn"].plugin == "membudget-modnn"
    assert planners["vdnn-plus"].plugin == "membudget-modnn"
    assert {e.name for e in reg.entries("model")} >= {"modnn"}


def _random_chain(rng, n: int) -> Profile:
    stages = tuple(
        Stage(f"s{i}", rng.choice(["conv", "act", "pool"]), rng.uniform(0, 2e-3), rng.uniform(0, 4e-3),
              rng.randint(0, 4000), rng.randint(0, 5000), rng.randint(0, 4000), rng.randint(0, 900),
              rng.randint(0, 500))
        for i in range(n)
    )
    return Profile("random", 4, (1,), "synthetic", 10**9, rng.uniform(1e5, 1e7), rng.uniform(1e5, 1e7),
                   rng.randint(0, 500), rng.randint(0, 300), stages)


def test_defragmentation_when_no_scheme_exists() -> None:
    """Algorithm 1 line 5: when fragmentation leaves no contiguous scheme, defragment; the plan still runs.

    At the batch's minimum budget the linked list fragments often; every plan that needed
    defragmentation validates, and its notes count the defragmentations.
    """
    import random

    rng = random.Random(7)
    defragmented = 0
    for _ in range(30):
        profile = _random_chain(rng, rng.randint(3, 12))
        budget = min_memory(profile)
        if Algorithm1(profile, budget).run().defragmentations == 0:
            continue
        defragmented += 1
        schedule = MoDNN().plan(profile, budget)
        assert "defragmentations per pass: 0" not in schedule.notes
        assert not schedule.options["fallback"]
        assert not validate(schedule, profile, budget)
    assert defragmented >= 3


@pytest.mark.xfail(strict=True, reason="known defect: on some random chains (this one: every operation "
                   "takes zero time) Algorithm 1's plan does not run in the simulator and moDNN falls back "
                   "to offload-all")
def test_zero_time_chain_falls_back() -> None:
    """A counterexample Hypothesis found (pinned): Algorithm 1 should plan it without the fallback."""
    profile = Profile(model='random-chain',batch_size=1,input_shape=(3, 32, 32),device='synthetic',device_memory=10**9,d2h_bandwidth=100000.0,h2d_bandwidth=100000.0,weight_bytes=0,output_bytes=9,stages=(Stage(name='act0',kind='act',fwd_time=0.0,bwd_time=0.0,input_bytes=0,saved_bytes=10,grad_bytes=0,fwd_workspace=0,bwd_workspace=0,algorithms=(),flops=0.0),Stage(name='conv1',kind='conv',fwd_time=0.0,bwd_time=0.0,input_bytes=0,saved_bytes=13,grad_bytes=0,fwd_workspace=0,bwd_workspace=0,algorithms=(),flops=0.0),Stage(name='conv2',kind='conv',fwd_time=0.0,bwd_time=0.0,input_bytes=0,saved_bytes=34,grad_bytes=0,fwd_workspace=0,bwd_workspace=0,algorithms=(),flops=0.0),Stage(name='conv3',kind='conv',fwd_time=0.0,bwd_time=0.0,input_bytes=2,saved_bytes=0,grad_bytes=0,fwd_workspace=0,bwd_workspace=0,algorithms=(),flops=0.0),Stage(name='conv4',kind='conv',fwd_time=0.0,bwd_time=0.0,input_bytes=0,saved_bytes=14,grad_bytes=0,fwd_workspace=0,bwd_workspace=33,algorithms=(),flops=0.0),Stage(name='conv5',kind='conv',fwd_time=0.0,bwd_time=0.0,input_bytes=3,saved_bytes=0,grad_bytes=0,fwd_workspace=0,bwd_workspace=0,algorithms=(),flops=0.0)),dtype='float32',profiler='hypothesis',measured=False,variants=(),notes={})
    schedule = MoDNN().plan(profile, 75)
    assert not validate(schedule, profile)  # the fallback is valid...
    assert not schedule.options.get("fallback"), schedule.notes  # ...but Algorithm 1's plan should be
