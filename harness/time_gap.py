"""Where a measured iteration's time went that the simulator did not see (issue #16).

The torch executor keeps its last iteration's timeline (every operation on the compute
stream, every copy on its copy stream, measured with CUDA events or the host clock); the
simulator's run of the same schedule on the same profile has the same operations. Timeline
against timeline, the difference between the measured and the predicted iteration splits
exactly into:

- ``compute_s[kind]``: per operation kind (``F``, ``Fc``, ``Fn``, ``R``, ``B``), the
  measured busy time of the compute stream minus the predicted one: the profile's stage
  times against the stages as this run executed them (saved-tensor hooks, packing, a
  different algorithm, a warmer or colder GPU);
- ``idle_s``: the compute stream's idle time inside the iteration, measured minus
  predicted: waits for copies the model did not expect (a slower host link, a copy engine
  shared with the other direction) and the host's own time between operations (Python,
  kernel launches, allocator calls) that the chain model does not have;
- ``spread_s``: the iteration's reported time (the median of the timed iterations) minus the
  length of the recorded one (the last); zero for the simulator.

``copy_s`` says, beside them, how much longer the copies took in all than the model's link
bandwidth gives (it overlaps compute, so it is not a term of the sum), and ``copy_speed`` whether
that is the link or a few copies: the median, over the copies both timelines have, of the
model's time for a copy over its measured time. Near 1 with ``copy_s`` above zero, the link ran
as the profile says and some copies waited inside their span (for memory, or behind another
copy); well below 1, the link itself was slower.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from harness.model import OP_KINDS, TimelineEvent

KINDS = OP_KINDS  # F, Fc, Fn, R, B: the order the parts are given in
_KIND = re.compile(r"^(Fc|Fn|F|R|B)\d")


def op_kind(label: str) -> str:
    """``F``, ``Fc``, ``Fn``, ``R`` or ``B`` of an operation's label (``Fc3``, ``B0/1``)."""
    found = _KIND.match(label)
    if found is None:
        raise ValueError(f"{label!r} is not an operation label (F3, Fc3, Fn3, R3, B3, with /sub-batch)")
    return found.group(1)


def events_of(timeline: Iterable[Any]) -> list[TimelineEvent]:
    """``TimelineEvent``s from a run's timeline or a saved one's ``[label, stream, start, end]`` lists."""
    return [e if isinstance(e, TimelineEvent) else TimelineEvent(str(e[0]), e[1], float(e[2]), float(e[3]))
            for e in timeline]


@dataclass(frozen=True)
class TimelineParts:
    """One timeline's length, the compute stream's busy time per operation, and its copies' time
    (``copy_s`` in all, ``copies_s`` per copy label)."""

    length_s: float
    op_s: dict[str, float]
    copies_s: dict[str, float]

    @property
    def copy_s(self) -> float:
        """The copies' time in all."""
        return sum(self.copies_s.values())

    @property
    def busy_s(self) -> dict[str, float]:
        """The compute stream's busy time per operation kind."""
        busy: dict[str, float] = {}
        for label, seconds in self.op_s.items():
            kind = op_kind(label)
            busy[kind] = busy.get(kind, 0.0) + seconds
        return busy

    @property
    def idle_s(self) -> float:
        """Time the compute stream did no operation within the timeline's length."""
        return self.length_s - sum(self.op_s.values())

    @classmethod
    def of(cls, timeline: Iterable[Any]) -> TimelineParts:
        """The parts of ``timeline`` (its length runs from 0 to the last event's end)."""
        events = events_of(timeline)
        ops: dict[str, float] = {}
        copies: dict[str, float] = {}
        for e in events:
            if e.stream == "compute":
                op_kind(e.label)  # an operation's label, or a clear error
                ops[e.label] = ops.get(e.label, 0.0) + (e.end - e.start)
            else:
                copies[e.label] = copies.get(e.label, 0.0) + (e.end - e.start)
        return cls(max((e.end for e in events), default=0.0), ops, copies)


@dataclass(frozen=True)
class TimeGap:
    """Measured minus predicted iteration time, split by where it went (module docstring)."""

    measured_s: float
    predicted_s: float
    compute_s: dict[str, float]
    idle_s: float
    spread_s: float
    copy_s: float
    copy_speed: float  # median model time / measured time over the copies both have; NaN if none
    largest_ops: tuple[tuple[str, float], ...]  # the operations whose time differs most, measured - predicted

    @property
    def gap_s(self) -> float:
        """``measured_s - predicted_s``, which the parts sum to."""
        return self.measured_s - self.predicted_s

    def shares(self) -> dict[str, float]:
        """Each part over the predicted time (``compute F``, ..., ``idle``, ``spread``)."""
        base = self.predicted_s if self.predicted_s > 0 else float("nan")
        parts = {f"compute {k}": v for k, v in self.compute_s.items()}
        parts.update(idle=self.idle_s, spread=self.spread_s)
        return {k: v / base for k, v in parts.items()}


def time_gap(measured: Sequence[Any], predicted: Sequence[Any], measured_s: float | None = None,
             predicted_s: float | None = None, top: int = 5) -> TimeGap:
    """Timeline against timeline: ``measured`` (the torch executor's last iteration) against
    ``predicted`` (the simulator's run of the same schedule). ``measured_s`` is the time the run
    reports (the median iteration; default the recorded timeline's length), ``predicted_s`` the
    simulator's makespan (default its timeline's length)."""
    real, model = TimelineParts.of(measured), TimelineParts.of(predicted)
    measured_s = real.length_s if measured_s is None else float(measured_s)
    predicted_s = model.length_s if predicted_s is None else float(predicted_s)
    real_busy, model_busy = real.busy_s, model.busy_s
    compute = {k: real_busy.get(k, 0.0) - model_busy.get(k, 0.0) for k in KINDS if k in real_busy or k in model_busy}
    ops = {label: real.op_s.get(label, 0.0) - model.op_s.get(label, 0.0)
           for label in dict.fromkeys([*model.op_s, *real.op_s])}
    largest = tuple(sorted(ops.items(), key=lambda item: -abs(item[1]))[:top])
    speeds = [model.copies_s[label] / seconds for label, seconds in real.copies_s.items()
              if seconds > 0 and model.copies_s.get(label, 0.0) > 0]
    return TimeGap(
        measured_s=measured_s, predicted_s=predicted_s, compute_s=compute,
        idle_s=real.idle_s - model.idle_s,
        spread_s=(measured_s - real.length_s) - (predicted_s - model.length_s),
        copy_s=real.copy_s - model.copy_s, copy_speed=statistics.median(speeds) if speeds else float("nan"),
        largest_ops=largest,
    )
