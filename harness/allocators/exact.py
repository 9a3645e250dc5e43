"""The exact placement: papers/003's MIP (eq. 1-6) solved with OR-Tools CP-SAT.

The model is eq. (1)-(6) of papers/003 section 3.1: minimise the peak ``u`` (1) with
``x_i + w_i <= u`` (2), the blocks of every pair with overlapping lifetimes (the set E)
apart in address (3)-(4), ``0 <= u <= W`` (5) and ``x_i >= 0`` (6). CP-SAT states (3)-(4)
without the big-M and the binaries ``z_ij``: each block is a rectangle, fixed in time
(``[lower, upper)``) and free in address (``[x_i, x_i + w_i)``), and ``AddNoOverlap2D``
keeps the rectangles apart; two rectangles whose lifetimes do not intersect can never
collide, so this is exactly the constraint set over E. Two redundant constraints help
the search: a cumulative constraint (at every instant the live sizes sum to at most
``u``) and ``u >= max-live``.

All sizes are divided by their greatest common divisor first. This loses nothing: any
placement can be compacted (each block pushed down onto a block below it or onto 0)
without raising its peak, and then every offset is a sum of sizes.

``W`` is the pool size when one is given (then the answer may be "infeasible": no
placement fits), else the arena of a heuristic placement (greedy-by-size or first-fit,
whichever is smaller), which is also given to the solver as a hint. The allocator's
``hint`` option names a registered allocator (``bestfit``, ``minisearch``) whose placement
is offered too; the smaller of the two seeds the search, so a time-limited answer is never
worse than the named allocator's.

OR-Tools is an optional extra (``pip install membudget[exact]``); it is imported only
when a solve starts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any, Callable, Literal, Sequence, Union

import numpy as np

from harness.allocators._common import make_placement
from harness.allocators.trace import IntTrace, as_int_trace, max_live_bytes, to_memory_blocks
from harness.model import MemoryBlock, Placement

__all__ = ["ExactResult", "ExactAllocator", "solve_exact", "ortools_available"]

ExactStatus = Literal["optimal", "feasible", "infeasible", "unknown"]


def ortools_available() -> bool:
    """Whether OR-Tools (the ``exact`` extra) can be imported."""
    try:
        import ortools.sat.python.cp_model  # noqa: F401
    except ImportError:
        return False
    return True


def _cp_model():
    """OR-Tools' CP-SAT module; a one-line ``MissingDependency`` that says how to install it when missing."""
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        from harness.errors import MissingDependency

        raise MissingDependency("the exact allocator needs OR-Tools: pip install 'membudget[exact]'") from None
    return cp_model


@dataclass(frozen=True)
class ExactResult:
    """What CP-SAT found.

    ``status``: ``optimal`` (proved), ``feasible`` (best found in the time limit, with
    ``gap``), ``infeasible`` (proved: nothing fits in ``pool_bytes``) or ``unknown`` (the
    time ran out before anything was settled). ``offsets``/``arena_bytes`` are the best
    placement known (None when there is none); ``lower_bound_bytes`` is the best proved
    bound on the optimum; ``gap`` is ``(arena - bound) / arena``.
    """

    status: ExactStatus
    offsets: tuple[int, ...] | None
    arena_bytes: int | None
    lower_bound_bytes: int
    gap: float
    wall_time_s: float
    pool_bytes: int | None = None
    scale: int = 1
    solver_status: str = ""  # CP-SAT's own word: OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN, MODEL_INVALID

    @property
    def optimal(self) -> bool:
        """Whether the arena is proved minimal."""
        return self.status == "optimal"


def _heuristic(t: IntTrace) -> np.ndarray:
    from harness.allocators.first_fit import PoolAllocator
    from harness.allocators.greedy_by_size import greedy_by_size_offsets

    a = greedy_by_size_offsets(t)
    b = np.asarray(PoolAllocator("first", granularity=1).place(t).offsets, dtype=np.int64)
    end_a = int((a + t.size).max()) if len(t) else 0
    end_b = int((b + t.size).max()) if len(t) else 0
    return a if end_a <= end_b else b


