"""RECOMPUTE: the fastest checkpointing schedule of a heterogeneous chain under a memory budget.

What it optimises over
----------------------
The schedule vocabulary (``harness.model.Op``, ``harness.memory``) gives each stage of a
pass one forward, ``F`` (saves what B_i needs), ``Fc`` (a checkpoint: keeps only its input)
or ``Fn`` (keeps nothing, and must follow an ``Fc`` or ``Fn``), one backward, and exactly
one recomputation ``R`` before the backward when the forward did not save. A schedule is
thus a left-to-right sequence of *pieces*: a saving stage (``F``), or a segment [a, b)
checkpointed at a (``Fc_a``, ``Fn`` inside) and recomputed once, R_a..R_{b-1} just before
B_{b-1} (``harness.schedules.recompute_ops``): single-level checkpointing by segments,
which also chooses which stages keep everything. The planner is optimal over these
schedules (up to the slot discretisation below). The multi-level (nested) recomputations
of rotor (Beaumont et al., "Optimal checkpointing for heterogeneous chains", a stage
recomputed more than once, or a checkpoint taken during a recomputation) are not
expressible (one ``R`` per stage) and are not searched.

The DP
------
With no transfers, the simulator (``harness.simulate.executor.makespan``) runs the
operations back to back: the iteration time is the ideal compute plus the forward times of
the recomputed stages, ``cost[a, b] = u_F a + ... + u_F (b-1)`` per segment. Memory comes
from ``harness.memory`` (never re-derived here): every operation of a piece holds, above the
weights, the bytes the pieces before it keep (``movable_bytes``: saved_i for ``F``, x_a
for a segment's ``Fc``) plus the piece's own need (``saving_need``, ``segment_needs``), so
the peak of a schedule is the largest ``prefix + need`` over its pieces (``peak_of``, on ``harness.memory.pieces_peak``:
the walk of ``harness.memory.recompute_peak``, tested byte for byte against the simulator).

In slots of (budget - weights) / S bytes, with C[a][m] the least recomputation time of
stages a..L-1 when m slots are free above the prefix (C[L][m] = 0)::

    C[a][m] = min( C[a+1][m - keep_saved_a]                        if saving_a <= m,
                   min_b cost[a, b] + C[b][m - keep_checkpoint_a]   if segment[a, b] <= m )

O(L^2 S) time, O(L S) memory; the answer is C[0][S], the choices backtracked from it.
Ties go to the saving stage, then to the shorter segment.

Discretisation (papers/004 section 5.3.2's idea, made two-sided): rounding every size
*down* gives a relaxation (a schedule that fits in bytes fits in the rounded slots, since
floor(x) + floor(y) <= floor(x + y)), so its optimum is a lower bound on the true optimum;
rounding every size *up* gives plans that always fit. The planner solves the relaxation
first: when its schedule fits in bytes it is optimal (``SegmentPlan.optimal``); otherwise it
solves the rounded-up problem, whose schedule fits and is no slower than the optimum under
a budget L + 1 slots smaller (each piece's prefix and need gain less than a slot per piece). The leanest schedule (exact, in bytes) and torch-checkpoint's
every-k segmentations (``harness.planners.torch_peers.checkpoint_segments``, each checked in
bytes) are also candidates, so the planner is never slower than ``torch-checkpoint`` with
``every=auto`` or ``sqrt``, whatever the slots.

The exact search
----------------
When no candidate is proven optimal, the best is an upper bound U for a search in bytes
(``exact_segments``): ``leanest``'s recursion with, for each a, the Pareto front of (peak above
the prefix, seconds) of stages a.. in place of the least peak. A point (p, t) is dropped when
p passes the budget or t + D[a][room(p)] > U, D the forward relaxation of the prefix 0..a-1
(``prefix_bounds``: keeps in slots rounded down, summing to at most the room p leaves). A quick
pass with each front thinned to ``QUICK_FRONT`` points first finds a schedule near the optimum,
whose time tightens U. If every front stays within ``front_limit`` points the search is complete
and its answer optimal.

Algorithms: the stages run their default algorithm (as ``torch-checkpoint`` does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from harness.errors import InfeasibleBudget, MembudgetError, OptionValueError
from harness.memory import movable_bytes, pieces_peak, saving_need, segment_needs, stage_memory
from harness.model import Profile, Schedule
from harness.options import int_option
from harness.planners.torch_peers import checkpoint_segments
from harness.schedules import ordered_schedule
from harness.units import format_bytes

DEFAULT_SLOTS = 500
DEFAULT_FRONT_LIMIT = 20_000
QUICK_FRONT = 64  # points per front in the quick search that tightens the exact search's upper bound
ENGINES = ("kernel", "reference")

Segments = list[tuple[int, int]]


@dataclass(frozen=True)
class Tables:
    """A chain as the DP sees it: bytes (weights apart) and seconds, default algorithms.

    ``keep_saved[i]``, ``keep_checkpoint[i]``: what F_i, Fc_i keep until the backward pass
    (``movable_bytes``); ``saving[i]``: the peak of a saving stage above the prefix
    (``saving_need``); ``segment[a, b]``: the peak of the segment [a, b) above the prefix
    (``segment_needs``; 0 where b <= a); ``cost[a, b]``: the seconds its recomputation takes.
    """

    keep_saved: np.ndarray
    keep_checkpoint: np.ndarray
    saving: np.ndarray
    segment: np.ndarray
    cost: np.ndarray
    weights: int
    compute_time: float

    @property
    def n_stages(self) -> int:
        """L."""
        return len(self.keep_saved)


def segment_tables(profile: Profile) -> Tables:
    """The DP's tables for ``profile`` (harness.memory's needs; O(L^2))."""
    n = profile.n_stages
    mem = [stage_memory(profile, i) for i in range(n)]
    fwd = np.array([s.fwd_time for s in profile.stages], dtype=np.float64)
    cost = np.zeros((n, n + 1))
    for a in range(n):
        cost[a, a + 1:] = np.cumsum(fwd[a:])
    return Tables(
        keep_saved=np.array([movable_bytes(m, "F") for m in mem], dtype=np.int64),
        keep_checkpoint=np.array([movable_bytes(m, "Fc") for m in mem], dtype=np.int64),
        saving=np.array([saving_need(m) for m in mem], dtype=np.int64),
        segment=segment_needs(mem), cost=cost, weights=int(profile.weight_bytes),
        compute_time=float(profile.compute_time),
    )


def peak_of(tables: Tables, segments: Segments) -> int:
    """The peak device bytes (weights included) of the schedule of ``segments``, in bytes, exactly."""
    return tables.weights + pieces_peak(tables.saving, tables.keep_saved, tables.segment, tables.keep_checkpoint,
                                        segments)


def recompute_time(tables: Tables, segments: Segments) -> float:
    """Seconds the recomputations of ``segments`` add to the ideal compute time."""
    return float(sum(tables.cost[a, b] for a, b in segments))


def leanest(tables: Tables) -> tuple[Segments, int]:
    """The schedule of least peak (exact, in bytes, weights included) and that peak.

    G[a], the least peak of stages a.. above their prefix, is
    min(max(saving_a, keep_saved_a + G[a+1]), min_b max(segment[a, b], keep_checkpoint_a + G[b])).
    """
    n = tables.n_stages
    g = np.zeros(n + 1, dtype=np.int64)
    choice = np.zeros(n, dtype=np.int64)
    for a in range(n - 1, -1, -1):
        best = max(int(tables.saving[a]), int(tables.keep_saved[a]) + int(g[a + 1]))
        seg = np.maximum(tables.segment[a, a + 1:], tables.keep_checkpoint[a] + g[a + 1:])
        j = int(np.argmin(seg))
        if seg[j] < best:
            best, choice[a] = int(seg[j]), a + 1 + j
        g[a] = best
    return _walk(choice, n), tables.weights + int(g[0])


def segments_text(segments: Segments) -> str:
    """The recomputed segments in a few words: their stages, the middle elided past six."""
    words = [f"{a}..{b - 1}" if b - a > 1 else str(a) for a, b in segments]
    if len(words) > 6:
        words = [*words[:3], "...", *words[-2:]]
    if not words:
        return "no recomputed segment"
    return f"{len(segments)} recomputed segment{'s' if len(segments) > 1 else ''}, stages {', '.join(words)}"


def _walk(choice: np.ndarray, n: int, keep=None, checkpoint=None, m: int = 0) -> Segments:
    """The segments a choice table says (0: a saving stage, b: the segment [a, b)); with ``keep`` and
    ``checkpoint``, ``choice`` is (L, S + 1) and the free slots ``m`` move along."""
    segments, a = [], 0
    while a < n:
        b = int(choice[a] if keep is None else choice[a, m])
        if b == 0:
            m -= 0 if keep is None else int(keep[a])
            a += 1
        else:
            segments.append((a, b))
            m -= 0 if checkpoint is None else int(checkpoint[a])
            a = b
    return segments


@dataclass(frozen=True)
class Discretised:
    """The tables in slots of ``slot_bytes`` (sizes rounded ``down`` or up, capped at S + 1)."""

    slots: int
    slot_bytes: float
    down: bool
    keep_saved: np.ndarray
    keep_checkpoint: np.ndarray
    saving: np.ndarray
    segment: np.ndarray  # S + 1 (never fits) where b <= a
    cost: np.ndarray


def discretise(tables: Tables, budget: int, slots: int = DEFAULT_SLOTS, down: bool = False) -> Discretised:
    """Express ``tables`` under ``budget`` in ``slots`` slots of (budget - weights) / slots bytes.

    Exact integer arithmetic: n bytes are n S / M' slots, rounded up (plans fit) or ``down``
    (a relaxation).
    """
    usable = int(budget) - tables.weights
    if usable <= 0 or slots < 1:
        raise ValueError("discretise needs a budget above the weights and at least one slot")
    S = int(slots)

    def rounded(nbytes: np.ndarray) -> np.ndarray:
        # n S passes 64 bits for long segments of large stages: then in Python's integers
        x = nbytes.astype(np.int64 if int(nbytes.max(initial=0)) * S < 2**62 else object) * S
        q = x // usable if down else -((-x) // usable)
        return np.minimum(q, S + 1).astype(np.int64)

    n = tables.n_stages
    segment = rounded(tables.segment)
    segment[np.tril_indices(n, 0, n + 1)] = S + 1
    return Discretised(S, usable / S, down, rounded(tables.keep_saved), rounded(tables.keep_checkpoint),
                       rounded(tables.saving), segment, tables.cost)


def _engine(engine: str):
    """The module of ``engine``'s loops: ``_kernels`` (Numba) or ``reference`` (plain Python), the same ones."""
    if engine == "kernel":
        from membudget_recompute import _kernels as module
    elif engine == "reference":
        from membudget_recompute import reference as module
    else:
        raise ValueError(f"unknown engine {engine!r}; choose one of {ENGINES}")
    return module


