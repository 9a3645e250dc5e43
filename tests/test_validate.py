"""The validator catches broken schedules and broken runs, whoever made them."""

from __future__ import annotations

import dataclasses
import random

from harness.bounds import min_memory, peak_memory
from harness.model import MemoryBlock, Op, Profile, Schedule, Stage, Transfer, training_ops
from harness.schedules import best_ordered_schedule, ordered_schedule
from harness.simulate.executor import simulate
from harness.validate import check_needs, check_run, validate
from tests.test_simulate import random_chain, two_stage_chain


def messages(problems) -> str:
    return " | ".join(str(p) for p in problems)


def good_schedule():
    profile = random_chain(random.Random(5), 6)
    budget = min_memory(profile)
    return profile, best_ordered_schedule(profile, budget, set(range(6)), planner="t")


def test_a_good_schedule_has_no_violations() -> None:
    profile, schedule = good_schedule()
    assert validate(schedule, profile) == []


def test_missing_duplicate_and_misordered_operations() -> None:
    profile = two_stage_chain()
    ops = training_ops(2)
    assert "B0 of sub-batch 0 is missing" in messages(validate(Schedule("t", 10**6, ops[:-1]), profile))
    assert "appears 2 times" in messages(validate(Schedule("t", 10**6, ops + ops[-1:]), profile))
    swapped = (ops[1], ops[0]) + ops[2:]
    assert "F1 runs before F0" in messages(validate(Schedule("t", 10**6, swapped), profile))
    early_b = (ops[0], Op("B", 0), ops[1], ops[2])
    assert "B0 runs before B1" in messages(validate(Schedule("t", 10**6, early_b), profile))


def test_transfers_that_break_the_rules() -> None:
    profile = two_stage_chain()
    ops = training_ops(2)  # F0 F1 B1 B0
    cases = {
        "issued before F1 produces": (Transfer(1, "offload", 0), Transfer(1, "prefetch", 2)),
        "never prefetched": (Transfer(0, "offload", 0),),
        "never offloaded": (Transfer(0, "prefetch", 1),),
        "no earlier than B0": (Transfer(0, "offload", 0), Transfer(0, "prefetch", 3)),
        "issued after B0 consumed the data": (Transfer(0, "offload", 3, issue_at="end"), Transfer(0, "prefetch", 2)),
        "prefetched before it is offloaded": (Transfer(0, "prefetch", 2), Transfer(0, "offload", 0)),
        "does not exist": (Transfer(5, "offload", 0),),
        "moves 999 bytes": (Transfer(0, "offload", 0, nbytes=999), Transfer(0, "prefetch", 2, nbytes=999)),
        "different amounts": (Transfer(0, "offload", 0, nbytes=10), Transfer(0, "prefetch", 2, nbytes=20)),
    }
    for expected, transfers in cases.items():
        found = messages(validate(Schedule("t", 10**6, ops, transfers), profile))
        assert expected in found, (expected, found)


def test_over_budget_is_reported_with_the_blocked_operation() -> None:
    profile = two_stage_chain()
    schedule = ordered_schedule(profile, 150, {0: None}, planner="t", prefetch_window=1)
    found = messages(validate(schedule, profile))
    assert "cannot run within the budget" in found and "F0" in found


def test_a_run_that_lies_is_caught() -> None:
    """check_run recomputes from the profile: a doctored timeline or trace fails."""
    profile, schedule = good_schedule()
    run = simulate(schedule, profile, engine="reference")
    assert check_run(schedule, profile, run, schedule.budget_bytes) == []
    timeline = list(run.timeline)
    first_b = next(k for k, e in enumerate(timeline) if e.label.startswith("B"))
    timeline[first_b] = dataclasses.replace(timeline[first_b], end=timeline[first_b].end + 1.0)
    found = messages(check_run(schedule, profile, dataclasses.replace(run, timeline=tuple(timeline)),
                               schedule.budget_bytes))
    assert "lasts" in found
    fat = dataclasses.replace(run.trace[0], size=run.trace[0].size + 10**9)
    found = messages(check_run(schedule, profile, dataclasses.replace(run, trace=(fat,) + run.trace[1:]),
                               schedule.budget_bytes))
    assert "above the budget" in found
    shifted = []
    for e in run.timeline:
        shifted.append(dataclasses.replace(e, start=e.start - 5, end=e.end - 5) if e.label.startswith("prefetch") else e)
    found = messages(check_run(schedule, profile, dataclasses.replace(run, timeline=tuple(shifted)),
                               schedule.budget_bytes))
    assert "before it is issued" in found or "before the data reached the host" in found


