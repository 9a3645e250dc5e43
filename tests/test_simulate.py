"""The simulator: Numba kernel against the plain reference, and the rules of papers/004 3.1."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bounds import lower_bound, min_memory, op_needs, peak_memory
from harness.model import Profile, Schedule, Stage, Transfer, training_ops
from harness.schedules import best_ordered_schedule, keep_all_schedule, ordered_schedule
from harness.testing import chains
from harness.validate import check_run, validate
from harness.simulate.executor import simulate, timing


def random_chain(rng: random.Random, n: int) -> Profile:
    stages = [
        Stage(f"s{i}", rng.choice(["conv", "act", "pool"]), rng.uniform(0, 2e-3), rng.uniform(0, 4e-3),
              rng.randint(0, 4000), rng.randint(0, 5000), rng.randint(0, 4000),
              rng.choice([0, rng.randint(0, 900)]), rng.randint(0, 500))
        for i in range(n)
    ]
    for i in range(n - 1):  # some stages need part of their output for their backward (a trailing ReLU)
        if rng.random() < 0.5:
            stages[i] = replace(stages[i], output_saved_bytes=rng.randint(0, stages[i + 1].saved_bytes))
    stages = tuple(stages)
    return Profile("random", 4, (3, 8, 8), "synthetic", 10**9, rng.uniform(1e5, 1e7), rng.uniform(1e5, 1e7),
                   rng.randint(0, 500), rng.randint(0, 300), stages)


def random_schedule(rng: random.Random, profile: Profile) -> Schedule:
    """An ordered schedule with a random offload set, random sync, window and partial amounts."""
    n = profile.n_stages
    chosen = rng.sample(range(n), rng.randint(0, n))
    amounts = {i: (rng.randint(0, profile.stages[i].saved_bytes) if rng.random() < 0.2 else None) for i in chosen}
    return ordered_schedule(profile, 0, amounts, planner="random", sync=rng.random() < 0.3,
                            prefetch_window=rng.choice([None, 1, 2, 3]))


@pytest.mark.parametrize("offload_start", ["forward-start", "forward-end"])
def test_kernel_agrees_with_reference_on_random_chains(offload_start) -> None:
    """At least 200 random chains x budgets, duplex or not, under either offload rule: identical
    timings, bit for bit."""
    rng = random.Random(2024)
    compared = stuck = 0
    while compared < 240:
        profile = random_chain(rng, rng.randint(1, 25))
        schedule = random_schedule(rng, profile)
        lo, hi = min_memory(profile), peak_memory(profile)
        budget = rng.choice([lo, hi, rng.randint(min(lo, hi) // 2, hi), rng.randint(lo, hi)])
        duplex = rng.random() < 0.5
        _, ref = timing(schedule, profile, budget=budget, duplex=duplex, engine="reference", offload_start=offload_start)
        _, ker = timing(schedule, profile, budget=budget, duplex=duplex, engine="kernel", offload_start=offload_start)
        assert ref.status == ker.status
        assert ref.blocked_op == ker.blocked_op
        for name in ("op_start", "op_end", "tr_start", "tr_end", "tr_release"):
            np.testing.assert_array_equal(getattr(ref, name), getattr(ker, name), err_msg=name)
        assert ref.peak == ker.peak
        compared += 1
        stuck += ref.status != 0
    assert 0 < stuck < compared  # both feasible and infeasible runs were compared


def test_keep_all_runs_back_to_back_at_the_peak() -> None:
    profile = random_chain(random.Random(1), 10)
    peak = peak_memory(profile)
    run = simulate(keep_all_schedule(profile, peak), profile)
    assert run.feasible and run.moved_bytes == 0
    assert math.isclose(run.makespan, profile.compute_time)
    assert run.peak_bytes == peak
    squeezed = simulate(keep_all_schedule(profile, peak - 1), profile)
    assert squeezed.status == "infeasible" and "free" in squeezed.message


def two_stage_chain() -> Profile:
    """x0 = 100 B offloadable during F1 (1 s); beta = 100 B/s; F1 needs 100 B more than fits."""
    s0 = Stage("s0", "conv", 1.0, 1.0, 100, 100, 0)
    s1 = Stage("s1", "conv", 1.0, 1.0, 100, 100, 0)
    return Profile("two", 1, (1,), "synthetic", 10**6, 100.0, 100.0, 0, 0, (s0, s1))


def test_forward_waits_for_the_offload_to_free_memory() -> None:
    """papers/004 eq. (1): F_i starts once enough has been offloaded, no earlier, no later."""
    profile = two_stage_chain()
    assert peak_memory(profile) == 200
    schedule = ordered_schedule(profile, 100, {0: None}, planner="t", prefetch_window=1)
    # F0 allocates x0 (100) + x1 (100) = 200 > 100: infeasible at 100; at 200 it runs.
    assert simulate(schedule, profile).status == "infeasible"
    schedule = ordered_schedule(profile, 200, {0: None}, planner="t", prefetch_window=1)
    run = simulate(schedule, profile)
    events = {e.label: e for e in run.timeline}
    assert events["offload 0"].start == 0.0 and events["offload 0"].end == 1.0
    assert events["F1"].start == 1.0  # F1 needs x1 + nothing else; no wait beyond F0
    assert run.moved_bytes == 200


def test_under_the_executors_rule_an_offload_waits_for_its_forward_to_end() -> None:
    """offload_start="forward-end": x0's copy starts when F0 ends (1 s), not with it, so its device
    bytes are released a second later; F1 needs only x1 and starts at once, and the prefetch
    (2-3 s) still hides under B1, so the iteration takes the paper's 4 s."""
    profile = two_stage_chain()
    schedule = ordered_schedule(profile, 200, {0: None}, planner="t", prefetch_window=1)
    paper = simulate(schedule, profile)
    executor = simulate(schedule, profile, offload_start="forward-end")
    events = {e.label: e for e in executor.timeline}
    assert events["offload 0"].start == 1.0 and events["offload 0"].end == 2.0
    assert events["F1"].start == 1.0
    assert [{b.name: b.free for b in run.trace}["x0"] for run in (paper, executor)] == [1.0, 2.0]
    assert executor.makespan == paper.makespan == 4.0


