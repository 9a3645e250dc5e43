"""harness.time_gap: a measured iteration against the simulator's, split by where the time went
(issue #16, "timeline vs timeline"), on hand-made timelines and on a real CPU run."""

from __future__ import annotations

import math

import pytest

from harness.model import TimelineEvent
from harness.time_gap import TimelineParts, op_kind, time_gap


def _events(*spec):
    return [TimelineEvent(label, stream, start, end) for label, stream, start, end in spec]


PREDICTED = _events(("F0", "compute", 0.0, 1.0), ("F1", "compute", 1.0, 2.0), ("B1", "compute", 2.0, 4.0),
                    ("B0", "compute", 4.0, 6.0), ("offload 0", "copy", 1.0, 2.0), ("prefetch 0", "copy", 2.0, 3.0))


def test_a_hand_worked_gap():
    # measured: F1 takes 0.5 s longer, the compute stream waits 0.25 s before B0 for its prefetch,
    # the copies take 1 s longer in all, and the median iteration is 0.1 s longer than the recorded one
    measured = _events(("F0", "compute", 0.0, 1.0), ("F1", "compute", 1.0, 2.5), ("B1", "compute", 2.5, 4.5),
                       ("B0", "compute", 4.75, 6.75), ("offload 0", "copy", 1.0, 2.5), ("prefetch 0", "copy", 2.5, 4.0))
    gap = time_gap(measured, PREDICTED, measured_s=6.85, predicted_s=6.0)
    assert gap.compute_s == pytest.approx({"F": 0.5, "B": 0.0})
    assert gap.idle_s == pytest.approx(0.25)
    assert gap.spread_s == pytest.approx(0.1)
    assert gap.copy_s == pytest.approx(1.0)
    assert gap.copy_speed == pytest.approx(1 / 1.5)  # each copy 1.5 s against the model's 1 s
    assert gap.gap_s == pytest.approx(0.85)
    assert gap.largest_ops[0] == ("F1", pytest.approx(0.5))
    assert gap.shares()["compute F"] == pytest.approx(0.5 / 6.0)


def test_each_part_of_the_gap_between_unlike_timelines():
    measured = _events(("Fc0", "compute", 0.1, 0.4), ("Fn1", "compute", 0.5, 0.6), ("R0", "compute", 0.7, 1.0),
                       ("R1", "compute", 1.0, 1.2), ("B1", "compute", 1.3, 2.0), ("B0", "compute", 2.0, 2.2))
    gap = time_gap(measured, PREDICTED, measured_s=2.5)
    # by hand: measured busy Fc 0.3, Fn 0.1, R 0.3 + 0.2, B 0.7 + 0.2 = 1.8 s of a 2.2 s timeline (0.4 s idle);
    # predicted busy F 1 + 1, B 2 + 2 = 6 s of a 6 s timeline (no idle time)
    assert gap.compute_s == pytest.approx({"F": -2.0, "Fc": 0.3, "Fn": 0.1, "R": 0.5, "B": -3.1})
    assert gap.idle_s == pytest.approx(0.4)
    assert gap.spread_s == pytest.approx(0.3)  # 2.5 s reported against the 2.2 s recorded
    assert gap.copy_s == pytest.approx(-2.0)  # no copies measured, 2 s predicted
    assert math.isnan(gap.copy_speed)  # no copy in both timelines
    assert gap.gap_s == pytest.approx(-3.5)  # = -2 + 0.3 + 0.1 + 0.5 - 3.1 + 0.4 + 0.3
    assert list(gap.compute_s) == ["F", "Fc", "Fn", "R", "B"]  # one order, whoever ran what
    assert gap.predicted_s == 6.0  # the simulated timeline's length by default