def test_keep_all_at_peak_validates_and_below_peak_does_not() -> None:
    profile = random_chain(random.Random(9), 8)
    peak = peak_memory(profile)
    schedule = Schedule("keep-all", peak, training_ops(8))
    assert validate(schedule, profile) == []
    assert validate(schedule, profile, peak - 1)


def test_a_checkpoint_back_after_its_recomputation_is_caught() -> None:
    """check_run's own rule: R_i reads the checkpoint, so its prefetch must be over before R_i starts
    (a run whose R0 starts before the copy ends is refused, even though B0 comes later)."""
    from tests.test_memory import checkpoint_offload_schedule

    profile, schedule = checkpoint_offload_schedule(400)
    run = simulate(schedule, profile)
    assert check_run(schedule, profile, run, 400) == []
    r0 = [k for k, e in enumerate(run.timeline) if e.label == "R0"][0]
    early = dataclasses.replace(run.timeline[r0], start=5.5, end=6.5)
    lying = dataclasses.replace(run, timeline=run.timeline[:r0] + (early,) + run.timeline[r0 + 1:])
    assert "R0 starts before its checkpoint is back" in messages(check_run(schedule, profile, lying, 400))


def test_durations_are_judged_at_the_clock_s_own_precision() -> None:
    """A 1 kB/s host link puts the backward pass 40000 s in: 2.7 ms read off that clock is off by more than
    the old 1e-12 s, and valid schedules were refused ("B2 lasts 0.0027s, the profile says 0.0027s", found by
    a QA fuzzer). A duration 1 us off is still caught there."""
    from harness.model import Profile, Stage

    stage = Stage("s", "conv", 1.3e-3, 2.7e-3, 10**7, 10**7, 10**7)
    profile = Profile("slow-link", 1, (1,), "synthetic", 10**12, 1e3, 1e3, 0, 0, (stage,) * 6)
    budget = min_memory(profile) + (peak_memory(profile) - min_memory(profile)) // 4
    schedule = best_ordered_schedule(profile, budget, {i: None for i in range(4)}, planner="t")
    run = simulate(schedule, profile, engine="reference")
    late = [k for k, e in enumerate(run.timeline) if e.stream == "compute" and e.start > 4000]
    assert late and check_run(schedule, profile, run, budget) == []
    timeline = list(run.timeline)
    timeline[late[0]] = dataclasses.replace(timeline[late[0]], end=timeline[late[0]].end + 1e-6)
    assert "lasts" in messages(check_run(schedule, profile, dataclasses.replace(run, timeline=tuple(timeline)),
                                         budget))