@pytest.mark.parametrize("engine", ["kernel", "reference"])
def test_no_offload_starts_before_its_forward_ends_on_random_chains(engine) -> None:
    """The executor's rule on random schedules at the keep-all peak: every offload starts at or
    after the end of the forward that produced its data."""
    rng = random.Random(11)
    checked = 0
    while checked < 60:
        profile = random_chain(rng, rng.randint(2, 20))
        schedule = random_schedule(rng, profile)
        low, tm = timing(schedule, profile, budget=peak_memory(profile), engine=engine, offload_start="forward-end")
        if not tm.ok:
            continue
        creator = {int(low.op_tensor[k]): k for k in range(low.n_ops) if not low.op_is_b[k] and low.op_tensor[k] >= 0}
        for j in range(len(low.tr_dur)):
            if not low.tr_is_prefetch[j] and not np.isnan(tm.tr_start[j]):
                assert tm.tr_start[j] >= tm.op_end[creator[int(low.tr_tensor[j])]]
        checked += 1


def test_a_schedule_planned_for_a_device_is_simulated_as_the_device_runs_it() -> None:
    """offload_start None (the default) is the schedule's: the device's rule once the schedule was
    planned for a device budget (``device_budget_bytes``), papers/004's otherwise; given, it wins."""
    from harness.simulate.executor import Simulator

    profile = two_stage_chain()
    schedule = ordered_schedule(profile, 200, {0: None}, planner="t", prefetch_window=1)
    on_device = replace(schedule, device_budget_bytes=300)

    def offload(run):
        return next(e for e in run.timeline if e.label == "offload 0").start

    assert offload(simulate(schedule, profile)) == 0.0
    assert offload(simulate(on_device, profile)) == 1.0 == offload(Simulator().run(on_device, profile))
    assert offload(simulate(on_device, profile, offload_start="forward-start")) == 0.0
    assert offload(Simulator(offload_start="forward-end").run(schedule, profile)) == 1.0


def test_an_unknown_offload_rule_is_a_one_line_error() -> None:
    profile = two_stage_chain()
    schedule = ordered_schedule(profile, 200, {0: None}, planner="t")
    with pytest.raises(ValueError, match="unknown offload_start 'later'; choose one of"):
        simulate(schedule, profile, offload_start="later")
    from harness.simulate.executor import Simulator

    with pytest.raises(ValueError, match="unknown offload_start 'later'"):
        Simulator(offload_start="later")


