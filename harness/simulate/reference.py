"""The simulator written plainly, one readable step at a time: the reference for the kernel.

One compute stream runs the operations in schedule order (forwards, recomputations and
backwards alike: what each allocates and frees is ``harness.memory``'s, lowered); copy engines (one shared, or
one per direction when duplex) run the transfers in list order, each one at a time
(papers/004 assumptions B-D). Everything starts as early as it can (the no-wait rule,
Prop. 1): an operation when the previous one has ended, the copies it must wait for are
done, its saved data is resident and its allocation fits the budget; a copy when it has
been issued, its engine is free and the transfers before it on that engine have started,
its data is where it should be (a prefetch waits until every offload of its tensor has
ended, and a backward until every prefetch of its tensor has), and (a prefetch) the memory it reserves fits
(assumption E: a prefetch reserves at its start, an offload releases at its end, and not
before the forward operation that reads the data has ended).

When an offload may start is the one rule with two readings (``harness.model.OFFLOAD_STARTS``):
``forward-start``, papers/004's (x_i is F_i's input, so its copy overlaps F_i), and
``forward-end``, what the torch executor does (a stage's saved data here is mostly what
F_i itself produces, so it can be copied only once F_i has ended). Here the default is the paper's;
``harness.simulate.executor`` takes the schedule's (``harness.model.offload_start_of``).

At one instant, ends are processed before starts, and the compute stream is served
before the copy engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.model import DEVICE_OFFLOAD_START, PAPER_OFFLOAD_START, checked_offload_start
from harness.simulate.lowering import Lowered

OK, STUCK = 0, 1


def after_forward(offload_start: str) -> bool:
    """True when offloads wait for their forward's end; a one-line error for an unknown rule."""
    return checked_offload_start(offload_start) == DEVICE_OFFLOAD_START


@dataclass
class Timing:
    """When everything ran, as both simulators report it."""

    status: int
    blocked_op: int  # the operation that could not start, when stuck
    op_start: np.ndarray
    op_end: np.ndarray
    tr_start: np.ndarray
    tr_end: np.ndarray
    tr_release: np.ndarray  # offloads: when their device bytes were freed
    peak: float
    free_at_block: float = 0.0  # memory free when stuck

    @property
    def ok(self) -> bool:
        """True when every operation ran under the budget (the simulation did not get stuck)."""
        return self.status == OK

    @property
    def makespan(self) -> float | None:
        """The iteration time: the last operation's or copy's end; None when the simulation got stuck."""
        if self.status != OK:
            return None
        started = ~np.isnan(self.tr_start)
        return float(max(np.nanmax(self.op_end), np.nanmax(self.tr_end) if started.any() else 0.0))


@dataclass
class _Copy:
    index: int
    issued: float | None = None
    start: float | None = None
    end: float | None = None
    release: float | None = None


@dataclass
class _Tensor:
    size: int
    device: int = 0  # bytes on (or reserved on) the device
    host: int = 0  # bytes on the host
    prefetches_left: int = 0  # prefetches not yet ended (a zero-byte one counts too)
    offloads_running: int = 0  # offloads not yet ended
    unreleased: list[int] = field(default_factory=list)  # offloads done, waiting for F to end
    offloading: int = 0  # offloads not yet released