def test_parts_of_the_wrong_kind_are_named_before_any_rule_reads_them() -> None:
    """QA: ``Transfer(1, "sideways", ...)`` was told "offload 1 starts before the data reached the host",
    ``issue_at="middle"`` "starts before it is issued", and a bool stage or 1000.5 bytes passed. NumPy's ints are
    ints."""
    import numpy as np

    profile = two_stage_chain()
    ops = training_ops(2)  # F0 F1 B1 B0
    cases = {
        "transfer 0 has direction 'sideways', not 'offload' or 'prefetch'": (Transfer(1, "sideways", 1),),
        "transfer 0 is issued at the 'middle' of its operation, not its 'start' or 'end'":
            (Transfer(0, "offload", 0, "middle"), Transfer(0, "prefetch", 2)),
        "transfer 1 has stage True, not an int": (Transfer(0, "offload", 0), Transfer(True, "prefetch", 2)),
        "transfer 0 has nbytes 1000.5, not an int or None": (Transfer(0, "offload", 0, nbytes=1000.5),),
    }
    for expected, transfers in cases.items():
        assert messages(validate(Schedule("t", 10**6, ops, transfers), profile)) == expected
    numpy_ints = (Transfer(np.int64(0), "offload", np.int32(0), nbytes=np.int64(10)),
                  Transfer(0, "prefetch", np.int64(2), nbytes=10))
    assert validate(Schedule("t", 10**6, ops, numpy_ints), profile) == []
    assert messages(validate(Schedule("t", 10**6, ops, algorithms=(0,)), profile)) == \
        "algorithms lists 1 entries for 2 stages"
    swapped = (ops[1], ops[0]) + ops[2:]  # and an order violation found before it is kept beside it
    assert messages(validate(Schedule("t", 10**6, swapped, algorithms=(0,)), profile)) == \
        "F1 runs before F0, whose output it reads (stage 1) | algorithms lists 1 entries for 2 stages"


def test_a_run_whose_copies_overlap_on_one_engine_is_caught() -> None:
    """check_run's rule of one copy at a time per engine (papers/004 section 3.1: a single link; two with
    ``duplex``, one per direction): a timeline whose second offload starts inside the first is refused."""
    profile, schedule = good_schedule()
    run = simulate(schedule, profile, engine="reference")
    assert check_run(schedule, profile, run, schedule.budget_bytes) == []
    copies = [k for k, e in enumerate(run.timeline) if e.label.startswith("offload")]
    first, second = run.timeline[copies[0]], run.timeline[copies[1]]
    assert second.start >= first.end  # the simulator's own run keeps them apart
    timeline = list(run.timeline)
    moved = (first.start + first.end) / 2
    timeline[copies[1]] = dataclasses.replace(second, start=moved, end=moved + (second.end - second.start))
    found = messages(check_run(schedule, profile, dataclasses.replace(run, timeline=tuple(timeline)),
                               schedule.budget_bytes))
    assert "two copies overlap on the copy engine" in found


def test_a_backward_without_the_part_of_the_next_input_it_needs_is_caught() -> None:
    """check_needs counts what B_i reads of x_{i+1} (``output_saved_bytes``, eq. (6)'s terms). A trace that
    holds, over B1, exactly what B1 needs passes; the same trace without that part of x2 is refused."""
    from harness.model import MemoryBlock
    from harness.validate import check_needs

    profile = random_chain(random.Random(5), 3)
    s1, s2 = profile.stages[1], profile.stages[2]
    assert s1.output_saved_bytes > 0  # B1 reads part of x2 (a trailing ReLU's mask, say)
    schedule = Schedule("keep-all", peak_memory(profile), training_ops(3))
    run = simulate(schedule, profile, engine="reference")
    compute = [e for e in run.timeline if e.stream == "compute"]
    b1 = next(e for e in compute if e.label == "B1")
    parts = {"weights": profile.weight_bytes, "saved1": s1.saved_bytes, "x2.held": s1.output_saved_bytes,
             "y2": s2.grad_bytes, "y1": s1.grad_bytes, "wB1": s1.bwd_workspace}
    exact = tuple(MemoryBlock(k, name, size, b1.start, b1.end) for k, (name, size) in enumerate(parts.items()))

    def b1_refused(trace) -> bool:
        found = check_needs(schedule, [profile], dataclasses.replace(run, trace=trace), compute)
        return any(v.message.startswith("B1 runs with") for v in found)

    assert not b1_refused(exact)
    assert b1_refused(tuple(b for b in exact if b.name != "x2.held"))


