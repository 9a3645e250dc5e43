"""Lower a (schedule, profile) pair to the flat arrays both simulators run on.

The memory model (papers/004 section 3.1, widened to saved bytes that differ from the
input): for stage i of a sub-batch,

- x_i (``input_bytes``) is allocated when F_{i-1} starts (x_0 when F_0 starts);
- F_i allocates at its start its output x_{i+1} (``output_bytes`` for the last stage), its
  workspace, and ``extra_i = max(0, saved_i - input_i)``; at its end it frees the workspace
  and ``drop_i = max(0, input_i - saved_i)``, the part of x_i that B_i does not need;
- what remains of stage i, ``saved_i`` bytes, is the unit that is offloaded and prefetched;
  it is freed when B_i ends;
- B_i allocates y_i (``grad_bytes``) and its workspace (and, for the last stage, the
  gradient of the output) and frees at its end the workspace, y_{i+1}, saved_i (and the
  last stage's output; B_0 frees y_0 too);
- the weights stay resident throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.model import Profile, Schedule


@dataclass(frozen=True)
class Lowered:
    """The arrays of one (schedule, profile): operations, saved tensors, transfers."""

    budget: float
    base_bytes: int  # resident all the time (weights)
    # operations, in schedule order
    op_is_b: np.ndarray  # bool
    op_dur: np.ndarray  # float64
    op_alloc: np.ndarray  # int64: bytes allocated at start
    op_free: np.ndarray  # int64: bytes freed at end, not counting saved data
    op_tensor: np.ndarray  # int64: saved tensor produced (F) or consumed (B)
    # saved tensors, index = sub_batch * L + stage
    t_size: np.ndarray  # int64
    # transfers, in list order
    tr_tensor: np.ndarray  # int64
    tr_is_prefetch: np.ndarray  # bool
    tr_bytes: np.ndarray  # int64
    tr_dur: np.ndarray  # float64
    tr_issue_op: np.ndarray  # int64
    tr_issue_end: np.ndarray  # bool
    tr_wait_op: np.ndarray  # int64 (-1: none)
    tr_engine: np.ndarray  # int64 (0: d2h or shared, 1: h2d when duplex)

    @property
    def n_ops(self) -> int:
        return len(self.op_dur)


def stage_profile(profile: Profile, schedule: Schedule) -> Profile:
    """The profile whose stage figures a schedule's operations use (its sub-batch's)."""
    if schedule.sub_batches <= 1:
        return profile
    return profile.at_batch(math.ceil(profile.batch_size / schedule.sub_batches))


def lower(schedule: Schedule, profile: Profile, budget: float | None = None, duplex: bool = False) -> Lowered:
    """Flatten ``schedule`` on ``profile``; ``budget`` defaults to the schedule's own."""
    p = stage_profile(profile, schedule)
    n = p.n_stages
    stages = p.stages
    algos = [s.algorithm(schedule.algorithm_of(i)) for i, s in enumerate(stages)]
    inp = [s.input_bytes for s in stages]
    saved = [s.saved_bytes for s in stages]
    out = inp[1:] + [p.output_bytes]

    n_ops = len(schedule.ops)
    op_is_b = np.zeros(n_ops, dtype=np.bool_)
    op_dur = np.zeros(n_ops)
    op_alloc = np.zeros(n_ops, dtype=np.int64)
    op_free = np.zeros(n_ops, dtype=np.int64)
    op_tensor = np.zeros(n_ops, dtype=np.int64)
    for k, op in enumerate(schedule.ops):
        i, a = op.stage, algos[op.stage]
        op_tensor[k] = op.sub_batch * n + i
        if op.kind == "F":
            op_dur[k] = a.fwd_time
            op_alloc[k] = (inp[0] if i == 0 else 0) + out[i] + a.fwd_workspace + max(0, saved[i] - inp[i])
            op_free[k] = a.fwd_workspace + max(0, inp[i] - saved[i])
        else:
            op_is_b[k] = True
            op_dur[k] = a.bwd_time
            last = i == n - 1
            op_alloc[k] = stages[i].grad_bytes + a.bwd_workspace + (p.output_bytes if last else 0)
            op_free[k] = (
                a.bwd_workspace
                + (2 * p.output_bytes if last else stages[i + 1].grad_bytes)
                + (stages[0].grad_bytes if i == 0 else 0)
            )

    n_sb = max(schedule.sub_batches, 1)
    t_size = np.array(saved * n_sb, dtype=np.int64)

    m = len(schedule.transfers)
    tr_tensor = np.zeros(m, dtype=np.int64)
    tr_is_prefetch = np.zeros(m, dtype=np.bool_)
    tr_bytes = np.zeros(m, dtype=np.int64)
    tr_dur = np.zeros(m)
    tr_issue_op = np.zeros(m, dtype=np.int64)
    tr_issue_end = np.zeros(m, dtype=np.bool_)
    tr_wait_op = np.full(m, -1, dtype=np.int64)
    tr_engine = np.zeros(m, dtype=np.int64)
    for j, tr in enumerate(schedule.transfers):
        t = tr.sub_batch * n + tr.stage
        size = saved[tr.stage] if tr.nbytes is None else tr.nbytes
        pre = tr.direction == "prefetch"
        tr_tensor[j] = t
        tr_is_prefetch[j] = pre
        tr_bytes[j] = size
        tr_dur[j] = size / (p.h2d_bandwidth if pre else p.d2h_bandwidth)
        tr_issue_op[j] = tr.issue_op
        tr_issue_end[j] = tr.issue_at == "end"
        tr_wait_op[j] = -1 if tr.wait_op is None else tr.wait_op
        tr_engine[j] = 1 if (duplex and pre) else 0

    return Lowered(
        budget=float(schedule.budget_bytes if budget is None else budget),
        base_bytes=p.weight_bytes,
        op_is_b=op_is_b, op_dur=op_dur, op_alloc=op_alloc, op_free=op_free, op_tensor=op_tensor,
        t_size=t_size,
        tr_tensor=tr_tensor, tr_is_prefetch=tr_is_prefetch, tr_bytes=tr_bytes, tr_dur=tr_dur,
        tr_issue_op=tr_issue_op, tr_issue_end=tr_issue_end, tr_wait_op=tr_wait_op, tr_engine=tr_engine,
    )
