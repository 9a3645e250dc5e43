"""The ``simulate`` executor: the reference way to score any schedule on any machine."""

from __future__ import annotations

import numpy as np

from harness.memory import movable_bytes, pass_ops, schedule_blocks, stage_memory
from harness.model import (
    MemoryBlock, Profile, Run, Schedule, TimelineEvent, checked_offload_start, duplex_of, offload_start_of,
)
from harness.simulate.lowering import Lowered, lower, pass_profiles
from harness.simulate.reference import OK, Timing, simulate_reference

ENGINES = ("kernel", "reference")


def timing(schedule: Schedule, profile: Profile, *, budget: float | None = None, duplex: bool | None = None,
           engine: str = "kernel", offload_start: str | None = None) -> tuple[Lowered, Timing]:
    """Lower and simulate; ``engine`` picks the Numba kernel or the plain-Python reference.
    ``duplex``: the copy-engine layout (None: the schedule's, ``Schedule.duplex``), and
    ``offload_start``: when an offload may start (``harness.model.OFFLOAD_STARTS``: with its forward,
    papers/004's rule, or once the forward has ended, the torch executor's; None: the schedule's,
    ``offload_start_of``: the device's for a schedule planned for a device budget, else the
    paper's), as in every function of this module.

    The lean form a planner calls in a loop: ``Timing.ok`` and ``Timing.makespan`` say whether
    the schedule ran and how long it took (``makespan`` below does both at once).
    """
    return _run(schedule, profile, budget, duplex, engine, offload_start)


def makespan(schedule: Schedule, profile: Profile, *, budget: float | None = None,
             duplex: bool | None = None, offload_start: str | None = None) -> float | None:
    """The simulated iteration time of ``schedule`` under ``budget`` (default: its own); None when
    it cannot run there."""
    return _run(schedule, profile, budget, duplex, "kernel", offload_start)[1].makespan


def _run(schedule: Schedule, profile: Profile, budget: float | None, duplex: bool | None,
         engine: str, offload_start: str | None = None) -> tuple[Lowered, Timing]:
    offload_start = offload_start_of(schedule, offload_start)  # an unknown rule fails before the lowering
    low = lower(schedule, profile, budget=budget, duplex=duplex)
    if engine == "kernel":
        from harness.simulate._kernels import simulate_kernel

        return low, simulate_kernel(low, offload_start)
    if engine == "reference":
        return low, simulate_reference(low, offload_start)
    raise ValueError(f"unknown simulation engine {engine!r}; choose one of {ENGINES}")


def simulate(schedule: Schedule, profile: Profile, *, budget: float | None = None, duplex: bool | None = None,
             engine: str = "kernel", offload_start: str | None = None, with_trace: bool = True) -> Run:
    """Simulate one training iteration of ``schedule`` and report it as a ``Run``."""
    duplex = duplex_of(schedule, duplex)
    low, tm = _run(schedule, profile, budget, duplex, engine, offload_start)
    compute = float(low.op_dur.sum())
    started = ~np.isnan(tm.tr_start)
    moved = int(low.tr_bytes[started].sum())
    if tm.status != OK:
        return Run(
            executor="simulate", planner=schedule.planner, status="infeasible",
            message=stuck_reason(schedule, low, tm), makespan=float("nan"), compute_time=compute,
            peak_bytes=int(tm.peak), moved_bytes=moved,
        )
    makespan = tm.makespan
    return Run(
        executor="simulate", planner=schedule.planner, status="ok", message="",
        makespan=makespan, compute_time=compute, peak_bytes=int(tm.peak), moved_bytes=moved,
        timeline=timeline(schedule, tm, duplex) if with_trace else (),
        trace=memory_trace(schedule, profile, tm, makespan) if with_trace else (),
    )


def stuck_reason(schedule: Schedule, low: Lowered, tm: Timing) -> str:
    """Say why the simulation could not go on: the blocked operation and what it waited for."""
    k = tm.blocked_op
    op = schedule.ops[k]
    t = int(low.op_tensor[k])
    awaited = [j for j, w in enumerate(low.tr_wait_op) if w == k and np.isnan(tm.tr_end[j])]
    if awaited:
        return f"infeasible: {op.label} waits for transfer {awaited[0]}, which never completes"
    if op.kind == "B":
        offloaded = [j for j in range(len(low.tr_tensor)) if low.tr_tensor[j] == t and not low.tr_is_prefetch[j]]
        prefetched = [j for j in range(len(low.tr_tensor)) if low.tr_tensor[j] == t and low.tr_is_prefetch[j]]
        if offloaded and not prefetched:
            return f"infeasible: {op.label} needs stage {op.stage}'s saved data, offloaded and never prefetched"
        if prefetched and np.isnan(tm.tr_end[prefetched[0]]):
            need = int(low.tr_bytes[prefetched[0]])
            return (f"infeasible: the prefetch for {op.label} needs {need} bytes "
                    f"but only {int(tm.free_at_block)} are free under the budget")
    need = int(low.op_alloc[k])
    return (f"infeasible: {op.label} allocates {need} bytes at its start but only "
            f"{int(tm.free_at_block)} of the budget's {int(low.budget)} are free and nothing can free more")


