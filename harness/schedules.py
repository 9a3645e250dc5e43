"""Building blocks planners share: the budget check, keep-all, the ordered no-wait schedule and
the refusal when no prefetch order of an offload set fits it.

papers/004 (Lemma 3, Prop. 1) shows that for a fixed set of offloaded activations the best
schedule is ordered (offloads by increasing index, prefetches by decreasing index) and
no-wait (everything as early as data and memory allow). ``ordered_schedule`` builds it;
how early prefetches may be issued is the one free choice left, and
``best_ordered_schedule`` tries the candidates in the simulator and keeps the fastest.

Prefetching may also begin during the last forward operations, once every offload is
done and memory allows (papers/004 section 5.2.2, eq. (10): "schedule S can perform
prefetching during the last forward operations"): ``prefetch_lead``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from harness.errors import InfeasibleBudget, InvalidSchedule, PlanContractError
from harness.model import Op, Profile, Schedule, Transfer, op_index, training_ops  # planners take op_index here
from harness.units import format_bytes


def recompute_ops(n_stages: int, segments: list[tuple[int, int]], sub_batches: int = 1) -> tuple[Op, ...]:
    """The training order with each segment ``(a, b)`` (b exclusive) checkpointed and recomputed.

    In the forward pass stage a keeps only its input (``Fc``, the checkpoint) and stages
    a+1..b-1 save nothing (``Fn``); just before B_{b-1} the segment is recomputed, R_a..R_{b-1},
    which re-creates its saved data (papers/004 section 2.1's checkpointing, as PyTorch's
    non-reentrant ``torch.utils.checkpoint`` runs it). Stages outside the segments save (``F``).
    Like ``training_ops``, one tuple per shape, shared.
    """
    return _recompute_ops(int(n_stages), tuple((int(a), int(b)) for a, b in segments), int(sub_batches))


@functools.lru_cache(maxsize=64)
def _recompute_ops(n_stages: int, segments: tuple[tuple[int, int], ...], sub_batches: int) -> tuple[Op, ...]:
    first = {a for a, b in segments}
    inside = {i for a, b in segments for i in range(a + 1, b)}
    last = {b - 1: a for a, b in segments}
    ops: list[Op] = []
    for sb in range(sub_batches):
        ops.extend(Op("Fc" if i in first else "Fn" if i in inside else "F", i, sb) for i in range(n_stages))
        for i in reversed(range(n_stages)):
            if i in last:
                ops.extend(Op("R", j, sb) for j in range(last[i], i + 1))
            ops.append(Op("B", i, sb))
    return tuple(ops)


def checked_schedule(planner: Any, schedule: Any, budget: int) -> Schedule:
    """What ``planner`` returned for the chain budget ``budget``, checked before anything runs it: a
    ``Schedule`` whose ``budget_bytes`` (the budget the executors enforce) is a whole number of bytes not
    above the one it was given. A cap below it is the planner's to choose (vDNN++ caps memory at vDNN's
    peak, papers/001 section 4.1) and is kept. A plugin's slip is a ``PlanContractError`` (a ``TypeError``)
    naming the planner (an ``error`` row)."""
    name = getattr(planner, "name", type(planner).__name__)
    if not isinstance(schedule, Schedule):
        raise PlanContractError(f"planner {name} returned {type(schedule).__name__}, not a Schedule "
                                "(a budget it cannot fit raises InfeasibleBudget)")
    claimed = schedule.budget_bytes
    if isinstance(claimed, float) and claimed.is_integer():
        claimed = int(claimed)
    if isinstance(claimed, bool) or not isinstance(claimed, (int, np.integer)):
        raise PlanContractError(f"planner {name} returned a schedule whose budget_bytes is {claimed!r}, not a "
                                f"number of bytes (the budget it was given: {budget})")
    if claimed > budget:
        raise PlanContractError(f"planner {name} returned a schedule for {claimed} bytes, above the {budget} it "
                                "was given (Schedule.budget_bytes is the budget the executors enforce)")
    return replace(schedule, budget_bytes=int(claimed))


def checked_refusal(planner: Any, exc: InfeasibleBudget, budget: int) -> InfeasibleBudget:
    """``planner``'s refusal of the chain budget ``budget``, checked before it becomes an ``infeasible`` row:
    its ``needed_bytes``, when it gives one, is a whole number of bytes above that budget (what the
    tables show as "needs at least"). A slip (1 byte, a float of bytes) is a ``PlanContractError`` (an
    ``error`` row), as ``harness.testing.check_refusal`` would find it."""
    need = exc.needed_bytes
    if need is None:
        return exc
    if isinstance(need, float) and need.is_integer():
        need = int(need)
    if isinstance(need, bool) or not isinstance(need, (int, np.integer)) or need <= budget:
        name = getattr(planner, "name", type(planner).__name__)
        raise PlanContractError(f"planner {name} refused the budget of {budget} bytes saying it needs "
                                f"{exc.needed_bytes!r}; InfeasibleBudget.needed_bytes is a whole number of bytes above "
                                f"the budget it was given ({exc})") from None
    exc.needed_bytes = int(need)
    return exc


def checked_plan(planner: Any, profile: Profile, budget: int, options: dict[str, Any]) -> Schedule:
    """``planner.plan(profile, budget, **options)`` with both of its answers checked: a refusal
    (``checked_refusal``) and a schedule (``checked_schedule``, then its structure,
    ``harness.validate.check_structure``: an ``InvalidSchedule`` before the memory rules, the bounds or an
    executor read what they could not make sense of). The one call of a planner that the runner, the
    command line and the device budget make."""
    from harness.validate import check_structure

    try:
        schedule = planner.plan(profile, budget, **options)
    except InfeasibleBudget as exc:
        raise checked_refusal(planner, exc, budget)
    schedule = checked_schedule(planner, schedule, budget)
    problems = check_structure(schedule, profile)
    if problems:
        raise InvalidSchedule(problems)
    return schedule


def check_budget(profile: Profile, budget: int, planner: str, memory_optimal: bool = False) -> None:
    """Raise ``InfeasibleBudget`` ("needs at least N bytes") when no schedule can fit."""
    from harness.bounds import min_memory

    need = min_memory(profile, memory_optimal)
    if budget < need:
        raise InfeasibleBudget(
            f"infeasible: {planner} needs at least {need} bytes ({format_bytes(need)}) for "
            f"{profile.model} at batch {profile.batch_size}; the budget is {budget} bytes ({format_bytes(budget)})",
            needed_bytes=need,
        )


def unconstrained_peak(schedule: Schedule, profile: Profile, duplex: bool | None = None) -> int:
    """The peak device bytes of ``schedule`` run with no budget: the budget it runs unhindered in
    (copy engines ``duplex``, default: the schedule's).

    A schedule the simulator cannot complete under a budget peaks above it when nothing
    limits memory, so this is what a planner reports as ``InfeasibleBudget.needed_bytes``
    when the schedules it tried all fail.
    """
    from harness.simulate.executor import timing

    _, tm = timing(schedule, profile, budget=math.inf, duplex=duplex)
    return int(tm.peak)


def keep_all_schedule(profile: Profile, budget: int, planner: str = "keep-all") -> Schedule:
    """No offloading: the plain training iteration."""
    return Schedule(planner, int(budget), training_ops(profile.n_stages))


def ordered_schedule(
    profile: Profile,
    budget: int,
    offload: Mapping[int, int | None] | set[int] | list[int],
    *,
    planner: str,
    prefetch_window: int | None = None,
    prefetch_lead: int | None = None,
    sync: bool = False,
    sub_batches: int = 1,
    algorithms: tuple[int, ...] = (),
    options: dict | None = None,
    recompute: list[tuple[int, int]] | tuple = (),
) -> Schedule:
    """The ordered schedule that offloads ``offload`` (stage -> bytes, None: all saved bytes).

    Offload i is issued when F_i starts; with ``sync`` the next forward waits for it
    (vDNN's end-of-layer synchronisation), else nothing waits but memory (no-wait).
    Prefetches run by decreasing stage; prefetch i is issued when B_{i+w} starts for
    window w (``None``: as soon as the backward pass starts), or when the last forward
    ends if there is no such backward operation. With ``prefetch_lead`` a >= 1, the
    prefetches that would be issued when the backward pass starts (all of them for window
    None) are issued at the start of F_{L-a} instead (F_{i+1} if that is later, the end of
    the last forward for the last stage): the copy engine runs them as soon as the offloads
    before them are done and the memory they reserve fits (papers/004 eq. (10)).

    ``recompute``: segments ``(a, b)`` checkpointed and recomputed as ``recompute_ops`` says.
    Offloading the first stage a of a segment moves its checkpoint x_a (``harness.memory``):
    the offload is issued when Fc_a starts, the prefetch no later than the start of B_b (the
    end of the last forward when b = L), so that it is issued before R_a, which waits for it.
    The other stages of a segment save nothing and cannot be offloaded.
    """
    amounts = dict.fromkeys(offload) if not isinstance(offload, Mapping) else dict(offload)
    n = profile.n_stages
    ops, where, forward = _operations(n, tuple(map(tuple, recompute)), sub_batches)
    segment_end = {a: b for a, b in recompute}
    transfers: list[Transfer] = []
    for sb in range(sub_batches):
        stages = sorted(amounts)
        for i in stages:
            wait = forward[(i + 1, sb)] if sync and i + 1 < n else None
            transfers.append(Transfer(i, "offload", forward[(i, sb)], "start", wait, sb, amounts[i]))
        for i in reversed(stages):
            j = n - 1 if prefetch_window is None else i + prefetch_window
            if j < n - 1 and j > i:
                issue, at = where[("B", j, sb)], "start"
            elif prefetch_lead is not None and i < n - 1:
                issue, at = forward[(max(n - prefetch_lead, i + 1), sb)], "start"
            elif j == n - 1 and j > i:
                issue, at = where[("B", j, sb)], "start"
            else:
                issue, at = forward[(n - 1, sb)], "end"
            wait = None
            if i in segment_end:  # a checkpoint: back before R_i, which reads it, at the latest
                b = segment_end[i]
                latest = (where[("B", b, sb)], "start") if b < n else (forward[(n - 1, sb)], "end")
                if (issue, at == "end") > (latest[0], latest[1] == "end"):
                    issue, at = latest
                wait = where[("R", i, sb)]
            transfers.append(Transfer(i, "prefetch", issue, at, wait, sb, amounts[i]))
    return Schedule(
        planner, int(budget), ops, tuple(transfers), algorithms=algorithms, sub_batches=sub_batches,
        options=dict(options or {}),
    )


@functools.lru_cache(maxsize=64)
def _operations(n: int, recompute: tuple[tuple[int, int], ...], sub_batches: int):
    """The operations of an ordered schedule, their positions, and each forward's position: a
    planner builds hundreds of candidates on one chain, and they share the lookups as they share
    the operations."""
    ops = recompute_ops(n, list(recompute), sub_batches) if recompute else training_ops(n, sub_batches)
    forward = {(op.stage, op.sub_batch): k for k, op in enumerate(ops) if op.is_forward}
    return ops, op_index(ops), forward


def best_ordered_schedule(profile: Profile, budget: int, offload, *, planner: str, duplex: bool = False,
                          prefetch_during_forward: bool = False, **kwargs) -> Schedule | None:
    """The fastest feasible ``ordered_schedule`` over prefetch windows (None if none is feasible)."""
    return fastest_ordered_schedule(profile, budget, offload, planner=planner, duplex=duplex,
                                    prefetch_during_forward=prefetch_during_forward, **kwargs)[0]


def fastest_ordered_schedule(profile: Profile, budget: int, offload, *, planner: str, duplex: bool = False,
                             prefetch_during_forward: bool = False, **kwargs) -> tuple[Schedule | None, float]:
    """``best_ordered_schedule`` and its simulated makespan (inf when no window is feasible).

    Windows tried: as early as possible, then L/2, L/4, ... down to 1 (just in time, which
    is always feasible when the offloaded set leaves room for every operation). With
    ``prefetch_during_forward`` each window is also tried with prefetch leads L, L/2, ...,
    1 (``ordered_schedule``'s ``prefetch_lead``); ties keep the earlier candidate, so
    the schedules without a lead win unless a lead is strictly faster.
    """
    from harness.simulate.executor import makespan

    n = profile.n_stages
    windows: list[int | None] = [None, *_halvings(n)]
    leads: list[int | None] = [None, n, *_halvings(n)] if prefetch_during_forward else [None]
    best, best_time = None, float("inf")
    seen: set = set()
    for window in windows:
        for lead in leads:
            schedule = ordered_schedule(profile, budget, offload, planner=planner, prefetch_window=window,
                                        prefetch_lead=lead, **kwargs)
            if schedule.transfers in seen:
                continue
            seen.add(schedule.transfers)
            time = makespan(schedule, profile, duplex=duplex)
            if time is not None and time < best_time:
                best, best_time = schedule, time
    return best, best_time


def just_in_time_need(profile: Profile, offload: Mapping[int, int | None] | set[int] | list[int],
                      duplex: bool = False) -> int:
    """The bytes an offload set needs with just-in-time prefetches: the ``unconstrained_peak`` of its
    ``ordered_schedule`` with a prefetch window of 1, what a planner reports when no order of it fits."""
    just_in_time = ordered_schedule(profile, 0, offload, planner="just-in-time", prefetch_window=1)
    return unconstrained_peak(just_in_time, profile, duplex)


def offload_set_refusal(profile: Profile, budget: int, offload: Mapping[int, int | None] | set[int] | list[int],
                        planner: str, duplex: bool = False) -> InfeasibleBudget:
    """The error when no prefetch order of ``offload`` fits: the bytes that set needs with
    just-in-time prefetches (``just_in_time_need``), as ``needed_bytes``."""
    need = just_in_time_need(profile, offload, duplex)
    return InfeasibleBudget(
        f"infeasible: {planner} found no feasible prefetch order; its offload set needs {need} bytes "
        f"({format_bytes(need)}) with just-in-time prefetches, the budget is {budget} bytes ({format_bytes(budget)})",
        needed_bytes=need,
    )


def _halvings(n: int) -> list[int]:
    """L/2, L/4, ... (each above 1), then 1."""
    out = []
    w = n // 2
    while w > 1:
        out.append(w)
        w //= 2
    return [*out, 1]