def test_sync_wait_op_charges_the_stall() -> None:
    """vDNN's end-of-layer sync: the next layer waits for the offload even with memory to spare."""
    s = Stage("s", "conv", 1.0, 1.0, 100, 300, 0)
    profile = Profile("sync", 1, (1,), "synthetic", 10**6, 100.0, 100.0, 0, 0, (s, s))
    free = simulate(ordered_schedule(profile, 10**6, {0: None}, planner="t"), profile)
    synced = simulate(ordered_schedule(profile, 10**6, {0: None}, planner="t", sync=True), profile)
    assert {e.label: e for e in free.timeline}["F1"].start == 1.0
    assert {e.label: e for e in synced.timeline}["F1"].start == 3.0  # 300 B at 100 B/s
    assert synced.makespan > free.makespan


def test_duplex_engines_overlap_directions() -> None:
    rng = random.Random(7)
    profile = random_chain(rng, 12)
    schedule = ordered_schedule(profile, peak_memory(profile), set(range(12)), planner="t")
    single = simulate(schedule, profile)
    duplex = simulate(schedule, profile, duplex=True)
    assert duplex.makespan <= single.makespan
    assert {e.stream for e in duplex.timeline} >= {"d2h", "h2d", "compute"}


def test_the_schedule_carries_its_copy_engines_to_the_simulator_validator_and_bounds() -> None:
    """``Schedule.duplex`` is the layout every reader uses when none is given; an explicit one wins."""
    from harness.bounds import schedule_lower_bound
    from harness.simulate.executor import Simulator

    rng = random.Random(7)
    profile = random_chain(rng, 12)
    budget = peak_memory(profile)
    single = ordered_schedule(profile, budget, set(range(12)), planner="t")
    duplex = replace(single, duplex=True)
    assert simulate(duplex, profile) == simulate(single, profile, duplex=True)
    assert simulate(duplex, profile, duplex=False) == simulate(single, profile)
    assert Simulator().run(duplex, profile) == simulate(single, profile, duplex=True)
    assert Simulator(duplex=False).run(duplex, profile) == simulate(single, profile)
    assert timing(duplex, profile)[1].makespan == timing(single, profile, duplex=True)[1].makespan
    assert validate(duplex, profile) == validate(single, profile, duplex=True) == []
    for b in (min_memory(profile), budget):
        assert schedule_lower_bound(profile, duplex, b) == schedule_lower_bound(profile, single, b, duplex=True)


def test_a_case_records_its_copy_engines_once_for_the_plan_and_the_run() -> None:
    """The executor's layout reaches a planner that takes ``duplex``, the schedule and the bounds;
    with an executor that names none, the planner's ``duplex`` option is the layout."""
    from harness.case import copy_layout, plan_case, run_case
    from harness.simulate.executor import Simulator

    seen = []

    class Planner:
        name = "probe"

        def plan(self, profile, budget_bytes, duplex: bool = False, **options):
            seen.append(duplex)
            return ordered_schedule(profile, budget_bytes, set(range(profile.n_stages)), planner=self.name)

    rng = random.Random(7)
    profile = random_chain(rng, 12)
    budget = peak_memory(profile)
    assert copy_layout(Simulator()) is False and copy_layout(Simulator(), {"duplex": True}) is True
    assert copy_layout(Simulator(duplex=True), {"duplex": False}) is True
    planned = plan_case(Planner(), profile, budget, {"duplex": True})
    assert planned.schedule.duplex and seen[-1] is True  # (the warm-up plans a tiny chain first)
    assert plan_case(Planner(), profile, budget).schedule.duplex is False and seen[-1] is False
    outcome = run_case(Planner(), profile, budget, Simulator(duplex=True), None)
    assert seen[-1] is True and outcome.schedule.duplex and outcome.fields["status"] == "ok"
    assert outcome.run == simulate(outcome.schedule, profile, duplex=True)
    assert outcome.fields["budget_lower_bound_s"] == lower_bound(profile, budget, duplex=True)
    plain = run_case(Planner(), profile, budget, Simulator(), None)
    assert not plain.schedule.duplex and plain.fields["makespan_s"] >= outcome.fields["makespan_s"]


def test_offload_everything_fits_the_minimum_memory() -> None:
    rng = random.Random(3)
    for _ in range(30):
        profile = random_chain(rng, rng.randint(1, 15))
        lo = min_memory(profile)
        schedule = best_ordered_schedule(profile, lo, set(range(profile.n_stages)), planner="t")
        assert schedule is not None
        run = simulate(schedule, profile)
        assert run.feasible and run.peak_bytes <= lo
        assert run.makespan >= lower_bound(profile, lo) * (1 - 1e-12)


