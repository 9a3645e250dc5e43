"""Turn vDNN's choices into a ``Schedule``, and realise it against a budget.

The schedule (papers/001 section 3.3): offload i is issued when F_i starts; prefetches
are issued when the layer Figure 6 assigns them to starts its backward (the backward
start, layer L, is the end of F_{L-1}). With ``sync`` every transfer is awaited by the
operation that follows its issuing layer: F_{i+1} waits for offload i ("vDNN synchronizes
stream_compute and stream_memory at the end of each layer's forward computation") and
B_{m-1} for the prefetch B_m issued ("the next layer's backward computation is stalled
until the prefetch operation is finalized"). Without ``sync`` (vDNN++, section 4.3) nothing
waits but memory and the layer that needs the data.

A *realiser* decides whether a configuration fits a budget and returns its schedule:
``synchronous`` is vDNN's (the vDNN memory manager allocates for the current layer from
a pool the size of the device, so it fits when the peak of its unconstrained run does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from harness.model import Profile, Schedule, Transfer, training_ops
from harness.schedules import op_index, unconstrained_peak
from harness.simulate.executor import timing

from membudget_vdnn.policy import prefetch_plan


@dataclass(frozen=True)
class Attempt:
    """A configuration tried against a budget: its schedule when it fits, and the bytes it needs."""

    schedule: Schedule | None
    needed: int

    @property
    def ok(self) -> bool:
        """Whether the configuration fits (a schedule was produced)."""
        return self.schedule is not None


class Realiser(Protocol):
    """Builds the schedule of one configuration and says whether it fits ``budget``."""

    def __call__(self, profile: Profile, budget: int, offloaded: tuple[int, ...], algorithms: tuple[int, ...],
                 *, planner: str, duplex: bool = False, options: dict[str, Any] | None = None) -> Attempt: ...


def vdnn_schedule(profile: Profile, budget: int, offloaded: tuple[int, ...], *, algorithms: tuple[int, ...] = (),
                  sync: bool = True, planner: str = "vdnn", options: dict[str, Any] | None = None,
                  notes: str = "") -> Schedule:
    """The schedule that offloads ``offloaded`` and prefetches by papers/001 Figure 6."""
    n = profile.n_stages
    ops = training_ops(n)
    where = op_index(ops)
    transfers = []
    for i in sorted(offloaded):
        f = where[("F", i, 0)]
        transfers.append(Transfer(i, "offload", f, "start", f + 1 if sync else None))
    for stage, layer in prefetch_plan(profile, offloaded):
        if layer == n:  # the start of the backward pass
            issue, at = where[("F", n - 1, 0)], "end"
            waiter = where[("B", n - 1, 0)]
        else:
            issue, at = where[("B", layer, 0)], "start"
            waiter = issue + 1
        transfers.append(Transfer(stage, "prefetch", issue, at, waiter if sync else None))
    return Schedule(planner, int(budget), ops, tuple(transfers), algorithms=algorithms,
                    options=dict(options or {}), notes=notes)


def fits(schedule: Schedule, profile: Profile, duplex: bool = False) -> bool:
    """A simulated trial: does ``schedule`` complete under its own budget?"""
    _, tm = timing(schedule, profile, duplex=duplex)
    return tm.ok


def synchronous(profile: Profile, budget: int, offloaded: tuple[int, ...], algorithms: tuple[int, ...], *,
                planner: str, duplex: bool = False, options: dict[str, Any] | None = None) -> Attempt:
    """vDNN's realiser: the synchronised schedule, which fits when its unconstrained peak does."""
    schedule = vdnn_schedule(profile, budget, offloaded, algorithms=algorithms, sync=True, planner=planner,
                             options={**(options or {}), "sync": True},
                             notes="vDNN: every transfer awaited at the end of its layer (papers/001 section 3.3)")
    peak = unconstrained_peak(schedule, profile, duplex)
    return Attempt(schedule if peak <= budget else None, peak)
