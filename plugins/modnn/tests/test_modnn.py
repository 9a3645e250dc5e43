"""moDNN and vDNN+ against the conformance kit, M_min, and the rules of Algorithm 1."""

from __future__ import annotations

import math
from dataclasses import replace

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


@st.composite
def held_chains(draw, min_stages: int = 1, max_stages: int = 12) -> Profile:
    """``harness.testing.chains`` with ``output_saved_bytes`` set: the part of x_{i+1} that B_i
    needs, held from the end of B_{i+1} until B_i ends (part of stage i+1's saved data, so at
    most its ``saved_bytes``; none for the last stage). Often all of it, often none."""
    profile = draw(chains(min_stages=min_stages, max_stages=max_stages))
    stages = list(profile.stages)
    for i in range(len(stages) - 1):
        room = stages[i + 1].saved_bytes
        held = draw(st.one_of(st.just(room), st.just(0), st.integers(0, room)))
        stages[i] = replace(stages[i], output_saved_bytes=held)
    return replace(profile, stages=tuple(stages))


class _ModnnChecks:
    """moDNN's floor for the kit: M_min (papers/000 eq. 2).

    The kit's default floor is the unsplit chain's minimum, which sub-batching can
    legitimately go below; the lower bound is taken per pass by the kit itself.
    """

    def minimum_budget(self, profile: Profile) -> int:
        return m_min(profile)

    # The kit's checks apply to whatever moDNN returns, its fallback included; that
    # Algorithm 1's own plan runs (no fallback) is test_algorithm_1s_own_plan_runs below.


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


@pytest.mark.parametrize("defragment", ["enough", "all"])
def test_defragmentation_when_no_scheme_exists(defragment: str) -> None:
    """Algorithm 1 line 5: when fragmentation leaves no contiguous scheme, defragment; the plan still runs.

    At the batch's minimum budget the linked list fragments often; every plan that needed
    defragmentation validates, and its notes count the defragmentations. The paper's "offload
    all data" (``all``) moves more, over these chains, than offloading only enough (the default).
    """
    import random

    rng = random.Random(7)
    defragmented = 0
    moved = [0, 0]
    for _ in range(30):
        profile = _random_chain(rng, rng.randint(3, 12))
        budget = min_memory(profile)
        if Algorithm1(profile, budget, defragment=defragment).run().defragmentations == 0:
            continue
        defragmented += 1
        schedule = MoDNN().plan(profile, budget, defragment=defragment)
        assert "defragmentations per pass: 0" not in schedule.notes
        assert not schedule.options["fallback"]
        assert not validate(schedule, profile, budget)
        for k, mode in enumerate(("enough", "all")):
            plan = Algorithm1(profile, budget, defragment=mode).run()
            moved[k] += sum(profile.stages[c.stage].saved_bytes for c in plan.copies)
    assert defragmented >= 3
    assert moved[0] <= moved[1], moved


def test_zero_time_chain_runs_algorithm_1s_plan() -> None:
    """A counterexample Hypothesis found (once pinned as a strict xfail): Algorithm 1 plans it without the fallback."""
    profile = Profile(model='random-chain',batch_size=1,input_shape=(3, 32, 32),device='synthetic',device_memory=10**9,d2h_bandwidth=100000.0,h2d_bandwidth=100000.0,weight_bytes=0,output_bytes=9,stages=(Stage(name='act0',kind='act',fwd_time=0.0,bwd_time=0.0,input_bytes=0,saved_bytes=10,grad_bytes=0,fwd_workspace=0,bwd_workspace=0,algorithms=(),flops=0.0),Stage(name='conv1',kind='conv',fwd_time=0.0,bwd_time=0.0,input_bytes=0,saved_bytes=13,grad_bytes=0,fwd_workspace=0,bwd_workspace=0,algorithms=(),flops=0.0),Stage(name='conv2',kind='conv',fwd_time=0.0,bwd_time=0.0,input_bytes=0,saved_bytes=34,grad_bytes=0,fwd_workspace=0,bwd_workspace=0,algorithms=(),flops=0.0),Stage(name='conv3',kind='conv',fwd_time=0.0,bwd_time=0.0,input_bytes=2,saved_bytes=0,grad_bytes=0,fwd_workspace=0,bwd_workspace=0,algorithms=(),flops=0.0),Stage(name='conv4',kind='conv',fwd_time=0.0,bwd_time=0.0,input_bytes=0,saved_bytes=14,grad_bytes=0,fwd_workspace=0,bwd_workspace=33,algorithms=(),flops=0.0),Stage(name='conv5',kind='conv',fwd_time=0.0,bwd_time=0.0,input_bytes=3,saved_bytes=0,grad_bytes=0,fwd_workspace=0,bwd_workspace=0,algorithms=(),flops=0.0)),dtype='float32',profiler='hypothesis',measured=False,variants=(),notes={})
    schedule = MoDNN().plan(profile, 75)
    assert not validate(schedule, profile)
    assert not schedule.options.get("fallback"), schedule.notes