def test_copy_speed_tells_a_slower_link_from_a_few_copies_that_waited():
    """The same copy time lost two ways: every copy a third slower (the link), or one copy of four
    held up (a stall). Only the first moves the median speed; both show in ``copy_s``."""
    labels = [f"offload {i}" for i in range(4)]
    predicted = _events(*[(label, "copy", float(i), i + 1.0) for i, label in enumerate(labels)])
    slower_link = _events(*[(label, "copy", 1.5 * i, 1.5 * (i + 1)) for i, label in enumerate(labels)])
    one_stall = _events(*[(label, "copy", float(i), i + 1.0) for i, label in enumerate(labels[:3])],
                        (labels[3], "copy", 3.0, 6.0))
    link, stall = time_gap(slower_link, predicted), time_gap(one_stall, predicted)
    assert link.copy_s == pytest.approx(2.0) and stall.copy_s == pytest.approx(2.0)
    assert link.copy_speed == pytest.approx(1 / 1.5)
    assert stall.copy_speed == pytest.approx(1.0)
    # a copy only one timeline has (another schedule's, a label renamed) is left out of the median
    extra = time_gap([*one_stall, TimelineEvent("prefetch 9", "copy", 6.0, 60.0)], predicted)
    assert extra.copy_speed == pytest.approx(1.0) and extra.copy_s == pytest.approx(56.0)


def test_parts_of_a_saved_timeline_and_labels():
    parts = TimelineParts.of([["F0/1", "compute", 0.0, 1.0], ["B0/1", "compute", 1.5, 2.0], ["x", "d2h", 0.0, 3.0]])
    assert parts.length_s == 3.0 and parts.busy_s == {"F": 1.0, "B": 0.5} and parts.copy_s == 3.0
    assert parts.copies_s == {"x": 3.0}
    assert parts.idle_s == pytest.approx(1.5)
    assert [op_kind(s) for s in ("F3", "Fc3", "Fn12", "R0/2", "B7")] == ["F", "Fc", "Fn", "R", "B"]
    with pytest.raises(ValueError, match="not an operation label"):
        op_kind("offload 3")


def test_a_real_run_against_its_simulation():
    """The torch executor keeps its last iteration's timeline: one event per operation of the
    schedule, the copies of an offloading schedule on their stream, and the compute part of the split
    is the two timelines' busy time per operation kind."""
    pytest.importorskip("torch")
    from harness.bounds import min_memory, peak_memory
    from harness.executors.torch_executor import TorchExecutor
    from harness.plugins import registry
    from harness.protocols import Workload
    from harness.simulate.executor import simulate

    workload = Workload("builtin:tiny-cnn", 4, (3, 16, 16), "cpu")
    profile = registry().profiler("analytic").profile(Workload("builtin:tiny-cnn", 4, (3, 16, 16), "V100-PCIe"))
    budget = (min_memory(profile) + peak_memory(profile)) // 2
    schedule = registry().planner("greedy").plan(profile, budget)
    assert schedule.transfers
    run = TorchExecutor(device="cpu", warmup=1, iterations=2).run(schedule, profile, workload)
    assert run.status == "ok", run.message
    compute = [e.label for e in run.timeline if e.stream == "compute"]
    assert compute == [op.label for op in schedule.ops]
    assert any(e.stream != "compute" for e in run.timeline)
    predicted = simulate(schedule, profile)
    assert [e.label for e in predicted.timeline if e.stream == "compute"] == compute
    gap = time_gap(run.timeline, predicted.timeline, run.makespan, predicted.makespan)
    kind = {op.label: op.kind for op in schedule.ops}

    def busy(timeline):  # seconds of the compute stream per operation kind, from the events
        seconds = {}
        for e in timeline:
            if e.stream == "compute":
                seconds[kind[e.label]] = seconds.get(kind[e.label], 0.0) + (e.end - e.start)
        return seconds

    measured_busy, predicted_busy = busy(run.timeline), busy(predicted.timeline)
    assert set(gap.compute_s) == set(measured_busy) == set(predicted_busy)
    for k, seconds in gap.compute_s.items():
        assert seconds == pytest.approx(measured_busy[k] - predicted_busy[k], rel=1e-9, abs=1e-12), k
    # the recorded iteration is one of the timed ones: its events end within the slowest
    assert max(e.end for e in run.timeline) <= run.metrics["time_max_s"] + 1e-6
    assert math.isclose(gap.measured_s, run.makespan) and math.isclose(gap.predicted_s, predicted.makespan)