def simulate_reference(low: Lowered, offload_start: str = PAPER_OFFLOAD_START) -> Timing:
    """Run the event simulation on ``low`` and return its timing; ``offload_start`` is the rule above."""
    wait_for_end = after_forward(offload_start)
    n_ops, n_tr = low.n_ops, len(low.tr_dur)
    op_start = np.full(n_ops, np.nan)
    op_end = np.full(n_ops, np.nan)
    copies = [_Copy(j) for j in range(n_tr)]
    tensors = [_Tensor(int(s)) for s in low.t_size]
    # the operation that creates each saved tensor (a saving forward or a recomputation)
    f_op_of = {int(low.op_tensor[k]): k for k in range(n_ops) if not low.op_is_b[k] and low.op_tensor[k] >= 0}
    for j in range(n_tr):
        tensor = tensors[int(low.tr_tensor[j])]
        if low.tr_is_prefetch[j]:
            tensor.prefetches_left += 1
        else:
            tensor.offloading += 1
            tensor.offloads_running += 1
    engines: dict[int, list[int]] = {}
    for j in range(n_tr):
        engines.setdefault(int(low.tr_engine[j]), []).append(j)
    heads = {e: 0 for e in engines}
    waits: dict[int, list[int]] = {}
    for j in range(n_tr):
        waits.setdefault(int(low.tr_wait_op[j]), []).append(j)

    now = 0.0
    mem = float(low.base_bytes)
    peak = mem
    next_op = 0
    running_op: int | None = None

    issued_by: dict[tuple[int, bool], list[_Copy]] = {}
    for c in copies:
        issued_by.setdefault((int(low.tr_issue_op[c.index]), bool(low.tr_issue_end[c.index])), []).append(c)
    running_copy: dict[int, _Copy | None] = {e: None for e in engines}

    def issue(k: int, at_end: bool) -> None:
        for c in issued_by.get((k, at_end), []):
            c.issued = now

    def release(t: int, nbytes: int) -> None:
        nonlocal mem
        mem -= nbytes
        tensors[t].device -= nbytes
        tensors[t].offloading -= 1

    while True:
        progress = True
        while progress:
            progress = False
            # ends
            if running_op is not None and op_end[running_op] <= now:
                k = running_op
                running_op = None
                mem -= low.op_free[k]
                t = int(low.op_tensor[k])
                if t < 0:
                    pass  # a forward that saves nothing for a backward
                elif low.op_is_b[k]:
                    mem -= tensors[t].device
                    tensors[t].device = 0
                else:
                    for j in tensors[t].unreleased:
                        copies[j].release = now
                        release(t, int(low.tr_bytes[j]))
                    tensors[t].unreleased.clear()
                issue(k, True)
                progress = True
            for e, c in running_copy.items():
                if c is not None and c.start + low.tr_dur[c.index] <= now:
                    running_copy[e] = None
                    c.end = c.start + low.tr_dur[c.index]
                    t, nbytes = int(low.tr_tensor[c.index]), int(low.tr_bytes[c.index])
                    if low.tr_is_prefetch[c.index]:
                        tensors[t].prefetches_left -= 1
                        tensors[t].host -= nbytes
                    else:
                        tensors[t].offloads_running -= 1
                        tensors[t].host += nbytes
                        if not np.isnan(op_end[f_op_of[t]]) and op_end[f_op_of[t]] <= now:
                            c.release = now
                            release(t, nbytes)
                        else:
                            tensors[t].unreleased.append(c.index)
                    progress = True
            # compute start
            if running_op is None and next_op < n_ops:
                k = next_op
                t = int(low.op_tensor[k])
                ready = all(copies[j].end is not None for j in waits.get(k, []))
                if low.op_is_b[k]:
                    tt = tensors[t]
                    ready = ready and tt.device == tt.size and tt.prefetches_left == 0 and tt.offloading == 0
                if ready and mem + low.op_alloc[k] <= low.budget:
                    mem += low.op_alloc[k]
                    peak = max(peak, mem)
                    if not low.op_is_b[k] and t >= 0:
                        tensors[t].device = tensors[t].size
                    op_start[k] = now
                    op_end[k] = now + low.op_dur[k]
                    running_op = k
                    next_op += 1
                    issue(k, False)
                    progress = True
            # copy starts
            for e, queue in engines.items():
                if heads[e] >= len(queue):
                    continue
                if running_copy[e] is not None:
                    continue
                c = copies[queue[heads[e]]]
                if c.issued is None:
                    continue
                t, nbytes = int(low.tr_tensor[c.index]), int(low.tr_bytes[c.index])
                if low.tr_is_prefetch[c.index]:
                    if tensors[t].offloads_running or tensors[t].host < nbytes or mem + nbytes > low.budget:
                        continue
                    mem += nbytes
                    peak = max(peak, mem)
                    tensors[t].device += nbytes
                elif np.isnan(op_start[f_op_of[t]]):
                    continue  # the data is not produced yet
                elif wait_for_end and not op_end[f_op_of[t]] <= now:
                    continue  # the forward producing it has not ended
                c.start = now
                running_copy[e] = c
                heads[e] += 1
                progress = True
        # advance time
        pending = []
        if running_op is not None:
            pending.append(op_end[running_op])
        pending += [c.start + low.tr_dur[c.index] for c in running_copy.values() if c is not None]
        if not pending:
            break
        now = min(pending)

    def arr(attr: str) -> np.ndarray:
        return np.array([np.nan if getattr(c, attr) is None else getattr(c, attr) for c in copies], dtype=float)

    status = OK if next_op == n_ops and running_op is None else STUCK
    return Timing(
        status=status,
        blocked_op=-1 if status == OK else next_op,
        op_start=op_start, op_end=op_end,
        tr_start=arr("start"), tr_end=arr("end"), tr_release=arr("release"),
        peak=peak, free_at_block=low.budget - mem,
    )
