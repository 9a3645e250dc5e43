"""Lower a (schedule, profile) pair to the flat arrays both simulators run on.

The memory rules are ``harness.memory``'s: every block of ``schedule_blocks`` is
allocated when the operation that creates it starts (or, for what remains of a freed
tensor, ends) and freed when the last operation that needs it ends; the blocks of a
stage's tensor (its saved data, or an ``Fc`` stage's checkpoint x_i) are the unit of
offloading, freed as one when its backward ends (or released by an offload); a prefetched
checkpoint is awaited by the recomputation R_i that reads it. An operation's duration is its stage's forward time (a
forward, with or without saving, or a recomputation) or backward time, for the
schedule's algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.memory import movable_bytes, pass_ops, schedule_blocks, stage_memory
from harness.model import Profile, Schedule, duplex_of


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
    op_tensor: np.ndarray  # int64: tensor created (F; Fc: its checkpoint; R after Fn) or consumed (B); -1 for none
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

    def resident_in_use(self) -> np.ndarray:
        """Per operation, the simulator's memory once it has started (its allocation made) with every
        saved tensor on the device: the weights, what the operations before it allocated and have not
        freed (a saved tensor is freed when its backward ends) and its own allocation. A run's memory
        at that point is this less the bytes its transfers hold on the host."""
        freed = self.op_free + np.where(self.op_is_b & (self.op_tensor >= 0),
                                        self.t_size[np.maximum(self.op_tensor, 0)], 0)
        before = np.concatenate(([0], np.cumsum(self.op_alloc - freed)[:-1]))
        return self.base_bytes + before + self.op_alloc


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


_OPS_CACHE: dict[tuple, tuple[Profile, tuple, tuple[np.ndarray, ...]]] = {}
_OPS_CACHE_SIZE = 32


def _operation_arrays(schedule: Schedule, profile: Profile, passes: list[Profile]) -> tuple[np.ndarray, ...]:
    """The per-operation arrays, the saved tensors' sizes, and per tensor what a transfer of it moves
    whole (``movable_bytes``) and the operation that first reads it back (a checkpoint's R_i, else -1):
    ``harness.memory``'s blocks, flattened.

    They depend on the operations, the algorithms and the passes only, not on the
    transfers or the budget, so the candidates a planner tries on one profile share them
    (a small cache, keyed by the identities of the operations and of the profile, which the
    passes derive from, and keeping both alive: the sub-batch passes are new objects at every call).
    """
    # by identity: hashing a few hundred operations costs as much as flattening them, and the
    # schedules of one chain share one operations tuple (training_ops, recompute_ops are cached)
    key = (id(schedule.ops), schedule.algorithms, schedule.sub_batches, id(profile))
    hit = _OPS_CACHE.get(key)  # the entry keeps both alive, so their ids are not reused while it is here
    if hit is not None:
        return _handed_out(hit[2])
    n = passes[0].n_stages
    n_ops = len(schedule.ops)
    op_is_b = np.zeros(n_ops, dtype=np.bool_)
    op_dur = np.zeros(n_ops)
    op_alloc = np.zeros(n_ops, dtype=np.int64)
    op_free = np.zeros(n_ops, dtype=np.int64)
    op_tensor = np.full(n_ops, -1, dtype=np.int64)
    all_ops = pass_ops(schedule, n)
    kinds = [ops.kind for ops in all_ops]
    for k, op in enumerate(schedule.ops):
        p = passes[op.sub_batch] if op.sub_batch < len(passes) else passes[-1]
        stage = p.stages[op.stage]
        index = schedule.algorithm_of(op.stage)
        a = stage if index < 0 else stage.algorithms[index]  # the stage's own figures are its default
        op_is_b[k] = op.kind == "B"
        op_dur[k] = a.bwd_time if op.kind == "B" else a.fwd_time
        # creates (F, Fc: the checkpoint, R after an Fn) or consumes (B) the stage's tensor
        if op.kind in ("F", "Fc", "B") or (op.kind == "R" and kinds[op.sub_batch][op.stage] == "Fn"):
            op_tensor[k] = op.sub_batch * n + op.stage

    t_size = np.zeros(len(passes) * n, dtype=np.int64)
    for b in schedule_blocks(schedule, passes):
        if b.born_at_end:  # kept when ``born`` frees the rest of its tensor: a negative free
            op_free[b.born] -= b.size
        else:
            op_alloc[b.born] += b.size
        if b.tensor >= 0:
            t_size[b.tensor] += b.size  # freed with its tensor when the backward ends
        else:
            op_free[b.dies] += b.size
    t_movable = np.zeros(len(passes) * n, dtype=np.int64)
    t_reader = np.full(len(passes) * n, -1, dtype=np.int64)
    for sb, (ops, p) in enumerate(zip(all_ops, passes)):
        for i in range(n):
            t_movable[sb * n + i] = movable_bytes(stage_memory(p, i, schedule.algorithm_of(i)), ops.kind[i])
            reader = ops.reader(i) if ops.kind[i] == "Fc" else None
            t_reader[sb * n + i] = -1 if reader is None else reader
    arrays = (op_is_b, op_dur, op_alloc, op_free, op_tensor, t_size, t_movable, t_reader)
    if len(_OPS_CACHE) >= _OPS_CACHE_SIZE:
        _OPS_CACHE.pop(next(iter(_OPS_CACHE)))
    _OPS_CACHE[key] = (profile, schedule.ops, arrays)
    return _handed_out(arrays)


def _handed_out(arrays: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Copies of the six arrays that go into ``Lowered`` (its readers may write them); the last
    two, which ``lower`` only reads, as they are in the cache."""
    return (*(x.copy() for x in arrays[:6]), *arrays[6:])


def lower(schedule: Schedule, profile: Profile, budget: float | None = None,
          duplex: bool | None = None) -> Lowered:
    """Flatten ``schedule`` on ``profile``; ``budget`` and ``duplex`` (the copy engines) default
    to the schedule's own."""
    duplex = duplex_of(schedule, duplex)
    passes = pass_profiles(profile, schedule)
    n = profile.n_stages
    op_is_b, op_dur, op_alloc, op_free, op_tensor, t_size, t_movable, t_reader = _operation_arrays(
        schedule, profile, passes)

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
        size = int(t_movable[t]) if tr.nbytes is None else tr.nbytes
        pre = tr.direction == "prefetch"
        tr_tensor[j] = t
        tr_is_prefetch[j] = pre
        tr_bytes[j] = size
        tr_dur[j] = size / (p.h2d_bandwidth if pre else p.d2h_bandwidth)
        tr_issue_op[j] = tr.issue_op
        tr_issue_end[j] = tr.issue_at == "end"
        tr_wait_op[j] = -1 if tr.wait_op is None else tr.wait_op
        reader = int(t_reader[t])  # a checkpoint's: R_i reads it, so it waits for it at the latest
        if pre and 0 <= reader and (tr.wait_op is None or tr.wait_op > reader):
            tr_wait_op[j] = reader
        tr_engine[j] = 1 if (duplex and pre) else 0

    return Lowered(
        budget=float(schedule.budget_bytes if budget is None else budget),
        base_bytes=passes[0].weight_bytes,
        op_is_b=op_is_b, op_dur=op_dur, op_alloc=op_alloc, op_free=op_free, op_tensor=op_tensor,
        t_size=t_size,
        tr_tensor=tr_tensor, tr_is_prefetch=tr_is_prefetch, tr_bytes=tr_bytes, tr_dur=tr_dur,
        tr_issue_op=tr_issue_op, tr_issue_end=tr_issue_end, tr_wait_op=tr_wait_op, tr_engine=tr_engine,
    )
