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
- the part of x_{i+1} that B_i needs (``output_saved_bytes`` of stage i, counted in
  saved_{i+1}) stays when B_{i+1} frees saved_{i+1}, and is freed when B_i ends
  (papers/004 section 3.1: B_i requires x_{i+1});
- the weights stay resident throughout.
"""

from __future__ import annotations

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


def pass_sizes(batch_size: int, sub_batches: int) -> list[int]:
    """The samples of each pass when ``batch_size`` is split into ``sub_batches`` passes.

    As even as possible: the first ``batch_size % sub_batches`` passes take one more.
    """
    n = max(sub_batches, 1)
    base, extra = divmod(batch_size, n)
    return [base + (1 if k < extra else 0) for k in range(n)]


def pass_profiles(profile: Profile, schedule: Schedule) -> list[Profile]:
    """The profile of each sub-batch pass of ``schedule`` (one entry when it does not split)."""
    if schedule.sub_batches <= 1:
        return [profile]
    cache: dict[int, Profile] = {}
    return [cache.setdefault(b, profile.at_batch(max(b, 1)))
            for b in pass_sizes(profile.batch_size, schedule.sub_batches)]


def stage_profile(profile: Profile, schedule: Schedule) -> Profile:
    """The profile of a schedule's largest (first) pass: the sizes its transfers may not exceed."""
    return pass_profiles(profile, schedule)[0]


def lower(schedule: Schedule, profile: Profile, budget: float | None = None, duplex: bool = False) -> Lowered:
    """Flatten ``schedule`` on ``profile``; ``budget`` defaults to the schedule's own."""
    passes = pass_profiles(profile, schedule)
    n = profile.n_stages

    n_ops = len(schedule.ops)
    op_is_b = np.zeros(n_ops, dtype=np.bool_)
    op_dur = np.zeros(n_ops)
    op_alloc = np.zeros(n_ops, dtype=np.int64)
    op_free = np.zeros(n_ops, dtype=np.int64)
    op_tensor = np.zeros(n_ops, dtype=np.int64)
    for k, op in enumerate(schedule.ops):
        p = passes[op.sub_batch] if op.sub_batch < len(passes) else passes[-1]
        i, stages = op.stage, p.stages
        a = stages[i].algorithm(schedule.algorithm_of(i))
        inp = stages[i].input_bytes
        saved = stages[i].saved_bytes
        out = stages[i + 1].input_bytes if i + 1 < n else p.output_bytes
        op_tensor[k] = op.sub_batch * n + i
        if op.kind == "F":
            op_dur[k] = a.fwd_time
            op_alloc[k] = (inp if i == 0 else 0) + out + a.fwd_workspace + max(0, saved - inp)
            op_free[k] = a.fwd_workspace + max(0, inp - saved)
        else:
            op_is_b[k] = True
            op_dur[k] = a.bwd_time
            last = i == n - 1
            op_alloc[k] = stages[i].grad_bytes + a.bwd_workspace + (p.output_bytes if last else 0)
            op_free[k] = (
                a.bwd_workspace
                + (2 * p.output_bytes if last else stages[i + 1].grad_bytes)
                + (stages[0].grad_bytes if i == 0 else 0)
                # x_{i+1}'s part B_i needed, held since B_{i+1}; the part of x_i that B_{i-1}
                # needs stays when saved_i goes (a negative free: net, B_i still frees)
                + stages[i].output_saved_bytes - (stages[i - 1].output_saved_bytes if i else 0)
            )

    t_size = np.array([s.saved_bytes for p in passes for s in p.stages], dtype=np.int64)

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
        p = passes[tr.sub_batch] if tr.sub_batch < len(passes) else passes[-1]
        size = p.stages[tr.stage].saved_bytes if tr.nbytes is None else tr.nbytes
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
        base_bytes=passes[0].weight_bytes,
        op_is_b=op_is_b, op_dur=op_dur, op_alloc=op_alloc, op_free=op_free, op_tensor=op_tensor,
        t_size=t_size,
        tr_tensor=tr_tensor, tr_is_prefetch=tr_is_prefetch, tr_bytes=tr_bytes, tr_dur=tr_dur,
        tr_issue_op=tr_issue_op, tr_issue_end=tr_issue_end, tr_wait_op=tr_wait_op, tr_engine=tr_engine,
    )