def test_a_never_prefetched_offload_is_reported() -> None:
    profile = two_stage_chain()
    ops = training_ops(2)
    schedule = Schedule("broken", 10**6, ops, (Transfer(0, "offload", 0),))
    run = simulate(schedule, profile)
    assert run.status == "infeasible" and "never prefetched" in run.message


@pytest.mark.parametrize("engine", ["kernel", "reference"])
def test_trace_blocks_sum_to_the_reported_peak(engine) -> None:
    rng = random.Random(11)
    profile = random_chain(rng, 9)
    schedule = best_ordered_schedule(profile, min_memory(profile), set(range(9)), planner="t")
    run = simulate(schedule, profile, engine=engine)
    times = sorted({b.alloc for b in run.trace})
    live = max(sum(b.size for b in run.trace if b.alloc <= t < b.free) for t in times)
    assert live == run.peak_bytes


def test_backward_keeps_the_part_of_its_output_it_needs_until_it_ends() -> None:
    """papers/004 3.1: B_i requires x_{i+1}. A stage whose backward needs its output (a trailing
    ReLU) keeps that part of the next stage's saved data after B_{i+1} frees the rest."""
    stages = (
        Stage("conv", "conv", 1.0, 1.0, 100, 100, 100),
        Stage("relu-then-conv", "conv", 1.0, 1.0, 300, 300, 300, output_saved_bytes=0),
        Stage("head", "linear", 1.0, 1.0, 50, 50, 50),
    )
    base = Profile("toy", 1, (1,), "synthetic", 10**9, 1e9, 1e9, 0, 10, stages)
    held = replace(base, stages=(replace(stages[0], output_saved_bytes=300), *stages[1:]))
    schedule = keep_all_schedule(base, 10**9)
    plain, kept = simulate(schedule, base), simulate(schedule, held)
    # during B_0 the model now holds x_1 (300 bytes) on top of what it held before
    b0 = [e for e in kept.timeline if e.label.startswith("B0")][0]
    live = sum(b.size for b in kept.trace if b.alloc <= (b0.start + b0.end) / 2 < b.free)
    live_plain = sum(b.size for b in plain.trace if b.alloc <= (b0.start + b0.end) / 2 < b.free)
    assert live - live_plain == 300
    assert kept.peak_bytes >= plain.peak_bytes
    # and the minimum memory says so: B_0 needs the 300 bytes too
    assert dict(op_needs(held))["B0"] - dict(op_needs(base))["B0"] == 300
    # the kernel, the reference and the trace agree on it
    assert timing(schedule, held, engine="reference")[1].peak == timing(schedule, held)[1].peak == kept.peak_bytes


def test_a_stage_cannot_keep_more_of_its_output_than_the_next_stage_saves() -> None:
    with pytest.raises(ValueError, match="output_saved_bytes"):
        Profile("toy", 1, (1,), "synthetic", 10**9, 1e9, 1e9, 0, 10,
                (Stage("a", "conv", 1.0, 1.0, 10, 10, 10, output_saved_bytes=11), Stage("b", "act", 1.0, 1.0, 10, 10, 10)))


def test_a_checkpointed_segment_holds_the_recomputed_output_of_its_last_stage() -> None:
    """With [0, 2) checkpointed, B_1 reads the x_2 that R_1 re-creates (harness.memory): the share
    of the original x_2 that stage 1 would keep after B_2 is not held, the recomputed one is, until B_1 ends."""
    from harness.planners.torch_peers import checkpoint_schedule

    stages = (
        Stage("a", "conv", 1.0, 1.0, 100, 100, 100),
        Stage("b", "conv", 1.0, 1.0, 200, 200, 200, output_saved_bytes=300),
        Stage("c", "conv", 1.0, 1.0, 300, 300, 300),
        Stage("d", "linear", 1.0, 1.0, 50, 50, 50),
    )
    held = Profile("toy", 1, (1,), "synthetic", 10**9, 1e9, 1e9, 0, 10, stages)
    plain = replace(held, stages=(stages[0], replace(stages[1], output_saved_bytes=0), *stages[2:]))
    schedule = checkpoint_schedule(held, 10**9, every=2)
    assert [op.label for op in schedule.ops] == ["Fc0", "Fn1", "F2", "F3", "B3", "B2", "R0", "R1", "B1", "B0"]

    def live(profile: Profile, label: str) -> int:
        run = simulate(schedule, profile)
        e = [e for e in run.timeline if e.label == label][0]
        return sum(b.size for b in run.trace if b.alloc <= (e.start + e.end) / 2 < b.free)

    assert live(held, "R0") == live(plain, "R0")  # the original x_2 is gone with B_2
    assert live(held, "B1") - live(plain, "B1") == 300  # R_1's x_2, kept for B_1
    assert not validate(schedule, held, 10**9)
    # without the checkpoint the original x_2's share is held from B_2's end
    keep = keep_all_schedule(held, 10**9)
    b1 = lambda run: [e for e in run.timeline if e.label.startswith("B1")][0]  # noqa: E731
    live_keep = lambda run, e: sum(b.size for b in run.trace if b.alloc <= (e.start + e.end) / 2 < b.free)  # noqa: E731
    assert (live_keep(simulate(keep, held), b1(simulate(keep, held)))
            - live_keep(simulate(keep, plain), b1(simulate(keep, plain)))) == 300


