"""Recomputation as operations (``Fc``, ``Fn``, ``R``): validated, simulated, bounded, alone and
combined with offloading and with sub-batches (papers/004 section 7: offloading and
checkpointing are complementary)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings

from harness.bounds import schedule_lower_bound
from harness.errors import InfeasibleBudget
from harness.model import Op, Profile, Schedule, Stage, Transfer, training_ops
from harness.planners.torch_peers import TorchCheckpoint, checkpoint_schedule
from harness.schedules import ordered_schedule, recompute_ops
from harness.simulate.executor import simulate, timing
from harness.testing import budgets, chains
from harness.validate import validate

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def uniform_chain(n: int, size: int = 100) -> Profile:
    """n stages of 100 bytes (x_i = saved_i = y_i), F 1 s, B 2 s, 1e9 B/s each way, no weights."""
    stage = Stage("s", "conv", 1.0, 2.0, size, size, size)
    return Profile("uniform", 4, (1,), "synthetic", 10**9, 1e9, 1e9, 0, size, (stage,) * n)


def messages(problems) -> str:
    return " | ".join(str(p) for p in problems)


def test_recompute_ops_say_checkpointing():
    ops = recompute_ops(4, [(0, 2)])
    assert [op.label for op in ops] == ["Fc0", "Fn1", "F2", "F3", "B3", "B2", "R0", "R1", "B1", "B0"]
    assert Schedule("t", 0, ops).recomputed_stages == (0, 1)


def test_offloading_and_recomputing_together_fit_where_neither_alone_does():
    """Worked by hand (harness.memory's rules) on four 100-byte stages under 500 bytes.

    Checkpointing [0, 2) alone peaks at 600 (B3: x0, x2, x3, the output, y3 and the output
    gradient). Offloading stage 2 as well releases x2 when F2 ends: 500 at B3. Its prefetch
    waits for B3 to free 300 bytes, then B2 waits for it (1e-7 s); R0 and R1 add 2 s.
    """
    profile = uniform_chain(4)
    checkpoint = checkpoint_schedule(profile, 500, 2)
    assert simulate(checkpoint, profile, budget=float("inf")).peak_bytes == 600
    assert not simulate(checkpoint, profile).feasible
    both = ordered_schedule(profile, 500, {2}, planner="both", recompute=[(0, 2)])
    assert [op.label for op in both.ops] == [op.label for op in checkpoint.ops]
    assert both.offloaded_stages == (2,) and both.recomputed_stages == (0, 1)
    assert not validate(both, profile), messages(validate(both, profile))
    run = simulate(both, profile)
    assert run.feasible and run.peak_bytes == 500
    assert run.moved_bytes == 200
    assert math.isclose(run.makespan, profile.compute_time + 2.0 + 100 / 1e9, rel_tol=1e-12)
    _, reference = timing(both, profile, engine="reference")
    assert reference.peak == 500 and math.isclose(float(reference.op_end.max()), run.makespan, rel_tol=1e-12)
    # the bound of a pass that recomputes is its compute, recomputations included
    assert math.isclose(schedule_lower_bound(profile, both, 500), profile.compute_time + 2.0)


def test_recomputing_with_sub_batches():
    """Each pass has its own recomputations; every pass is charged its own."""
    profile = uniform_chain(4)
    schedule = ordered_schedule(profile, 10**9, {3}, planner="sb", sub_batches=2, recompute=[(0, 3)])
    assert sum(op.kind == "R" for op in schedule.ops) == 6
    assert not validate(schedule, profile), messages(validate(schedule, profile))
    run = simulate(schedule, profile)
    half = profile.at_batch(2)
    recomputed = 2 * sum(s.fwd_time for s in half.stages[:3])
    assert run.feasible and run.makespan >= 2 * half.compute_time + recomputed - 1e-12
    assert math.isclose(run.compute_time, 2 * half.compute_time + recomputed, rel_tol=1e-12)


@SETTINGS
@given(profile=chains(min_stages=3))
def test_combined_schedules_validate_and_both_simulators_agree(profile: Profile):
    n = profile.n_stages
    segment = (0, max(1, n // 2))
    offload = {i for i in range(segment[1], n - 1) if profile.stages[i].saved_bytes > 0}
    for budget in budgets(profile, 3):
        schedule = ordered_schedule(profile, budget, offload, planner="both", recompute=[segment])
        problems = validate(schedule, profile)
        kernel = simulate(schedule, profile)
        if problems:
            assert not kernel.feasible, messages(problems)
            continue
        _, reference = timing(schedule, profile, engine="reference")
        assert kernel.feasible and reference.peak == kernel.peak_bytes <= budget
        assert math.isclose(float(max(reference.op_end.max(), reference.tr_end.max(initial=0.0))),
                            kernel.makespan, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("ops, expected", [
    ((Op("F", 0), Op("F", 1), Op("R", 1), Op("B", 1), Op("B", 0)), "R1 recomputes what F1 saved"),
    ((Op("F", 0), Op("Fc", 1), Op("B", 1), Op("B", 0)), "Fc1 does not save for B1 and no R1"),
    ((Op("Fn", 0), Op("F", 1), Op("B", 1), Op("R", 0), Op("B", 0)), "Fn0 drops the batch"),
    ((Op("F", 0), Op("Fn", 1), Op("R", 1), Op("B", 1), Op("B", 0)), "only a recomputation of stage 0"),
    ((Op("Fc", 0), Op("R", 0), Op("F", 1), Op("B", 1), Op("B", 0)), "R0 runs before the forward pass is over"),
    ((Op("Fc", 0), Op("Fn", 1), Op("R", 1), Op("R", 0), Op("B", 1), Op("B", 0)), "R1 runs before R0"),
    ((Op("Fc", 0), Op("F", 1), Op("B", 1), Op("B", 0), Op("R", 0)), "R0 runs after B0"),
])
def test_the_validator_refuses_recomputations_out_of_place(ops, expected):
    profile = uniform_chain(2)
    assert expected in messages(validate(Schedule("t", 10**9, ops), profile))


def test_a_recomputed_stage_cannot_be_offloaded():
    """Fn1 keeps nothing to move; Fc0's checkpoint may move, but must be back before R0 (op 4)."""
    profile = uniform_chain(3)
    ops = recompute_ops(3, [(0, 2)])
    transfers = (Transfer(1, "offload", 1, "start"), Transfer(1, "prefetch", 3, "start"))
    assert "stage 1, which is recomputed" in messages(validate(Schedule("t", 10**9, ops, transfers), profile))
    checkpoint = (Transfer(0, "offload", 0, "start"), Transfer(0, "prefetch", 3, "start", 4))
    assert validate(Schedule("t", 10**9, ops, checkpoint), profile) == []
    late = (Transfer(0, "offload", 0, "start"), Transfer(0, "prefetch", 4, "end"))
    assert "no earlier than R0" in messages(validate(Schedule("t", 10**9, ops, late), profile))
    bigger = (Transfer(0, "offload", 0, "start", None, 0, 101), Transfer(0, "prefetch", 3, "start", 4, 0, 101))
    assert "101 bytes of a 100-byte checkpoint" in messages(validate(Schedule("t", 10**9, ops, bigger), profile))


def test_torch_checkpoint_schedules_are_recompute_operations():
    profile = uniform_chain(9)
    schedule = TorchCheckpoint().plan(profile, 10**9)
    assert schedule.recomputed_stages == tuple(range(6))
    assert not schedule.transfers and "recompute_segments" not in schedule.options
    run = simulate(schedule, profile)
    # nothing moves: the dropping and the rebuilding are the operations' own
    assert run.moved_bytes == 0 and not [e for e in run.timeline if e.stream != "compute"]
    assert math.isclose(run.makespan, profile.compute_time + 6 * 1.0)
    with pytest.raises(InfeasibleBudget):
        TorchCheckpoint().plan(profile, run.peak_bytes - 1, every=3)
    assert Schedule("keep", 0, training_ops(9)).recomputed_stages == ()


def test_the_validator_checks_each_operation_had_what_it_needs():
    """Its own rule, not harness.memory's: a trace without the checkpoint x_0 and the x_1 that R0
    re-creates leaves R0 with y_2 only (100 of the 200 bytes it needs: x_0, x_1) and B1 with y_2, y_1
    (200 of 300: saved_1, y_2, y_1)."""
    from dataclasses import replace

    from harness.validate import check_run

    profile = uniform_chain(4)
    schedule = checkpoint_schedule(profile, 10**9, 2)
    run = simulate(schedule, profile)
    assert not check_run(schedule, profile, run, 10**9)
    doctored = replace(run, trace=tuple(b for b in run.trace if b.name not in ("x1", "x0.checkpoint")))
    found = messages(check_run(schedule, profile, doctored, 10**9))
    assert "R0 runs with 100 bytes on the device, less than the 200 it needs" in found
    assert "B1 runs with 200 bytes on the device, less than the 300 it needs" in found