def test_a_lowering_that_splits_the_batch_wrongly_is_caught(monkeypatch) -> None:
    """The validator derives the sub-batch passes itself: a lowering whose split puts the larger
    pass last (batch 4 in 3 passes as 1, 1, 2 instead of 2, 1, 1) runs operations for the wrong
    durations, and check_run says so instead of repeating the mistake."""
    import harness.simulate.lowering as lowering

    profile = random_chain(random.Random(11), 5)
    schedule = Schedule("split", 10**12, training_ops(5, 3), sub_batches=3)
    run = simulate(schedule, profile, engine="reference")
    assert check_run(schedule, profile, run, float("inf")) == []
    even = lowering.pass_sizes
    monkeypatch.setattr(lowering, "pass_sizes", lambda batch, n: sorted(even(batch, n)))
    lowering._OPS_CACHE.clear()
    wrong = simulate(schedule, profile, engine="reference")
    assert "lasts" in messages(check_run(schedule, profile, wrong, float("inf")))


def _refused_without(label: str, parts: dict, drop: str, schedule, profile, run, compute) -> tuple[bool, bool]:
    """(refused with every part, refused without ``drop``) for a trace holding ``parts`` over operation ``label``."""
    ev = next(e for e in compute if e.label == label)
    exact = tuple(MemoryBlock(k, name, size, ev.start, ev.end) for k, (name, size) in enumerate(parts.items()))

    def refused(trace) -> bool:
        found = check_needs(schedule, [profile], dataclasses.replace(run, trace=trace), compute)
        return any(v.message.startswith(f"{label} runs with") for v in found)

    return refused(exact), refused(tuple(b for b in exact if b.name != drop))


def test_the_last_backward_needs_the_output_and_its_gradient() -> None:
    """check_needs, eq. (6) for the last stage: B_{L-1} holds the model output AND the output's
    gradient (two blocks of output_bytes). A trace with only one of them is refused."""
    profile = random_chain(random.Random(5), 3)
    assert profile.output_bytes > 0
    s2 = profile.stages[2]
    schedule = Schedule("keep-all", peak_memory(profile), training_ops(3))
    run = simulate(schedule, profile, engine="reference")
    compute = [e for e in run.timeline if e.stream == "compute"]
    parts = {"weights": profile.weight_bytes, "saved2": s2.saved_bytes, "out": profile.output_bytes,
             "grad_out": profile.output_bytes, "y2": s2.grad_bytes, "wB2": s2.bwd_workspace}
    with_all, without = _refused_without("B2", parts, "grad_out", schedule, profile, run, compute)
    assert not with_all
    assert without


def test_a_forward_needs_its_workspace() -> None:
    """check_needs, eq. (1): F_i holds max(x_i, saved_i), x_{i+1} and its workspace. A trace without
    the workspace over F_i is refused."""
    stage = Stage("s", "conv", 1.0, 1.0, 100, 150, 100, fwd_workspace=70, bwd_workspace=30)
    profile = Profile("ws", 1, (1,), "synthetic", 10**6, 100.0, 100.0, 10, 40, (stage,) * 3)
    schedule = Schedule("keep-all", peak_memory(profile), training_ops(3))
    run = simulate(schedule, profile, engine="reference")
    assert check_run(schedule, profile, run, schedule.budget_bytes) == []
    compute = [e for e in run.timeline if e.stream == "compute"]
    parts = {"weights": profile.weight_bytes, "x1": max(stage.input_bytes, stage.saved_bytes),
             "x2": profile.stages[2].input_bytes, "wF1": stage.fwd_workspace}
    with_all, without = _refused_without("F1", parts, "wF1", schedule, profile, run, compute)
    assert not with_all
    assert without