def test_an_offloaded_checkpoint_by_hand() -> None:
    """Fc0 Fn1 F2 B2 R0 R1 B1 B0 on 100-byte stages (F 1 s, B 2 s, 100 B/s): x_0 goes to the host
    during Fc0 (0-1 s), so B2 fits in 400 bytes instead of 500; its prefetch (1 s) waits for B2 to
    free memory (5 s) and R0 waits for it: 1 s later than with no budget to respect."""
    from harness.memory import saved_data
    from harness.validate import trace_peaks
    from tests.test_memory import checkpoint_offload_schedule

    profile, schedule = checkpoint_offload_schedule(400)
    plain = replace(schedule, transfers=())
    assert simulate(plain, profile, budget=500).makespan == 11.0
    assert simulate(plain, profile, budget=400).status == "infeasible"
    for engine in ("kernel", "reference"):
        run = simulate(schedule, profile, engine=engine)
        events = {e.label: (e.start, e.end) for e in run.timeline}
        assert events["offload 0"] == (0.0, 1.0) and events["prefetch 0"] == (5.0, 6.0)
        assert events["R0"] == (6.0, 7.0) and events["B0"] == (10.0, 12.0)
        assert run.makespan == 12.0 and run.peak_bytes == 400 and run.moved_bytes == 200
        out: list = []
        assert trace_peaks(run.trace, 400, out)[0] == 400 and not out  # frees first: the budget holds
    assert validate(schedule, profile, 400) == []
    # with room, the prefetch runs during B2 and costs nothing
    roomy = simulate(replace(schedule, budget_bytes=500), profile)
    assert roomy.makespan == 11.0 and {e.label: e.start for e in roomy.timeline}["prefetch 0"] == 3.0
    assert saved_data(schedule, [profile]).offloaded == 100


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(profile=chains(max_stages=12), data=st.data())
def test_offloaded_checkpoints_simulate_as_the_validator_sweeps(profile: Profile, data) -> None:
    """Random segments, random offloaded checkpoints and saving stages: the simulator's peak is the
    validator's sweep of the trace, both engines agree, and the run passes the validator at its peak."""
    from harness.memory import saved_data
    from harness.schedules import ordered_schedule
    from harness.validate import trace_peaks
    from tests.test_memory import _random_segments

    n = profile.n_stages
    segments = _random_segments(n, data.draw)
    inside = {i for a, b in segments for i in range(a + 1, b)}
    movable = [i for i in range(n) if i not in inside]
    offload = set(data.draw(st.lists(st.sampled_from(movable), unique=True))) if movable else set()
    window = data.draw(st.sampled_from([None, 1, 2]))
    schedule = ordered_schedule(profile, 0, offload, planner="t", recompute=segments, prefetch_window=window)
    run = simulate(schedule, profile, budget=float("inf"))
    ref = simulate(schedule, profile, budget=float("inf"), engine="reference")
    assert run.feasible and math.isclose(run.makespan, ref.makespan) and run.peak_bytes == ref.peak_bytes
    out: list = []
    low, high = trace_peaks(run.trace, float("inf"), out)
    assert low <= run.peak_bytes <= high  # the validator's bracket (equal but for zero-time operations)
    assert validate(schedule, profile, float("inf")) == [], (segments, offload)
    compute = sum(e.end - e.start for e in run.timeline if e.stream == "compute")
    assert run.makespan >= compute - 1e-9 and math.isclose(compute, run.compute_time, abs_tol=1e-12)
    # the saved data by stage, from the segments and the offloaded stages: a checkpoint keeps (and,
    # offloaded, moves) the saved part of its input and recomputes the rest, a stage inside a
    # segment recomputes all it saves, any other stage keeps or moves all of it
    stages, starts = profile.stages, {a for a, _ in segments}
    checkpoint = {a: min(stages[a].input_bytes, stages[a].saved_bytes) for a in starts}
    recomputed = sum(stages[a].saved_bytes - checkpoint[a] for a in starts) + sum(stages[i].saved_bytes
                                                                                 for i in inside)
    held = {i: checkpoint.get(i, stages[i].saved_bytes) for i in movable}
    data_ = saved_data(schedule, [profile])
    assert data_.recomputed == recomputed, (segments, offload)
    assert data_.offloaded == sum(held[i] for i in offload), (segments, offload)
    assert data_.kept == sum(held[i] for i in movable if i not in offload), (segments, offload)


