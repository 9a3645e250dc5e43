"""The PyTorch peers as planners: ``torch-save-on-cpu`` and ``torch-checkpoint``.

Their schedules are checked like every planner's (``harness.validate``, papers/004
Prop. 3's lower bound, refusal below the minimum), and the recompute equivalence that
lets the current simulator charge checkpointing is checked against hand-computed
memory and time.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings

from harness.bounds import min_memory, peak_memory
from harness.errors import InfeasibleBudget
from harness.simulate.executor import simulate as simulate_schedule
from harness.simulate.recompute import equivalent
from harness.model import Profile, Stage
from harness.planners.torch_peers import TorchCheckpoint, TorchSaveOnCpu, checkpoint_schedule
from harness.plugins import registry
from harness.simulate.executor import simulate
from harness.testing import PlannerConformance, budgets, chains
from harness.validate import validate

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def uniform_chain(n: int, size: int = 100, fwd: float = 1.0, bwd: float = 2.0) -> Profile:
    """n identical stages: x_i = saved_i = y_i = ``size`` bytes, no workspace, no weights."""
    stage = Stage("s", "conv", fwd, bwd, size, size, size)
    return Profile("uniform", 1, (1,), "synthetic", 10**9, 1e9, 1e9, 0, size, (stage,) * n)


class TestSaveOnCpuConformance(PlannerConformance):
    planner = TorchSaveOnCpu()

    @SETTINGS
    @given(profile=chains())
    def test_peak_budget_reproduces_keep_all(self, profile: Profile) -> None:
        """save_on_cpu's policy ignores the budget: at the peak it still offloads every saved tensor."""
        schedule = self.planner.plan(profile, peak_memory(profile))
        assert set(schedule.offloaded_stages) == {i for i, s in enumerate(profile.stages) if s.saved_bytes > 0}
        run = simulate(schedule, profile)
        assert run.feasible and run.makespan >= profile.compute_time * (1 - 1e-12)


def test_save_on_cpu_waits_for_every_copy():
    profile = uniform_chain(4)
    schedule = TorchSaveOnCpu().plan(profile, peak_memory(profile))
    assert all(tr.wait_op is not None for tr in schedule.transfers)
    run = simulate(schedule, profile)
    # nothing overlaps: every copy (100 bytes at 1e9 B/s) adds to the compute time
    assert math.isclose(run.makespan, profile.compute_time + 8 * 100 / 1e9, rel_tol=1e-12)
    assert schedule.options["mechanism"] == "save_on_cpu"


def test_checkpoint_segments_are_every_k_stages_but_the_last():
    profile = uniform_chain(10)
    schedule = TorchCheckpoint().plan(profile, peak_memory(profile))
    assert schedule.options["every"] == 4  # ceil(sqrt(10))
    assert schedule.options["recompute_segments"] == [[0, 4], [4, 8]]
    assert checkpoint_schedule(profile, 0, 3).options["recompute_segments"] == [[0, 3], [3, 6], [6, 9]]


def test_checkpointing_charges_the_recomputation_and_saves_memory():
    """Four stages of 100 bytes, segment [0, 2) checkpointed (worked out by hand, lowering's model).

    Keep-all: after the forward x0..x3 and the output are held (500); B3 adds y3 and the
    output gradient: 700. Checkpointing drops x1 at the end of F1 (x0 stays: it is the
    checkpoint): 600 at B3. The recomputation of F0, F1 (1 s each) runs before B1.
    """
    profile = uniform_chain(4)
    assert peak_memory(profile) == 700
    schedule = checkpoint_schedule(profile, 10**9, 2)
    run = simulate_schedule(schedule, profile)
    assert run.feasible
    assert run.peak_bytes == 600
    assert math.isclose(run.makespan, profile.compute_time + 2 * 1.0)
    assert TorchCheckpoint().plan(profile, 600, every=2) is not None
    try:
        TorchCheckpoint().plan(profile, 599, every=2)
    except InfeasibleBudget as exc:
        assert "needs at least 600 bytes" in str(exc)
    else:
        raise AssertionError("a checkpointing schedule that needs 600 bytes was accepted for 599")


@SETTINGS
@given(profile=chains(min_stages=2))
def test_checkpoint_equivalent_schedules_validate(profile: Profile):
    for budget in budgets(profile, 4):
        try:
            schedule = TorchCheckpoint().plan(profile, budget)
        except InfeasibleBudget as exc:
            assert "needs at least" in str(exc)
            continue
        eq_schedule, eq_profile = equivalent(schedule, profile)
        problems = validate(eq_schedule, eq_profile, budget)
        assert not problems, [str(p) for p in problems]
        run = simulate_schedule(schedule, profile)
        recomputed = sum(profile.stages[i].fwd_time for i in schedule.options["recompute"])
        # time: exactly the compute plus the recomputed forwards (nothing else moves)
        assert math.isclose(run.makespan, profile.compute_time + recomputed, rel_tol=1e-9, abs_tol=1e-12)
        assert run.peak_bytes <= budget


@SETTINGS
@given(profile=chains(min_stages=1))
def test_checkpoint_auto_is_keep_all_at_the_peak(profile: Profile):
    schedule = TorchCheckpoint().plan(profile, peak_memory(profile), every="auto")
    run = simulate_schedule(schedule, profile)
    assert math.isclose(run.makespan, profile.compute_time, rel_tol=1e-9, abs_tol=1e-15)


@SETTINGS
@given(profile=chains())
def test_peers_refuse_budgets_below_the_minimum(profile: Profile):
    low = min_memory(profile) - 1
    if low < 0:
        return
    for planner in (TorchSaveOnCpu(), TorchCheckpoint()):
        try:
            planner.plan(profile, low)
        except InfeasibleBudget as exc:
            assert "needs at least" in str(exc)
        else:
            raise AssertionError(f"{planner.name} planned below the minimum")


def test_peers_are_registered_built_ins():
    entries = {e.name: e for e in registry().entries("planner")}
    assert entries["torch-save-on-cpu"].plugin == "membudget"
    assert entries["torch-checkpoint"].plugin == "membudget"