def timeline(schedule: Schedule, tm: Timing, duplex: bool) -> tuple[TimelineEvent, ...]:
    """Compute operations and copies as intervals on their streams."""
    events = [TimelineEvent(op.label, "compute", float(tm.op_start[k]), float(tm.op_end[k]))
              for k, op in enumerate(schedule.ops)]
    for j, tr in enumerate(schedule.transfers):
        if np.isnan(tm.tr_start[j]):
            continue
        pre = tr.direction == "prefetch"
        stream = ("h2d" if pre else "d2h") if duplex else "copy"
        label = f"{'prefetch' if pre else 'offload'} {tr.stage}" + (f"/{tr.sub_batch}" if tr.sub_batch else "")
        events.append(TimelineEvent(label, stream, float(tm.tr_start[j]), float(tm.tr_end[j])))
    return tuple(events)


def memory_trace(schedule: Schedule, profile: Profile, tm: Timing, makespan: float) -> tuple[MemoryBlock, ...]:
    """The device allocations of the run, as blocks alive on [alloc, free).

    The blocks are ``harness.memory``'s (the ones the simulator ran), timed by the run; an
    offloaded tensor's blocks end when the offload released them, and what stayed and what
    came back live on as two blocks until its backward ends. Their live sum at any instant
    is what the simulator held (the validator checks that independently).
    """
    passes = pass_profiles(profile, schedule)
    n = profile.n_stages
    offload, prefetch = {}, {}
    for j, tr in enumerate(schedule.transfers):
        (prefetch if tr.direction == "prefetch" else offload)[tr.sub_batch * n + tr.stage] = j
    blocks: list[tuple[str, int, float, float]] = [("weights", passes[0].weight_bytes, 0.0, makespan)]
    split: set[int] = set()
    kinds = [ops.kind for ops in pass_ops(schedule, n)]
    for b in schedule_blocks(schedule, passes):
        born = float(tm.op_end[b.born] if b.born_at_end else tm.op_start[b.born])
        gone = float(tm.op_end[b.dies])
        j = offload.get(b.tensor) if b.tensor >= 0 else None
        if j is not None:
            if b.tensor not in split:  # what stayed and what came back, from the release to the backward's end
                split.add(b.tensor)
                release = float(tm.tr_release[j])
                size = movable_bytes(stage_memory(passes[b.sub_batch], b.stage, schedule.algorithm_of(b.stage)),
                                     kinds[b.sub_batch][b.stage])
                tr = schedule.transfers[j]
                moved = int(tr.nbytes if tr.nbytes is not None else size)
                tag = f"/{b.sub_batch}" if b.sub_batch else ""
                blocks.append((f"saved{b.stage}.rest{tag}", size - moved, release, gone))
                q = prefetch.get(b.tensor)
                if q is not None:
                    blocks.append((f"saved{b.stage}.back{tag}", moved, float(tm.tr_start[q]), gone))
            gone = float(tm.tr_release[j])
        blocks.append((b.name, b.size, born, gone))
    return tuple(
        MemoryBlock(bid, name, int(size), lo, hi)
        for bid, (name, size, lo, hi) in enumerate((b for b in blocks if b[1] > 0))
    )


class Simulator:
    """The ``simulate`` executor: an event simulation of one iteration (papers/004 section 3.1).

    Options: ``duplex`` (separate copy engines per direction; default None: the schedule's
    layout, ``Schedule.duplex``), ``engine`` (``kernel`` or ``reference``), ``offload_start``
    (``forward-start``, papers/004's, or ``forward-end``, the torch executor's; default None: the
    schedule's, ``offload_start_of``).
    """

    name = "simulate"
    description = "Event simulation of one training iteration: compute stream + copy engine(s), Numba kernel"

    def __init__(self, duplex: bool | None = None, engine: str = "kernel", offload_start: str | None = None):
        if offload_start is not None:
            checked_offload_start(offload_start)
        self.duplex = duplex
        self.engine = engine
        self.offload_start = offload_start

    def run(self, schedule: Schedule, profile: Profile, workload=None) -> Run:
        """One simulated iteration of ``schedule`` (``workload`` is not needed)."""
        return simulate(schedule, profile, duplex=self.duplex, engine=self.engine, offload_start=self.offload_start)