ENGINES = ["kernel", "reference"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_zero_byte_prefetch_waits_for_an_offload_still_queued(engine) -> None:
    """A prefetch waits until its offload has ENDED, not just until the host holds its bytes: a zero-byte
    prefetch on its own engine (duplex) issued while its zero-byte offload still waits behind another
    offload must not start first. Judged by the validator on the run of either engine."""
    stages = (Stage("s0", "conv", 0.1, 1.0, 0, 1000, 0), Stage("s1", "conv", 0.1, 1.0, 0, 1000, 0))
    profile = Profile("t", 1, (1,), "x", 10**9, 1000.0, 1000.0, 0, 0, stages)
    transfers = (Transfer(0, "offload", 0), Transfer(1, "offload", 1, nbytes=0),
                 Transfer(1, "prefetch", 1, nbytes=0), Transfer(0, "prefetch", 1, "end"))
    schedule = Schedule("x", 10**6, training_ops(2), transfers, duplex=True)
    run = simulate(schedule, profile, engine=engine)
    assert run.feasible
    assert check_run(schedule, profile, run, schedule.budget_bytes) == []
    copies = {e.label: e for e in run.timeline if e.stream != "compute"}
    assert copies["prefetch 1"].start >= copies["offload 1"].end


@pytest.mark.parametrize("engine", ENGINES)
def test_a_backward_never_runs_while_its_data_is_still_being_offloaded(engine) -> None:
    """B_i never reads a tensor while its offload still runs: with a slow link B1 comes while the offload
    of stage 1 (a schedule without its prefetch, which the validator refuses) still runs, and the
    simulator must not let B1 take the data on its way out; the run is stuck and says why (on a fast
    link the offload ends first and the run is stuck the same way: that case tests nothing here)."""
    s = Stage("s", "conv", 1.0, 1.0, 100, 1000, 0)
    profile = Profile("slow", 1, (1,), "x", 10**9, 10.0, 10.0, 0, 0, (s, s))  # 100 s to move 1000 B
    schedule = Schedule("broken", 10**6, training_ops(2), (Transfer(1, "offload", 1),))
    run = simulate(schedule, profile, engine=engine)
    assert run.status == "infeasible" and "never prefetched" in run.message


def test_a_prefetched_checkpoint_is_awaited_by_its_recomputation_whatever_wait_op_says() -> None:
    """lowering: a checkpoint's prefetch is awaited by R_i (which reads it), also when the schedule names a
    later operation (B_i) as the one that waits: the run must still validate."""
    from tests.test_memory import checkpoint_offload_schedule

    profile, schedule = checkpoint_offload_schedule(400)
    ops = [op.label for op in schedule.ops]
    late = tuple(replace(tr, wait_op=ops.index("B0")) if tr.direction == "prefetch" else tr
                 for tr in schedule.transfers)
    schedule = replace(schedule, transfers=late)
    for engine in ENGINES:
        run = simulate(schedule, profile, engine=engine)
        assert run.feasible
        r0 = next(e for e in run.timeline if e.label == "R0")
        back = next(e for e in run.timeline if e.label.startswith("prefetch"))
        assert r0.start >= back.end
        assert check_run(schedule, profile, run, schedule.budget_bytes) == []
    assert validate(schedule, profile) == []
