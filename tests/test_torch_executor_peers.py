"""The PyTorch peers as planners: ``torch-save-on-cpu`` and ``torch-checkpoint``.

Their schedules are checked like every planner's (``harness.validate``, papers/004
Prop. 3's lower bound, refusal below the minimum), and checkpointing's recompute
operations are checked against hand-computed memory and time.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings

from harness.bounds import min_memory, peak_memory
from harness.errors import InfeasibleBudget
from harness.simulate.executor import simulate as simulate_schedule
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
    assert {op.kind for op in schedule.ops} == {"F", "B"}


def test_checkpoint_segments_are_every_k_stages_but_the_last():
    profile = uniform_chain(10)
    schedule = TorchCheckpoint().plan(profile, peak_memory(profile))
    assert schedule.options["every"] == 4  # ceil(sqrt(10))
    assert schedule.recomputed_stages == tuple(range(8))  # [0, 4) and [4, 8)
    forward = [op.kind for op in schedule.ops if op.is_forward]
    assert forward == ["Fc", "Fn", "Fn", "Fn", "Fc", "Fn", "Fn", "Fn", "F", "F"]
    backward = [op.label for op in schedule.ops if not op.is_forward]
    assert backward == ["B9", "B8", "R4", "R5", "R6", "R7", "B7", "B6", "B5", "B4", "R0", "R1", "R2", "R3",
                        "B3", "B2", "B1", "B0"]
    assert checkpoint_schedule(profile, 0, 3).recomputed_stages == tuple(range(9))


def test_checkpointing_charges_the_recomputation_and_saves_memory():
    """Four stages of 100 bytes, segment [0, 2) checkpointed (worked out by hand, lowering's model).

    Keep-all: after the forward x0..x3 and the output are held (500); B3 adds y3 and the
    output gradient: 700. Checkpointing drops x1 at the end of Fn1 (x0 stays: Fc0 keeps it,
    the checkpoint): 600 at B3. R0 and R1 (1 s each) run before B1: after B2 x0 and y2
    are held (200); R0 re-creates x1 (300), R1 x2, freed at its end (x2 is not what B1
    needs here); B1 adds y1 (400).
    """
    profile = uniform_chain(4)
    assert peak_memory(profile) == 700
    schedule = checkpoint_schedule(profile, 10**9, 2)
    run = simulate_schedule(schedule, profile)
    assert run.feasible
    assert run.peak_bytes == 600
    assert math.isclose(run.makespan, profile.compute_time + 2 * 1.0)
    held = {e.label: sum(b.size for b in run.trace if b.alloc <= (e.start + e.end) / 2 < b.free)
            for e in run.timeline}
    assert (held["R0"], held["R1"], held["B1"]) == (300, 400, 400)
    assert not validate(schedule, profile, 600)
    assert TorchCheckpoint().plan(profile, 600, every=2) is not None
    try:
        TorchCheckpoint().plan(profile, 599, every=2)
    except InfeasibleBudget as exc:
        assert "needs at least 600 bytes" in str(exc)
    else:
        raise AssertionError("a checkpointing schedule that needs 600 bytes was accepted for 599")


@SETTINGS
@given(profile=chains(min_stages=2))
def test_checkpoint_schedules_validate(profile: Profile):
    for budget in budgets(profile, 4):
        try:
            schedule = TorchCheckpoint().plan(profile, budget)
        except InfeasibleBudget as exc:
            assert "needs at least" in str(exc)
            continue
        problems = validate(schedule, profile, budget)
        assert not problems, [str(p) for p in problems]
        run = simulate_schedule(schedule, profile)
        assert run.moved_bytes == 0
        recomputed = sum(profile.stages[i].fwd_time for i in schedule.recomputed_stages)
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