def _algorithm_1_schedule(profile: Profile, budget: int, duplex: bool = False):
    """Algorithm 1's own plan for eq. (3)'s sub-batch as a schedule (no fallback, no keep-all pass)."""
    from membudget_modnn.subbatch import select_sub_batch

    sb = select_sub_batch(profile, budget, "modnn")
    plan = Algorithm1(sb.profile, budget, duplex).run()
    return MoDNN()._schedule(profile, budget, sb, plan, duplex, True)


def test_tasks_wait_for_the_offloads_that_make_their_room() -> None:
    """Algorithm 1 lines 7-8 / 13-14: a task that had to offload starts when the offload has freed its room.

    A counterexample Hypothesis found: the prefetch of stage 3 is decided at F5 (line 20, its
    memory held from then on in Algorithm 1's model) and queued on the one copy engine
    behind the offload of stage 1; F6 needs the offload of stage 5, queued behind that
    prefetch. Had F6 not waited for it, the simulator's compute stream would have run on
    into the memory held for the prefetch (the simulator reserves it when the copy starts),
    and the run would have stuck: the prefetch waiting for memory, B6 for the offloads
    queued behind it. The schedule makes each such task wait for its offloads.
    """
    profile = Profile(model='random-chain', batch_size=1, input_shape=(3, 32, 32), device='synthetic', device_memory=1000000000, d2h_bandwidth=100000.0, h2d_bandwidth=100000.0, weight_bytes=1, output_bytes=0, stages=(Stage(name='norm0', kind='norm', fwd_time=0.003, bwd_time=0.005118253166591455, input_bytes=0, saved_bytes=1919, grad_bytes=300, fwd_workspace=588, bwd_workspace=224, algorithms=(), flops=0.0), Stage(name='block1', kind='block', fwd_time=0.0, bwd_time=1.175494351e-38, input_bytes=524, saved_bytes=809, grad_bytes=50, fwd_workspace=111, bwd_workspace=31, algorithms=(), flops=0.0), Stage(name='conv2', kind='conv', fwd_time=1.175494351e-38, bwd_time=0.005843764708533504, input_bytes=315, saved_bytes=75, grad_bytes=649, fwd_workspace=674, bwd_workspace=184, algorithms=(), flops=0.0), Stage(name='conv3', kind='conv', fwd_time=0.00040436888789416125, bwd_time=0.0027174136331804366, input_bytes=1482, saved_bytes=2364, grad_bytes=2369, fwd_workspace=685, bwd_workspace=147, algorithms=(), flops=0.0), Stage(name='norm4', kind='norm', fwd_time=0.003, bwd_time=0.0010788644363341645, input_bytes=201, saved_bytes=224, grad_bytes=510, fwd_workspace=88, bwd_workspace=195, algorithms=(), flops=0.0), Stage(name='conv5', kind='conv', fwd_time=0.0013074608718768167, bwd_time=2.2250738585072014e-308, input_bytes=238, saved_bytes=1589, grad_bytes=713, fwd_workspace=256, bwd_workspace=132, algorithms=(), flops=0.0), Stage(name='conv6', kind='conv', fwd_time=0.00026024670911875954, bwd_time=0.000520842050493017, input_bytes=14, saved_bytes=748, grad_bytes=224, fwd_workspace=628, bwd_workspace=532, algorithms=(Algorithm(name='algo0', fwd_time=0.0006506167727968989, bwd_time=0.0013021051262325424, fwd_workspace=0, bwd_workspace=0), Algorithm(name='algo1', fwd_time=0.0005204934182375191, bwd_time=0.001041684100986034, fwd_workspace=172, bwd_workspace=234), Algorithm(name='algo2', fwd_time=0.0003903700636781393, bwd_time=0.0007812630757395255, fwd_workspace=368, bwd_workspace=24)), flops=0.0), Stage(name='block7', kind='block', fwd_time=1e-15, bwd_time=1e-15, input_bytes=409, saved_bytes=256, grad_bytes=532, fwd_workspace=427, bwd_workspace=0, algorithms=(), flops=0.0), Stage(name='conv8', kind='conv', fwd_time=0.0014755206824977269, bwd_time=6.103515625e-05, input_bytes=1, saved_bytes=75, grad_bytes=3, fwd_workspace=541, bwd_workspace=794, algorithms=(), flops=0.0), Stage(name='conv9', kind='conv', fwd_time=1.175494351e-38, bwd_time=0.005843764708533504, input_bytes=315, saved_bytes=75, grad_bytes=649, fwd_workspace=674, bwd_workspace=184, algorithms=(), flops=0.0), Stage(name='conv10', kind='conv', fwd_time=0.0014755206824977269, bwd_time=6.103515625e-05, input_bytes=1, saved_bytes=75, grad_bytes=3, fwd_workspace=541, bwd_workspace=794, algorithms=(), flops=0.0)), dtype='float32', profiler='hypothesis', measured=False, variants=(), notes={})
    budget = 5391
    schedule = _algorithm_1_schedule(profile, budget)
    waits = {(t.stage, t.wait_op) for t in schedule.transfers if t.direction == "offload" and t.wait_op is not None}
    assert (5, 6) in waits  # F6 (operation 6) waits for the offload of stage 5
    run = simulate(schedule, profile, budget=budget)
    assert run.feasible, run.message
    assert not validate(schedule, profile, budget)
    # the simulator agrees with Algorithm 1's clock: nothing ran on memory the plan had not given it
    assert math.isclose(run.makespan, schedule.options["estimated_makespan"], rel_tol=1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(profile=held_chains(min_stages=1, max_stages=12), duplex=st.booleans(), fraction=st.floats(0.0, 0.999))
def test_algorithm_1s_own_plan_runs(profile: Profile, duplex: bool, fraction: float) -> None:
    """Algorithm 1's plan itself (not the offload-all fallback, not a keep-all pass) runs in the
    simulator and validates, on any budget from M_min up to the keep-all peak."""
    low, high = m_min(profile), peak_memory(profile)
    budget = int(low + fraction * (high - low))
    if budget >= high:
        return  # keep-all: nothing for Algorithm 1 to schedule
    schedule = _algorithm_1_schedule(profile, budget, duplex)
    run = simulate(schedule, profile, budget=budget, duplex=duplex, with_trace=False)
    assert run.feasible, run.message
    assert not validate(schedule, profile, budget, duplex=duplex), schedule.notes
    assert not MoDNN().plan(profile, budget, duplex=duplex).options["fallback"]


def _held_chain(stage0: Stage, saved1: int, input1: int, held: int) -> Profile:
    """Two stages; B_0 needs ``held`` bytes of x_1 (stage 0's ``output_saved_bytes``)."""
    s1 = Stage("act1", "act", 0.0, 0.0, input1, saved1, 0)
    return Profile("random-chain", 1, (3, 32, 32), "synthetic", 10**9, 1e5, 1e5, 0, 0,
                   (replace(stage0, output_saved_bytes=held), s1))


def test_the_held_part_of_x_i_comes_down_over_both_of_its_segments() -> None:
    """Counterexample Hypothesis found on held_chains: block 1 is x_1 (1 byte, F_0's output) plus the
    extra saved by F_1 (1 byte); at B_1's end only the 1 byte B_0 needs may stay. Shrinking only
    the first segment left 2 bytes, and B_0's load of saved_0 found no room at M_min."""
    profile = _held_chain(Stage("act0", "act", 0.0, 0.0, 0, 1, 0), saved1=2, input1=1, held=1)
    budget = m_min(profile)
    assert budget == 2
    plan = Algorithm1(profile, budget).run()
    assert plan.copies  # saved_0 goes to the host during F_1 and comes back for B_0
    schedule = MoDNN().plan(profile, budget)
    assert not schedule.options["fallback"], schedule.notes
    assert not validate(schedule, profile, budget)
    run = simulate(schedule, profile, budget=budget)
    assert run.feasible and run.peak_bytes <= budget


def test_b_i_counts_the_held_part_of_x_i_plus_1_when_choosing_its_algorithm() -> None:
    """Counterexample Hypothesis found on held_chains: at F_0 the default algorithm's backward
    workspace (1 byte) seemed to fit B_0, but B_0 also holds x_1 (1 byte) and the budget is 1.
    Algorithm 1 must pick the memory-optimal algo0 (no workspace) for stage 0."""
    stage0 = Stage("conv0", "conv", 0.0, 0.0, 0, 0, 0, 0, 1, algorithms=(Algorithm("algo0", 0.0, 0.0, 0, 0),))
    profile = _held_chain(stage0, saved1=1, input1=0, held=1)
    budget = m_min(profile)
    assert budget == 1
    plan = Algorithm1(profile, budget).run()
    assert plan.algorithms[0] == 0
    schedule = MoDNN().plan(profile, budget)
    assert not schedule.options["fallback"], schedule.notes
    assert not validate(schedule, profile, budget)


def test_linked_list_keep_spans_segments() -> None:
    """LinkedListMemory.keep: the first bytes over all of a block's segments stay, the rest is freed."""
    from membudget_modnn.memory import LinkedListMemory

    mem = LinkedListMemory(100)
    assert mem.alloc(10, 1) and mem.alloc(20, 2) and mem.alloc(30, 1)
    mem.keep(1, 25)  # all of the first segment, 15 of the second
    assert mem.resident(1) == 25 and mem.resident(2) == 20 and mem.used() == 45
    mem.keep(1, 5)
    assert mem.resident(1) == 5 and len(mem.nodes[1]) == 1
    mem.keep(1, 0)
    assert mem.resident(1) == 0 and 1 not in mem.nodes


def test_forced_passes_too_large_for_the_budget_are_refused_with_the_number() -> None:
    """``sub_batches=n`` whose passes' heaviest task (eq. 1) exceeds the budget: InfeasibleBudget,
    not a schedule that cannot run."""
    from harness.errors import InfeasibleBudget
    from harness.model import Profile, Stage
    from membudget_modnn.subbatch import m_min, max_task_bytes

    stages = tuple(Stage(f"s{i}", "conv", 1e-3, 2e-3, 400, 400, 400) for i in range(4))
    profile = Profile("toy", 32, (1,), "synthetic", 10**9, 1e9, 1e9, 100, 100, stages)
    budget = m_min(profile) + 10  # room for sub-batch 1, far from 16
    need = profile.weight_bytes + max_task_bytes(profile.at_batch(16), fastest=False)
    with pytest.raises(InfeasibleBudget, match=f"2 passes of 16 needs at least {need} bytes") as info:
        MoDNN().plan(profile, budget, sub_batches=2)
    assert info.value.needed_bytes == need > budget
    schedule = MoDNN().plan(profile, budget, sub_batches=32)  # passes of 1 fit
    assert simulate(schedule, profile, with_trace=False).feasible


def test_vdnn_plus_refusal_at_sub_batch_1_names_the_bytes_that_would_do() -> None:
    """vDNN+ that does not fit even at sub-batch 1: ``needed_bytes`` is the leanest static vDNN's
    peak at sub-batch 1, and that budget is planned."""
    from harness.errors import InfeasibleBudget
    from harness.model import Profile, Stage
    from harness.testing import check_refusal
    from membudget_modnn.planner import static_vdnn_need

    stages = tuple(Stage(f"s{i}", "conv", 1e-3, 2e-3, 400, 400, 400, fwd_workspace=300) for i in range(4))
    profile = Profile("toy", 4, (1,), "synthetic", 10**9, 1e9, 1e9, 100, 100, stages)
    need = static_vdnn_need(profile.at_batch(1))
    budget = max(m_min(profile), need - 1)
    assert budget < need, "the toy chain must leave vDNN short of M_min's room"
    with pytest.raises(InfeasibleBudget) as caught:
        VDNNPlus().plan(profile, budget)
    check_refusal(caught.value, budget, "vdnn-plus")
    assert caught.value.needed_bytes == need
    assert simulate(VDNNPlus().plan(profile, need), profile, with_trace=False).feasible


@pytest.mark.parametrize("value", ["abc", 0, 1.5, True])
def test_a_bad_sub_batches_is_refused_by_name(value) -> None:
    """QA (2026-11-25): sub_batches="abc" failed inside the planner with Python's own comparison error."""
    profile = _uniform_chain()
    with pytest.raises(ValueError, match="modnn: option sub_batches must be an integer >= 1"):
        MoDNN().plan(profile, (min_memory(profile) + peak_memory(profile)) // 2, sub_batches=value)