def test_an_operation_that_starts_before_the_copy_it_waits_for_is_caught() -> None:
    """check_run's wait_op rule (vDNN's sync): F1 of a synced schedule waits for offload 0; a run
    whose offload ends after F1 has started is refused for that, by name."""
    s = Stage("s", "conv", 1.0, 1.0, 100, 300, 0)
    profile = Profile("sync", 1, (1,), "synthetic", 10**6, 100.0, 100.0, 0, 0, (s, s))
    schedule = ordered_schedule(profile, 10**6, {0: None}, planner="t", sync=True)
    assert any(tr.wait_op is not None for tr in schedule.transfers)
    run = simulate(schedule, profile, engine="reference")
    assert check_run(schedule, profile, run, schedule.budget_bytes) == []
    f1 = next(e for e in run.timeline if e.label == "F1")
    timeline = [dataclasses.replace(e, start=e.start - 0.5, end=e.end - 0.5)
                if e.stream == "compute" and e.start >= f1.start else e for e in run.timeline]
    found = messages(check_run(schedule, profile, dataclasses.replace(run, timeline=tuple(timeline)),
                               schedule.budget_bytes))
    assert "F1 starts before offload 0 completes" in found


def test_a_prefetch_that_starts_while_its_offload_runs_is_caught() -> None:
    """check_run: the data reaches the host when its offload ends; a prefetch that starts after it is
    issued but before that end is refused as such (test_a_run_that_lies accepts either message)."""
    s = Stage("s", "conv", 1.0, 1.0, 100, 300, 0)
    profile = Profile("early", 1, (1,), "synthetic", 10**6, 100.0, 100.0, 0, 0, (s, s, s))
    ops = training_ops(3)  # F0 F1 F2 B2 B1 B0
    schedule = Schedule("t", 10**6, ops, (Transfer(0, "offload", 0), Transfer(0, "prefetch", 1)), duplex=True)
    assert validate(schedule, profile) == []
    run = simulate(schedule, profile, engine="reference")
    off, pre = (e for e in run.timeline if e.stream != "compute")
    f1_start = next(e for e in run.timeline if e.label == "F1").start
    assert f1_start < off.end  # the prefetch is issued while the offload still runs
    start = (f1_start + off.end) / 2
    early = dataclasses.replace(pre, start=start, end=start + (pre.end - pre.start))
    timeline = tuple(early if e is pre else e for e in run.timeline)
    found = messages(check_run(schedule, profile, dataclasses.replace(run, timeline=timeline), schedule.budget_bytes))
    assert "prefetch 0 starts before the data reached the host" in found


def test_a_zero_length_block_above_the_budget_is_caught() -> None:
    """trace_peaks: a block that lives no time (a zero-duration operation's workspace) still occupies
    the device on top of what is live; one that takes the trace above the budget is refused."""
    profile, schedule = good_schedule()
    run = simulate(schedule, profile, engine="reference")
    assert check_run(schedule, profile, run, schedule.budget_bytes) == []
    t = run.timeline[len(run.timeline) // 2].start
    spike = MemoryBlock(len(run.trace), "spike", int(schedule.budget_bytes) + 1, t, t)
    found = messages(check_run(schedule, profile, dataclasses.replace(run, trace=run.trace + (spike,)),
                               schedule.budget_bytes))
    assert "above the budget" in found


def test_the_copy_engines_asked_for_decide_the_verdict() -> None:
    """validate(duplex=...) runs the schedule on the engines asked for, not the schedule's own: a
    prefetch at the head of a shared engine, waiting for memory only the offload behind it would free,
    deadlocks one engine but not two (test_the_schedule_carries_... only compares two empty verdicts)."""
    stages = (Stage("s0", "conv", 1.0, 1.0, 60, 60, 0), Stage("s1", "conv", 1.0, 1.0, 50, 50, 0),
              Stage("s2", "conv", 1.0, 1.0, 50, 50, 0))
    profile = Profile("hol", 1, (1,), "synthetic", 10**6, 100.0, 100.0, 0, 20, stages)
    transfers = (Transfer(0, "offload", 0), Transfer(0, "prefetch", 1), Transfer(1, "offload", 1),
                 Transfer(1, "prefetch", 2))
    single = Schedule("t", 115, training_ops(3), transfers, duplex=False)
    two = dataclasses.replace(single, duplex=True)
    assert validate(two, profile) == []
    assert "cannot run within the budget" in messages(validate(single, profile))
    assert validate(single, profile, duplex=True) == []
    assert "cannot run within the budget" in messages(validate(two, profile, duplex=False))
