"""``validate(schedule, profile, budget)``: check any schedule, whoever made it.

Two layers, each independent of the planner:

1. the schedule as data: every stage of every pass has one forward (``F``, ``Fc`` or
   ``Fn``), one backward and, exactly when its forward did not save, one recomputation
   ``R``; all in dependency order; transfers that name real stages and operations, no
   offload of data not produced yet, one prefetch for every offload, issued before the
   operation that needs it. What a transfer of stage i moves depends on its forward: after
   ``F`` its saved data (saved_i bytes), read again by B_i; after ``Fc`` its checkpoint (all
   of x_i), read again by R_i, so the prefetch must be issued before R_i; after ``Fn``
   nothing (recomputed data never moves: such a transfer is refused);
2. the schedule as run: the reference simulator runs it, and its timeline and memory
   trace are checked against the profile from scratch: operations in order and for
   their durations, no copy before its data exists, each backward (each recomputation
   of a checkpoint) after its data is back, one copy at a time per engine, and a sweep over the memory trace that never
   exceeds the budget.

The checker keeps its own derivation of every rule it checks, deliberately: the order
of operations, which data each operation reads, what a transfer moves and how long an
operation or a copy lasts are worked out here from the profile, not taken from
``harness.memory``, the lowering or the simulator, so that a mistake there shows up as
a violation here instead of being repeated. (The memory trace it sweeps is the run's:
the budget check is of what the simulator held, bracketed by two sweeps.)

Each problem is a ``Violation`` naming the stage and the time it happens.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from harness.model import OP_KINDS, Op, Profile, Run, Schedule, Transfer, duplex_of, op_index

_EPS = 1e-9


def _passes(profile: Profile, schedule: Schedule) -> list[Profile]:
    """The profile of each sub-batch pass, derived here as the module says: the batch split as evenly
    as it goes, the larger passes first (``sub_batches`` of them, each of at least one sample)."""
    n = max(schedule.sub_batches, 1)
    if n == 1:
        return [profile]
    base, extra = divmod(profile.batch_size, n)
    sizes = [max(base + (k < extra), 1) for k in range(n)]
    at = {b: profile.at_batch(b) for b in set(sizes)}
    return [at[b] for b in sizes]


def _spacing(t: float) -> float:
    """How far a duration read off a clock at ``t`` seconds may be from the profile's: 1e-12 s, or a few
    units in the last place of ``t`` once those are larger (past about 4000 s)."""
    return max(1e-12, 4 * math.ulp(t))


@dataclass(frozen=True)
class Violation:
    """One broken rule: where (stage, time in seconds; None when static) and what."""

    message: str
    stage: int | None = None
    time: float | None = None

    def __str__(self) -> str:
        where = []
        if self.stage is not None:
            where.append(f"stage {self.stage}")
        if self.time is not None:
            where.append(f"t={self.time:.6g}s")
        return f"{self.message}" + (f" ({', '.join(where)})" if where else "")


def validate(schedule: Schedule, profile: Profile, budget: float | None = None, *,
             duplex: bool | None = None) -> list[Violation]:
    """Every violation of ``schedule`` on ``profile`` under ``budget`` with copy engines ``duplex``
    (defaults: the schedule's)."""
    budget = float(schedule.budget_bytes if budget is None else budget)
    duplex = duplex_of(schedule, duplex)
    problems = check_structure(schedule, profile)
    if problems:
        return problems
    from harness.simulate.executor import simulate

    run = simulate(schedule, profile, budget=budget, duplex=duplex, engine="reference")
    if not run.feasible:
        blocked = None
        return [Violation(f"the schedule cannot run within the budget: {run.message}", blocked)]
    return check_run(schedule, profile, run, budget, duplex)


def _whole(value: object) -> bool:
    """An int (NumPy's too), not a bool: ``True`` is an int to Python, never a stage or an index to a schedule."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_types(schedule: Schedule) -> list[Violation]:
    """The schedule is made of the vocabulary's parts: ``Op``s of the kinds F, Fc, Fn, R and B, ``Transfer``s
    whose direction, issue point, stages and indices are of the kinds ``harness.model`` defines, and
    whole numbers of bytes. What the other checks, and every executor, read without checking again."""
    out: list[Violation] = []
    if not _whole(schedule.sub_batches):
        return [Violation(f"sub_batches is {schedule.sub_batches!r}, not an int")]
    if not isinstance(schedule.ops, (tuple, list)):
        return [Violation(f"ops is a {type(schedule.ops).__name__}, not a sequence of Op")]
    for k, op in enumerate(schedule.ops):
        if not isinstance(op, Op):
            out.append(Violation(f"operation {k} is {op!r}, not an Op"))
        elif op.kind not in OP_KINDS:
            out.append(Violation(f"operation {k} has kind {op.kind!r}, not one of {', '.join(OP_KINDS)}"))
        elif not (_whole(op.stage) and _whole(op.sub_batch)):
            out.append(Violation(f"operation {k} names stage {op.stage!r} of sub-batch {op.sub_batch!r}, not ints"))
    if not isinstance(schedule.transfers, (tuple, list)):
        return [*out, Violation(f"transfers is a {type(schedule.transfers).__name__}, not a sequence of Transfer")]
    for j, tr in enumerate(schedule.transfers):
        if not isinstance(tr, Transfer):
            out.append(Violation(f"transfer {j} is {tr!r}, not a Transfer"))
            continue
        if tr.direction not in ("offload", "prefetch"):
            out.append(Violation(f"transfer {j} has direction {tr.direction!r}, not 'offload' or 'prefetch'"))
        if tr.issue_at not in ("start", "end"):
            out.append(Violation(f"transfer {j} is issued at the {tr.issue_at!r} of its operation, not its 'start' "
                                 "or 'end'"))
        for field in ("stage", "sub_batch", "issue_op"):
            if not _whole(getattr(tr, field)):
                out.append(Violation(f"transfer {j} has {field} {getattr(tr, field)!r}, not an int"))
        for field in ("wait_op", "nbytes"):
            value = getattr(tr, field)
            if value is not None and not _whole(value):
                out.append(Violation(f"transfer {j} has {field} {value!r}, not an int or None"))
    if not isinstance(schedule.algorithms, (tuple, list)) or not all(_whole(a) for a in schedule.algorithms):
        out.append(Violation(f"algorithms is {schedule.algorithms!r}, not a sequence of ints"))
    return out


def check_structure(schedule: Schedule, profile: Profile) -> list[Violation]:
    """Static checks: operations, algorithms and transfers make sense for this profile."""
    out = check_types(schedule)
    if out:
        return out
    n, n_sb = profile.n_stages, schedule.sub_batches
    if not 1 <= n_sb <= profile.batch_size:
        return [Violation(f"sub_batches must be between 1 and the batch size {profile.batch_size}, got {n_sb}")]
    counts = Counter((op.kind, op.stage, op.sub_batch) for op in schedule.ops)
    for kind, i, sb in sorted(counts):
        if not (0 <= i < n and 0 <= sb < n_sb):
            out.append(Violation(f"operation {kind}{i} of sub-batch {sb} is not in this chain", i))
    forward_kind: dict[tuple[int, int], str] = {}
    for sb in range(n_sb):
        for i in range(n):
            forwards = [(k, counts[(k, i, sb)]) for k in ("F", "Fc", "Fn") if counts[(k, i, sb)]]
            if not forwards:
                out.append(Violation(f"the forward of stage {i} of sub-batch {sb} is missing", i))
            elif len(forwards) > 1 or forwards[0][1] > 1:
                out.append(Violation(f"stage {i} of sub-batch {sb} has {sum(c for _, c in forwards)} forwards", i))
            else:
                forward_kind[(i, sb)] = forwards[0][0]
            for kind in ("B", "R"):
                c = counts[(kind, i, sb)]
                if kind == "B" and not c:
                    out.append(Violation(f"operation B{i} of sub-batch {sb} is missing", i))
                if c > 1:
                    out.append(Violation(f"operation {kind}{i} of sub-batch {sb} appears {c} times", i))
            kind = forward_kind.get((i, sb))
            recomputed = counts[("R", i, sb)] > 0
            if kind == "F" and recomputed:
                out.append(Violation(f"R{i} recomputes what F{i} saved (sub-batch {sb}): recompute only after Fc or Fn", i))
            if kind in ("Fc", "Fn") and not recomputed:
                out.append(Violation(f"{kind}{i} does not save for B{i} and no R{i} recomputes it (sub-batch {sb})", i))
            if kind == "Fn" and i == 0:
                out.append(Violation("Fn0 drops the batch itself, which nothing can recompute: use Fc0", i))
            elif kind == "Fn" and forward_kind.get((i - 1, sb)) == "F":
                out.append(Violation(f"R{i} needs x_{i}, which only a recomputation of stage {i - 1} re-creates, "
                                     f"but stage {i - 1} is not recomputed (sub-batch {sb})", i))
    if out:
        return out
    pos = op_index(schedule.ops)
    for sb in range(n_sb):
        fwd = {i: pos[(forward_kind[(i, sb)], i, sb)] for i in range(n)}
        for i in range(n):
            kind = forward_kind[(i, sb)]
            if i and fwd[i] < fwd[i - 1]:
                out.append(Violation(f"{kind}{i} runs before {forward_kind[(i - 1, sb)]}{i - 1}, whose output it reads", i))
            after = fwd[n - 1] if i == n - 1 else pos[("B", i + 1, sb)]
            if pos[("B", i, sb)] < after:
                what = "the last forward" if i == n - 1 else f"B{i + 1}"
                out.append(Violation(f"B{i} runs before {what}, whose result it needs", i))
            r = pos.get(("R", i, sb))
            if r is None:
                continue
            if r < fwd[n - 1]:
                out.append(Violation(f"R{i} runs before the forward pass is over (sub-batch {sb})", i))
            if r > pos[("B", i, sb)]:
                out.append(Violation(f"R{i} runs after B{i}, which needs what it re-creates", i))
            if kind == "Fn" and r < pos[("R", i - 1, sb)]:
                out.append(Violation(f"R{i} runs before R{i - 1}, which re-creates its input", i))
    if schedule.algorithms and len(schedule.algorithms) != n:
        return [*out, Violation(f"algorithms lists {len(schedule.algorithms)} entries for {n} stages")]
    for i, a in enumerate(schedule.algorithms):
        if not -1 <= a < len(profile.stages[i].algorithms):
            out.append(Violation(f"algorithm {a} does not exist for stage {i}", i))
    if out:  # the transfers' sizes below are read through the algorithms
        return out

    passes = _passes(profile, schedule)
    offloads: dict[tuple[int, int], int] = {}
    prefetches: dict[tuple[int, int], int] = {}
    for j, tr in enumerate(schedule.transfers):
        if not (0 <= tr.stage < n and 0 <= tr.sub_batch < n_sb):
            out.append(Violation(f"transfer {j} names stage {tr.stage} of sub-batch {tr.sub_batch}, which does not exist"))
            continue
        if not 0 <= tr.issue_op < len(schedule.ops):
            out.append(Violation(f"transfer {j} is issued at operation {tr.issue_op}, which does not exist", tr.stage))
            continue
        if tr.wait_op is not None and not (tr.issue_op <= tr.wait_op < len(schedule.ops)):
            out.append(Violation(f"transfer {j} makes operation {tr.wait_op} wait, which does not come after its issue", tr.stage))
        key = (tr.stage, tr.sub_batch)
        kind = forward_kind[key]
        if kind == "Fn":
            out.append(Violation(f"transfer {j} moves the saved data of stage {tr.stage}, which is recomputed, not saved "
                                 f"by its forward (Fn{tr.stage} keeps nothing to move)", tr.stage))
            continue
        size = _movable(tr.stage, tr.sub_batch, kind, passes)
        what = "checkpoint" if kind == "Fc" else "saved tensor"
        if tr.nbytes is not None and not 0 <= tr.nbytes <= size:
            out.append(Violation(f"transfer {j} moves {tr.nbytes} bytes of a {size}-byte {what}", tr.stage))
        book = prefetches if tr.direction == "prefetch" else offloads
        if key in book:
            out.append(Violation(f"stage {tr.stage} is {tr.direction}ed twice in sub-batch {tr.sub_batch}", tr.stage))
        book[key] = j
        # the data exists from the forward on and is read again by B_i (a checkpoint: by R_i)
        f = pos[(kind, tr.stage, tr.sub_batch)]
        reader = "R" if kind == "Fc" else "B"
        b = pos[(reader, tr.stage, tr.sub_batch)]
        if tr.direction == "offload":
            if tr.issue_op < f:
                out.append(Violation(f"offload of stage {tr.stage} is issued before {kind}{tr.stage} produces its data", tr.stage))
            if tr.issue_op > b or (tr.issue_op == b and tr.issue_at == "end"):
                out.append(Violation(f"offload of stage {tr.stage} is issued after {reader}{tr.stage} consumed the data", tr.stage))
        else:
            if tr.issue_op >= b:
                out.append(Violation(f"prefetch of stage {tr.stage} is issued no earlier than {reader}{tr.stage}, which needs it", tr.stage))
    for key, j in offloads.items():
        q = prefetches.get(key)
        if q is None:
            out.append(Violation(f"stage {key[0]} is offloaded but never prefetched", key[0]))
        elif q < j:
            out.append(Violation(f"stage {key[0]} is prefetched before it is offloaded", key[0]))
        elif _amount(schedule.transfers[q], passes, forward_kind) != _amount(schedule.transfers[j], passes, forward_kind):
            out.append(Violation(f"stage {key[0]} is offloaded and prefetched in different amounts", key[0]))
    for key in prefetches.keys() - offloads.keys():
        out.append(Violation(f"stage {key[0]} is prefetched but was never offloaded", key[0]))
    return out


def check_run(schedule: Schedule, profile: Profile, run: Run, budget: float,
              duplex: bool | None = None) -> list[Violation]:
    """Check a run's timeline and memory trace against the schedule, the profile and the budget
    (copy engines ``duplex``, default: the schedule's)."""
    duplex = duplex_of(schedule, duplex)
    out: list[Violation] = []
    passes = _passes(profile, schedule)
    compute = [e for e in run.timeline if e.stream == "compute"]
    if len(compute) != len(schedule.ops):
        return [Violation(f"the timeline has {len(compute)} compute operations, the schedule {len(schedule.ops)}")]
    start = {(op.kind, op.stage, op.sub_batch): ev.start for op, ev in zip(schedule.ops, compute)}
    end = {(op.kind, op.stage, op.sub_batch): ev.end for op, ev in zip(schedule.ops, compute)}
    prev_end = 0.0
    for op, ev in zip(schedule.ops, compute):
        a = passes[op.sub_batch].stages[op.stage].algorithm(schedule.algorithm_of(op.stage))
        dur = a.bwd_time if op.kind == "B" else a.fwd_time  # forwards, saving or not, and recomputations
        if ev.start < prev_end - _EPS:
            out.append(Violation(f"{op.label} starts before the previous operation ends", op.stage, ev.start))
        if not math.isclose(ev.end - ev.start, dur, rel_tol=1e-9, abs_tol=_spacing(ev.end)):
            out.append(Violation(f"{op.label} lasts {ev.end - ev.start:.6g}s, the profile says {dur:.6g}s", op.stage, ev.start))
        prev_end = ev.end

    copies = [e for e in run.timeline if e.stream != "compute"]
    started = [j for j, tr in enumerate(schedule.transfers)]
    if len(copies) != len(started):
        out.append(Violation(f"{len(started) - len(copies)} transfers never ran"))
        return out
    by_engine: dict[str, list[tuple[float, float]]] = {}
    done: dict[tuple[str, int, int], float] = {}
    forward_kind = {(op.stage, op.sub_batch): op.kind for op in schedule.ops if op.kind in ("F", "Fc", "Fn")}
    for tr, ev in zip(schedule.transfers, copies):
        key = (tr.stage, tr.sub_batch)
        kind = forward_kind[key]
        size = _amount(tr, passes, forward_kind)
        bw = profile.h2d_bandwidth if tr.direction == "prefetch" else profile.d2h_bandwidth
        if not math.isclose(ev.end - ev.start, size / bw, rel_tol=1e-9, abs_tol=_spacing(ev.end)):
            out.append(Violation(f"{ev.label} lasts {ev.end - ev.start:.6g}s for {size} bytes", tr.stage, ev.start))
        issued_at = (start if tr.issue_at == "start" else end)[_key_of(schedule.ops[tr.issue_op])]
        if ev.start < issued_at - _EPS:
            out.append(Violation(f"{ev.label} starts before it is issued", tr.stage, ev.start))
        if tr.direction == "offload":
            if ev.start < start[(kind, *key)] - _EPS:
                out.append(Violation(f"{ev.label} starts before {kind}{tr.stage} produced the data", tr.stage, ev.start))
            done[("offload", *key)] = ev.end
        else:
            off = done.get(("offload", *key))
            if off is None or ev.start < off - _EPS:
                out.append(Violation(f"{ev.label} starts before the data reached the host", tr.stage, ev.start))
            if start[("B", *key)] < ev.end - _EPS:
                out.append(Violation(f"B{tr.stage} starts before its saved data is back", tr.stage, start[("B", *key)]))
            if kind == "Fc" and start[("R", *key)] < ev.end - _EPS:
                out.append(Violation(f"R{tr.stage} starts before its checkpoint is back", tr.stage, start[("R", *key)]))
        if tr.wait_op is not None:
            waiter = _key_of(schedule.ops[tr.wait_op])
            if start[waiter] < ev.end - _EPS:
                out.append(Violation(f"{schedule.ops[tr.wait_op].label} starts before {ev.label} completes", tr.stage, start[waiter]))
        engine = ("h2d" if tr.direction == "prefetch" else "d2h") if duplex else "copy"
        by_engine.setdefault(engine, []).append((ev.start, ev.end))
    for engine, spans in by_engine.items():
        spans.sort()
        for (s0, e0), (s1, _) in zip(spans, spans[1:]):
            if s1 < e0 - _EPS:
                out.append(Violation(f"two copies overlap on the {engine} engine", None, s1))

    low, high = trace_peaks(run.trace, budget, out)
    if not low <= run.peak_bytes <= high:
        out.append(Violation(f"the memory trace peaks at {low}..{high} bytes, the run reports {run.peak_bytes}"))
    out += check_needs(schedule, passes, run, compute)
    return out


def check_needs(schedule: Schedule, passes: list[Profile], run: Run, compute: list) -> list[Violation]:
    """Each operation had at least what it needs on the device while it ran (this module's own rule).

    Written out here again on purpose, from papers/004 section 3.1 (eq. (1) for a forward,
    eq. (6)'s terms for a backward): any forward or recomputation of stage i reads x_i and
    holds its output x_{i+1}, its workspace and what it saves beyond x_i; B_i holds the
    saved data of stage i, the part of x_{i+1} it needs, y_{i+1} (the last stage: the
    output and its gradient), y_i and its workspace; the weights are always there. The
    trace's blocks alive over the whole operation must add up to that (a memory model
    that forgot something would come out below).
    """
    out: list[Violation] = []
    alloc = np.array([b.alloc for b in run.trace])
    free = np.array([b.free for b in run.trace])
    size = np.array([b.size for b in run.trace], dtype=np.int64)
    for op, ev in zip(schedule.ops, compute):
        p = passes[op.sub_batch]
        n, s = p.n_stages, p.stages[op.stage]
        a = s.algorithm(schedule.algorithm_of(op.stage))
        last = op.stage == n - 1
        if op.kind == "B":
            grad_in = 2 * p.output_bytes if last else p.stages[op.stage + 1].grad_bytes
            need = s.saved_bytes + s.output_saved_bytes + grad_in + s.grad_bytes + a.bwd_workspace
        else:
            output = p.output_bytes if last else p.stages[op.stage + 1].input_bytes
            need = max(s.input_bytes, s.saved_bytes) + output + a.fwd_workspace
        need += p.weight_bytes
        held = int(size[(alloc <= ev.start + _EPS) & (free >= ev.end - _EPS)].sum()) if len(size) else 0
        if held < need:
            out.append(Violation(f"{op.label} runs with {held} bytes on the device, less than the {need} it needs",
                                 op.stage, ev.start))
    return out


def trace_peaks(trace, budget: float, out: list[Violation]) -> tuple[int, int]:
    """Sweep the memory trace; append a violation where it exceeds ``budget``.

    Within one instant the trace does not say whether a free came before an allocation,
    so two sweeps bracket the peak: frees first (the lower envelope, which must fit the
    budget; a block that lives zero time counts as a spike on its own) and allocations
    first (the upper envelope).
    """
    frees_first: list[tuple[float, int, int]] = []
    allocs_first: list[tuple[float, int, int]] = []
    for block in trace:
        if block.free > block.alloc:
            frees_first += [(block.alloc, 2, block.size), (block.free, 0, -block.size)]
        else:
            frees_first.append((block.alloc, 1, block.size))  # spike
        allocs_first += [(block.alloc, 0, block.size), (block.free, 1, -block.size)]
    frees_first.sort()
    allocs_first.sort()
    live = low = 0
    for t, order, delta in frees_first:
        if order == 1:  # a zero-length block: a spike on top of what is live, gone at once
            level = live + delta
        else:
            live += delta
            level = live
        low = max(low, level)
        if level > budget:
            out.append(Violation(f"memory reaches {level} bytes, above the budget of {int(budget)}", None, t))
            break
    live = high = 0
    for _, _, delta in allocs_first:
        live += delta
        high = max(high, live)
    return low, high


def _movable(stage: int, sub_batch: int, kind: str, passes) -> int:
    """What a transfer of a stage may move, by its forward's kind: the saved data of an ``F``
    stage (saved_i), the checkpoint of an ``Fc`` stage (its whole input x_i), nothing after ``Fn``."""
    s = passes[sub_batch].stages[stage]
    return {"F": s.saved_bytes, "Fc": s.input_bytes}.get(kind, 0)


def _amount(tr, passes, forward_kind) -> int:
    """The bytes a transfer moves (None: all its stage may move in its pass, ``_movable``)."""
    if tr.nbytes is not None:
        return tr.nbytes
    return _movable(tr.stage, tr.sub_batch, forward_kind[(tr.stage, tr.sub_batch)], passes)


def _key_of(op) -> tuple[str, int, int]:
    return (op.kind, op.stage, op.sub_batch)