def solve(disc: Discretised, engine: str = "kernel") -> tuple[Segments, float] | None:
    """The DP on ``disc``: the best segments and their recomputation seconds; None when nothing fits."""
    value, choice = _engine(engine).dp_table(disc.slots, disc.keep_saved, disc.keep_checkpoint, disc.saving,
                                             disc.segment, disc.cost)
    best = float(value[0, disc.slots])
    if not math.isfinite(best):
        return None
    n = len(disc.keep_saved)
    return _walk(choice, n, disc.keep_saved, disc.keep_checkpoint, disc.slots), best


def prefix_bound(tables: Tables, budget: int, slots: int = DEFAULT_SLOTS, engine: str = "kernel",
                 down: Discretised | None = None) -> np.ndarray:
    """The exact search's bound D[a, k] (``prefix_bounds``) under ``budget`` in ``slots`` slots, fewer where
    the room in slots, (usable - peak) * slots, would pass 64 bits; ``down``: the tables rounded down in
    ``slots``, when the caller has them already."""
    usable = int(budget) - tables.weights
    slots = max(1, min(slots, 2**62 // max(usable, 1)))
    if down is None or down.slots != slots:
        down = discretise(tables, budget, slots, down=True)
    return _engine(engine).prefix_bounds(down.slots, down.keep_saved, down.keep_checkpoint, down.saving,
                                         down.segment, down.cost)


def exact_segments(tables: Tables, budget: int, upper: float, limit: int = DEFAULT_FRONT_LIMIT,
                   engine: str = "kernel", slots: int = DEFAULT_SLOTS, thin: int = 0,
                   bound: np.ndarray | None = None) -> tuple[Segments, float] | None:
    """The fastest segments under ``budget``, exactly in bytes: a search over Pareto fronts.

    ``leanest``'s recursion, keeping for each stage a every (peak above the prefix, seconds) no other
    schedule of stages a.. beats on both, instead of the least peak alone; a point whose peak passes
    the budget is dropped, and so is one whose time, plus the least the stages before a can take in
    the room it leaves (``bound``, default ``prefix_bound`` in ``slots``: a relaxation), passes ``upper``
    (a schedule already found). Returns the
    segments and their recomputation seconds (``upper`` or less), or None when a front would pass
    ``limit`` points (the search gave up, the chain is too irregular) or nothing within ``upper`` fits.
    ``thin`` > 1 keeps only that many points of each front: a quick search for a schedule at most as slow
    as ``upper``, no longer exact (``plan`` runs one first, for the exact search's ``upper``).
    """
    if bound is None:
        bound = prefix_bound(tables, budget, slots, engine)
    _, time, choice, nxt, start, size, complete = _engine(engine).pareto_fronts(
        int(budget) - tables.weights, float(upper), int(limit), bound, tables.keep_saved, tables.keep_checkpoint,
        tables.saving, tables.segment, tables.cost, int(thin))
    if not complete or size[0] == 0:
        return None
    k = int(start[0] + size[0] - 1)  # the front runs by increasing peak, so by decreasing time
    segments, a = [], 0
    while a < tables.n_stages:
        b = int(choice[k])
        if b:
            segments.append((a, b))
        a, k = b or a + 1, int(nxt[k])
    return segments, recompute_time(tables, segments)


@dataclass(frozen=True)
class SegmentPlan:
    """What ``plan`` found: the segments, the predicted iteration time and peak, and how.

    ``optimal``: proven optimal over the vocabulary's schedules (the relaxation's own
    schedule fits, or no recomputation is needed); ``lower_bound``: the relaxation's time,
    below which no schedule of the vocabulary runs; ``source``: which candidate won.
    """

    segments: Segments
    time: float
    peak_bytes: int
    optimal: bool
    lower_bound: float
    source: str


def plan(profile: Profile, budget: int, slots: int = DEFAULT_SLOTS, engine: str = "kernel",
         tables: Tables | None = None, front_limit: int = DEFAULT_FRONT_LIMIT) -> SegmentPlan:
    """The fastest segments under ``budget`` (see the module docstring); ``InfeasibleBudget`` when the
    leanest schedule does not fit (its peak is ``needed_bytes``). ``front_limit`` 0: the slot DP
    and its candidates only, no exact search."""
    if engine not in ENGINES:  # before any answer, so that a misspelt engine never passes unnoticed
        raise OptionValueError(f"recompute: option engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    tables = tables if tables is not None else segment_tables(profile)
    budget = int(budget)
    keep_all = peak_of(tables, [])
    if keep_all <= budget:
        return SegmentPlan([], tables.compute_time, keep_all, True, tables.compute_time, "keep-all")
    lean, lean_peak = leanest(tables)
    if lean_peak > budget:
        raise InfeasibleBudget(
            f"infeasible: recompute needs at least {lean_peak} bytes ({format_bytes(lean_peak)}) for "
            f"{profile.model} at batch {profile.batch_size} with its leanest checkpointing schedule "
            f"({segments_text(lean)}); the budget is {budget} bytes ({format_bytes(budget)})", needed_bytes=lean_peak)
    down = discretise(tables, budget, slots, down=True)
    relaxed = solve(down, engine)
    if relaxed is None:  # cannot happen: the leanest schedule fits, so it fits the relaxation
        raise MembudgetError(f"recompute: the relaxed DP found nothing although {lean} fits; a bug")
    bound = tables.compute_time + relaxed[1]
    if peak_of(tables, relaxed[0]) <= budget:
        return SegmentPlan(relaxed[0], bound, peak_of(tables, relaxed[0]), True, bound, "dp")
    candidates: list[tuple[str, Segments]] = []
    rounded = solve(discretise(tables, budget, slots), engine)
    if rounded is not None:
        candidates.append(("dp (sizes rounded up)", rounded[0]))
    candidates.append(("leanest", lean))
    n = tables.n_stages
    candidates += [(f"torch-checkpoint every {k}", checkpoint_segments(n, k)) for k in range(1, n + 1)]
    best = None
    for source, segments in candidates:
        extra = recompute_time(tables, segments)
        if (best is None or extra < best[0]) and peak_of(tables, segments) <= budget:
            best = (extra, source, segments)
    extra, source, segments = best
    optimal = math.isclose(extra, relaxed[1], rel_tol=1e-12, abs_tol=0.0)
    if not optimal and front_limit > 0:
        prefix = prefix_bound(tables, budget, slots, engine, down)
        quick = exact_segments(tables, budget, extra * (1 + 1e-9), front_limit, engine, thin=QUICK_FRONT, bound=prefix)
        if quick is not None and quick[1] < extra:  # a tighter bound: the exact search prunes more
            segments, extra, source = quick[0], quick[1], "exact search"
        found = exact_segments(tables, budget, extra * (1 + 1e-9), front_limit, engine, bound=prefix)
        if found is not None:  # the search finished: nothing beats what it returns
            if found[1] < extra:
                segments, extra, source = found[0], found[1], "exact search"
            optimal, bound = True, tables.compute_time + extra
    return SegmentPlan(segments, tables.compute_time + extra, peak_of(tables, segments), optimal, bound, source)


def plan_segments(profile: Profile, budget_bytes: int, slots: int = DEFAULT_SLOTS,
                  engine: str = "kernel") -> tuple[Segments, float]:
    """The public entry point: the fastest checkpointed segments of ``profile`` under ``budget_bytes``.

    Returns ``(segments, time)``: the segments [a, b) (b exclusive; every other stage saves,
    ``F``) for ``harness.schedules.recompute_ops`` / ``ordered_schedule(recompute=...)``, and
    the predicted iteration time in seconds (ideal compute plus the recomputed forwards, what
    the simulator gives that schedule with no transfers). Its peak (``peak_of``) is at most
    the budget. Raises ``InfeasibleBudget`` (``needed_bytes``: the leanest schedule's peak)
    when no schedule of segments fits. Default algorithms; one pass (no sub-batches).
    """
    found = plan(profile, budget_bytes, slots, engine)
    return found.segments, found.time


class Recompute:
    """Optimal single-level checkpointing by segments under the budget (DP over memory slots, then an
    exact search in bytes where the DP's answer is not proven optimal).

    Options: ``slots`` (S, default 500), ``front_limit`` (the most points the exact search may
    keep per stage before it gives up, default 20000; 0: no exact search), ``engine``
    (``kernel``: Numba; ``reference``: plain Python, slow, for the tests).
    """

    name = "recompute"
    description = ("Optimal checkpointing by segments (which stages keep, which are recomputed): dynamic programming, "
                   "then an exact search")

    def plan(self, profile: Profile, budget_bytes: int, slots: int = DEFAULT_SLOTS, engine: str = "kernel",
             front_limit: int = DEFAULT_FRONT_LIMIT) -> Schedule:
        """The schedule of ``plan``'s segments, checked in the simulator (its time is the predicted one;
        the harness validates every plan, ``harness.case``); ``InfeasibleBudget`` when none fits."""
        slots = int_option(self.name, "slots", slots, 1)
        front_limit = int_option(self.name, "front_limit", front_limit, 0)
        from harness.simulate.executor import makespan

        if engine == "kernel":
            from membudget_recompute._kernels import warm_up

            warm_up()
        found = plan(profile, budget_bytes, slots, engine, front_limit=front_limit)
        options = {"slots": slots} | ({"front_limit": front_limit} if front_limit != DEFAULT_FRONT_LIMIT else {})
        schedule = ordered_schedule(profile, budget_bytes, (), planner=self.name, recompute=found.segments,
                                    options=options)
        time = makespan(schedule, profile)
        if time is None or not math.isclose(time, found.time, rel_tol=1e-9, abs_tol=1e-15):
            raise MembudgetError(f"recompute: the simulator gives {time} s for the segments {found.segments}, "
                                 f"the DP {found.time} s under {budget_bytes} bytes; the memory model disagrees")
        listed = found.segments if len(found.segments) <= 8 else f"{found.segments[:8]}..."
        note = (f"recompute: {len(found.segments)} segment(s) {listed}, predicted {found.time:.6g} s, "
                f"peak {found.peak_bytes} B, {'optimal' if found.optimal else 'within the slot rounding'} "
                f"(S={slots}, bound {found.lower_bound:.6g} s), from {found.source}")
        return replace(schedule, notes=note)