def _compacted(t: IntTrace, off: np.ndarray, active: list[int]) -> np.ndarray:
    """``off`` with every block pushed down onto the blocks below it (or 0), in order of offset: the
    arena does not grow, and each offset becomes a sum of sizes (a multiple of their gcd)."""
    new = np.zeros(len(t), dtype=np.int64)
    placed: list[int] = []
    for i in sorted(active, key=lambda k: int(off[k])):
        new[i] = max((int(new[j]) + int(t.size[j]) for j in placed
                      if t.lower[j] < t.upper[i] and t.lower[i] < t.upper[j]), default=0)
        placed.append(i)
    return new


def solve_exact(
    trace: Union[IntTrace, Sequence[MemoryBlock]],
    *,
    time_limit_s: float = 10.0,
    pool_bytes: int | None = None,
    workers: int = 1,
    seed: int = 0,
    hint: Sequence[int] | None = None,
) -> ExactResult:
    """Solve papers/003 eq. (1)-(6) for ``trace`` with CP-SAT.

    ``pool_bytes`` is ``W`` in eq. (5): with it the question is also whether any
    placement fits at all. ``workers=1`` (the default) with a fixed ``seed`` makes the
    search reproducible, run to run; more workers prove harder instances sooner.
    ``hint``: offsets of a known placement; the smaller of it and the heuristic placement
    (greedy-by-size or first-fit) seeds the search and, without a pool, bounds it.
    """
    cp_model = _cp_model()
    started = time.perf_counter()
    t = as_int_trace(trace)
    n = len(t)
    live = max_live_bytes(t)
    active = [i for i in range(n) if t.size[i] > 0 and t.upper[i] > t.lower[i]]
    if not active:
        status: ExactStatus = "optimal"
        if pool_bytes is not None and pool_bytes < 0:
            status = "infeasible"
        return ExactResult(status, tuple([0] * n), 0, 0, 0.0, time.perf_counter() - started, pool_bytes)

    g = reduce(math.gcd, (int(t.size[i]) for i in active))

    def arena(off: np.ndarray) -> int:
        return int(max(int(off[i]) + int(t.size[i]) for i in active))

    candidates = [_heuristic(t)]
    if hint is not None:  # CP-SAT's hint is in units of g: a placement given is compacted onto them
        candidates.insert(0, _compacted(t, np.asarray(hint, dtype=np.int64), active))
    hint_off = min(candidates, key=arena)  # the answer on a time-out; without a pool its arena bounds u
    hint_arena = arena(hint_off)
    hint_ok = all(int(hint_off[i]) % g == 0 for i in active)
    if pool_bytes is None:
        cap = hint_arena
    else:
        cap = max(0, pool_bytes)
    W = cap // g
    lb = -(-live // g)
    if lb > W:  # max-live alone exceeds the pool
        return ExactResult("infeasible", None, None, live, math.inf, time.perf_counter() - started, pool_bytes, g)

    model = cp_model.CpModel()
    u = model.new_int_var(lb, W, "u")  # (5), with u >= max-live
    xs = {}
    t_intervals, y_intervals, demands = [], [], []
    for i in active:
        w = int(t.size[i]) // g
        x = model.new_int_var(0, W - w, f"x{i}")  # (6)
        model.add(x + w <= u)  # (2)
        xs[i] = x
        t_intervals.append(
            model.new_fixed_size_interval_var(int(t.lower[i]), int(t.upper[i] - t.lower[i]), f"t{i}")
        )
        y_intervals.append(model.new_fixed_size_interval_var(x, w, f"y{i}"))
        demands.append(w)
    model.add_no_overlap_2d(t_intervals, y_intervals)  # (3)-(4) over E
    model.add_cumulative(t_intervals, demands, u)  # redundant
    model.minimize(u)  # (1)
    if hint_ok and hint_arena <= cap:
        for i in active:
            model.add_hint(xs[i], int(hint_off[i]) // g)
        model.add_hint(u, hint_arena // g)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = int(seed)
    solver.parameters.catch_sigint_signal = False  # Ctrl-C must reach the runner (interrupt, resume)

    def result(code: int) -> ExactResult:
        elapsed = time.perf_counter() - started
        said = solver.status_name(code)
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            offsets = [0] * n
            for i in active:
                offsets[i] = int(solver.value(xs[i])) * g
            arena = max(offsets[i] + int(t.size[i]) for i in active)
            bound = max(live, int(math.ceil(solver.best_objective_bound - 1e-9)) * g)
            status = "optimal" if code == cp_model.OPTIMAL else "feasible"
            if status == "optimal":
                bound = arena
            gap = (arena - bound) / arena if arena else 0.0
            return ExactResult(status, tuple(offsets), arena, bound, gap, elapsed, pool_bytes, g, said)
        if code == cp_model.INFEASIBLE:
            return ExactResult("infeasible", None, None, live, math.inf, elapsed, pool_bytes, g, said)
        # nothing found (the time ran out, or CP-SAT refused the model): fall back on the hint when it fits
        if pool_bytes is None or hint_arena <= pool_bytes:
            offsets = tuple(int(x) for x in hint_off)
            gap = (hint_arena - live) / hint_arena if hint_arena else 0.0
            return ExactResult("feasible" if pool_bytes is None else "unknown", offsets, hint_arena, live, gap,
                               elapsed, pool_bytes, g, said)
        return ExactResult("unknown", None, None, live, math.inf, elapsed, pool_bytes, g, said)

    try:
        code = _solve_in_a_thread(solver, model)
    except KeyboardInterrupt as exc:  # the search stopped: what it had goes with the interrupt
        if getattr(exc, "solver_code", None) is not None:
            exc.exact_result = result(exc.solver_code)
        raise
    return result(code)


def _solve_in_a_thread(solver: Any, model: Any) -> int:
    """``solver.solve(model)``, run in a thread so that Ctrl-C and SIGTERM reach this one at once: Python runs
    its signal handlers in the main thread between bytecodes, never inside CP-SAT's C++ (which does not
    hold the GIL while it searches); so the handlers' ``KeyboardInterrupt`` arrives here, stops the search
    (``stop_search``, again until it has returned: a stop asked before the search starts is lost) and goes
    on once ``solve`` has returned, its status code as ``solver_code``. An ``Event`` says when, not
    ``Thread.join``: a join that an interrupt cuts short can take the thread for ended (CPython 3.11)."""
    import threading

    done: dict[str, Any] = {}
    finished = threading.Event()

    def solve() -> None:
        try:
            done["code"] = solver.solve(model)
        except BaseException as exc:  # handed to the main thread
            done["error"] = exc
        finally:
            finished.set()

    worker = threading.Thread(target=solve, name="cp-sat", daemon=True)
    try:
        worker.start()
        while not finished.wait(0.05):
            pass
    except KeyboardInterrupt as exc:
        while worker.is_alive() and not finished.is_set():  # a second interrupt stops the search no sooner
            try:
                solver.stop_search()
                finished.wait(0.05)
            except KeyboardInterrupt:
                pass
        exc.solver_code = done.get("code")
        raise
    if "error" in done:
        raise done["error"]
    return done["code"]


class ExactAllocator:
    """``exact``: the optimum of papers/003 eq. (1)-(6) by CP-SAT, or the best found within the time limit.

    ``Placement.optimal`` says whether optimality was proved; ``notes`` give the proved
    lower bound and the gap otherwise.
    """

    name = "exact"
    description = "optimal placement by OR-Tools CP-SAT (papers/003 MIP, no-overlap-2D), best found on time out"

    def __init__(self, time_limit_s: float = 10.0, workers: int = 1, seed: int = 0,
                 find_allocator: Callable[[str], Any] | None = None) -> None:
        """``find_allocator``: the allocator registered under a name, for the ``hint`` option (the
        built-ins pass the registry's lookup: an allocator sits below the registry and imports none)."""
        self.time_limit_s = time_limit_s
        self.workers = workers
        self.seed = seed
        self.find_allocator = find_allocator

    def solve(self, trace: Union[IntTrace, Sequence[MemoryBlock]], pool_bytes: int | None = None) -> ExactResult:
        """The full :class:`ExactResult` (status, bound, gap) for ``trace``."""
        return solve_exact(
            trace, time_limit_s=self.time_limit_s, pool_bytes=pool_bytes, workers=self.workers, seed=self.seed
        )

    def place(self, trace: Sequence[MemoryBlock], *, time_limit: float | None | str = "default",
              hint: str | None = None) -> Placement:
        """Place ``trace`` optimally if CP-SAT proves it within the time limit, else as well as it found.

        ``time_limit`` (seconds) overrides ``time_limit_s`` for this call (``membudget place
        --option time_limit=5``); None (``time_limit=null``) sets none, as for ``minisearch``. ``hint`` names a registered allocator whose placement seeds
        the search (``--option hint=bestfit``). The placement carries CP-SAT's proved lower bound.
        """
        t = as_int_trace(trace)
        limit = self.time_limit_s if time_limit == "default" else math.inf if time_limit is None else time_limit
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0:
            raise ValueError(f"time_limit must be a number of seconds >= 0 (or null: none), got {limit!r}")
        try:
            hinted = self._hint_placement(hint, t)
        except KeyboardInterrupt as exc:  # the hint's best so far is this call's: say whose it is
            if getattr(exc, "placement", None) is not None:
                exc.placement = replace(exc.placement, allocator=self.name,
                                        notes=f"the hint {hint}'s, interrupted before CP-SAT began: "
                                              f"{exc.placement.notes}")
            raise
        try:
            res = solve_exact(t, time_limit_s=float(limit), workers=self.workers, seed=self.seed,
                              hint=None if hinted is None else hinted.offsets)
        except KeyboardInterrupt as exc:  # membudget place prints the best placement found so far
            if getattr(exc, "exact_result", None) is not None:
                exc.placement = self._placement(t, exc.exact_result, limit, hint, hinted)
            raise
        return self._placement(t, res, limit, hint, hinted)

    def _placement(self, t: IntTrace, res: ExactResult, limit: float, hint: str | None,
                   hinted: Placement | None) -> Placement:
        """The ``Placement`` of a solve, its notes saying what CP-SAT proved, in how long."""
        assert res.offsets is not None  # without a pool there is always a placement
        if res.optimal:
            notes = f"optimal (CP-SAT, {res.wall_time_s:.2f} s)"
        elif res.solver_status == "MODEL_INVALID":
            notes = ("CP-SAT refused the model (MODEL_INVALID: sizes or times too large for its integer "
                     f"arithmetic): the heuristic's placement; lower bound {res.lower_bound_bytes} bytes, "
                     f"gap {100 * res.gap:.2f}%")
        else:
            within = "no time limit" if math.isinf(limit) else f"time limit {limit:g} s"
            notes = (f"best found in {res.wall_time_s:.2f} s ({within}): lower bound "
                     f"{res.lower_bound_bytes} bytes, gap {100 * res.gap:.2f}%")
        if hinted is not None:
            notes += f"; hint: {hint} ({hinted.arena_bytes} bytes)"
        return make_placement(self.name, t, res.offsets, optimal=res.optimal, notes=notes,
                              lower_bound_bytes=res.arena_bytes if res.optimal else res.lower_bound_bytes)

    def _hint_placement(self, hint: str | None, t: IntTrace) -> Placement | None:
        """The placement the allocator named ``hint`` gives ``t`` (None without a hint)."""
        if hint is None:
            return None
        if not isinstance(hint, str) or hint == self.name:
            raise ValueError(f"hint must name another registered allocator, got {hint!r}")
        if self.find_allocator is None:
            raise ValueError("hint: this exact allocator was made without a way to find other allocators "
                             "(ExactAllocator(find_allocator=...)); the registered one has it")
        from harness.errors import UnknownPlugin

        try:
            other = self.find_allocator(hint)
        except UnknownPlugin as exc:
            raise ValueError(f"hint: {exc}") from None
        return other.place(to_memory_blocks(t))  # the protocol's blocks, in the trace's order
