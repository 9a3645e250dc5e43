"""Activation checkpointing in the current simulator: a recompute schedule as an equivalent one.

A schedule may name checkpointed segments in ``options["recompute_segments"]``: pairs
``[a, b]`` (b exclusive) run with ``torch.utils.checkpoint``. In its forward pass a
segment keeps only its input x_a; the backward of its last stage, B_{b-1}, first
re-runs F_a..F_{b-1} (which rebuilds all the segment's saved data) and then the
backwards proceed as usual.

The simulator has no recompute operation, so ``equivalent`` rewrites such a schedule
as one it already runs, with the same memory and time (``simulate``, ``timing`` and
``validate`` apply it first, so every caller is charged the recomputation):

- the checkpoint: stage a keeps all of x_a (``saved_bytes`` becomes at least
  ``input_bytes``: x_a is held until B_a ends, whether F_a saves it or not);
- dropping: each F_i of the segment "offloads" its saved bytes (less x_a for i = a) at
  its start, released at its end (papers/004 assumption E) over a link of infinite
  bandwidth: freed at F_i's end, no time spent;
- rebuilding: the same bytes come back by zero-time "prefetches" issued at the end of
  the operation before B_{b-1}, so they are resident when B_{b-1} starts;
- recompute time: B_{b-1} lasts the segment's forward times longer, and its workspace
  is at least the largest F_i workspace plus output of the segment (the transient of
  the recomputation, which happens before B_{b-1} proper); that transient holds the
  recomputed x_b, so the original x_b is not held for B_{b-1} (``output_saved_bytes``).

The only approximation is that transient (it is held for all of B_{b-1}); the exact
version is a recompute operation in the core's operations (a planned extension).
"""

from __future__ import annotations

from dataclasses import replace

from harness.model import Profile, Schedule, Transfer
from harness.schedules import op_index

INSTANT = 1e300  # bytes/s: a copy of any size takes no time


def recompute_segments(schedule: Schedule) -> list[tuple[int, int]]:
    """The checkpointed segments ``(a, b)`` a schedule asks for (empty for most schedules)."""
    return [(int(a), int(b)) for a, b in schedule.options.get("recompute_segments", ())]


def equivalent(schedule: Schedule, profile: Profile) -> tuple[Schedule, Profile]:
    """A schedule and profile the current simulator runs like ``schedule`` with its recomputation."""
    segments = recompute_segments(schedule)
    if not segments:
        return schedule, profile
    if schedule.sub_batches != 1:
        raise NotImplementedError("recompute segments with sub-batches need the core's recompute operation")
    if schedule.transfers:
        raise NotImplementedError("recompute segments combined with offloading need the core's recompute operation")
    n = profile.n_stages
    for a, b in segments:
        if not 0 <= a < b <= n:
            raise ValueError(f"recompute segment [{a}, {b}) does not fit a chain of {n} stages")
    where = op_index(schedule.ops)
    stages = list(profile.stages)
    drops: list[tuple[int, int, int]] = []  # (stage, bytes, issue op of its prefetch)
    for a, b in segments:
        first = stages[a]
        stages[a] = replace(first, saved_bytes=max(first.saved_bytes, first.input_bytes))
        algos = [stages[i].algorithm(schedule.algorithm_of(i)) for i in range(a, b)]
        extra_time = sum(al.fwd_time for al in algos)
        outputs = [stages[i + 1].input_bytes if i + 1 < n else profile.output_bytes for i in range(a, b)]
        transient = max(al.fwd_workspace + out for al, out in zip(algos, outputs))
        # B_{b-1} reads the recomputed x_b (in the transient), not the original: a non-reentrant
        # checkpoint does not keep it past B_b, so nothing of x_b is held for B_{b-1}
        stages[b - 1] = replace(_slower_backward(stages[b - 1], schedule.algorithm_of(b - 1), extra_time, transient),
                                output_saved_bytes=0)
        back = where[("B", b - 1, 0)] - 1
        for i in range(a, b):
            drop = stages[i].saved_bytes - (stages[a].input_bytes if i == a else 0)
            if drop > 0:
                drops.append((i, drop, back))
    transfers = [Transfer(i, "offload", where[("F", i, 0)], "start", None, 0, drop)
                 for i, drop, _ in sorted(drops)]
    transfers += [Transfer(i, "prefetch", back, "end", None, 0, drop) for i, drop, back in sorted(drops, reverse=True)]
    eq_profile = replace(profile, stages=tuple(stages), d2h_bandwidth=INSTANT, h2d_bandwidth=INSTANT, variants=())
    options = {k: v for k, v in schedule.options.items() if k != "recompute_segments"}
    options["recompute_equivalent_of"] = [list(seg) for seg in segments]  # rewritten once, not twice
    eq_schedule = replace(schedule, transfers=tuple(transfers), options=options)
    return eq_schedule, eq_profile


def _slower_backward(stage, index: int, extra_time: float, transient: int):
    """``stage`` whose backward (with algorithm ``index``) also recomputes its segment."""
    if index < 0:
        return replace(stage, bwd_time=stage.bwd_time + extra_time,
                       bwd_workspace=max(stage.bwd_workspace, transient))
    algorithms = list(stage.algorithms)
    a = algorithms[index]
    algorithms[index] = replace(a, bwd_time=a.bwd_time + extra_time, bwd_workspace=max(a.bwd_workspace, transient))
    return replace(stage, algorithms=tuple(algorithms))
