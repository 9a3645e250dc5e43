"""One case, one path: plan a profile for a budget, run the schedule, and compute its row's figures.

The runner (``harness.runner.execute_unit``), the CLI (``membudget plan`` and ``simulate``)
and the allocator test kit (``harness.testing_allocators.suite_traces``) all go through
``plan_case`` and ``run_case``, so the budget's meaning, the bounds, the ratios, the
throughput and the memory parts of a row are computed in one place.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import random
import sys
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from harness.errors import InfeasibleBudget, InvalidSchedule, OptionValueError, raised_at
from harness.jit_time import stopwatch
from harness.model import Profile, Run, Schedule, Stage
from harness.options import planner_options
from harness.schedules import checked_plan


# Whether Ctrl-C can raise KeyboardInterrupt in this process: not in a pool worker, whose SIGINT handler does
# nothing (harness.workers), so that a KeyboardInterrupt there is a plugin's own exception and fails its case
_ctrl_c_raises = True


def ctrl_c_never_raises_here() -> None:
    """Say that SIGINT raises nothing in this process (a pool worker): a ``KeyboardInterrupt`` is then no
    interrupt (``is_interrupt``) but a plugin's failure, an ``error`` row."""
    global _ctrl_c_raises
    _ctrl_c_raises = False


def is_interrupt(exc: BaseException) -> bool:
    """True when ``exc`` is, or was caused by, a ``KeyboardInterrupt`` (anywhere in its chain), in a process
    where Ctrl-C raises one.

    Ctrl-C inside a compiled (Numba) function reaches Python as ``SystemError: ...
    returned a result with an exception set`` whose ``__context__`` is the interrupt.
    """
    if not _ctrl_c_raises:
        return False
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        todo += [current.__cause__, current.__context__]
    return False


def classify(exc: BaseException, who: str = "the plugin") -> tuple[str, str]:
    """(status, message) of a failed case; an interrupt is re-raised as ``KeyboardInterrupt``, never a result.
    ``who`` names what raised ``exc`` (``planner 'greedy'``) where the message names it."""
    if isinstance(exc, KeyboardInterrupt) and is_interrupt(exc):
        raise exc  # itself: the command line tells SIGTERM's (``Terminated``) from Ctrl-C's
    if is_interrupt(exc):
        raise KeyboardInterrupt from exc
    if isinstance(exc, InfeasibleBudget):
        return "infeasible", str(exc)
    if isinstance(exc, InvalidSchedule):  # the validator's words, as for a schedule that ran
        return "error", str(exc)
    if isinstance(exc, SystemExit):
        return "error", f"SystemExit: the plugin called sys.exit({exc.code!r})" + raised_at(exc)
    if not isinstance(exc, (Exception, GeneratorExit)):  # asyncio.CancelledError, a worker's KeyboardInterrupt
        said = f": {exc}" if str(exc).strip() else ""
        where = " in a worker process, which Ctrl-C does not reach" if isinstance(exc, KeyboardInterrupt) else ""
        return "error", f"{who} raised {type(exc).__name__}{where}{said}".strip() + raised_at(exc)
    if "OutOfMemory" in type(exc).__name__:  # the device's (torch.OutOfMemoryError)
        return "oom", f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, MemoryError):  # the host's: an executor says its device ran out with its oom status
        return "error", f"the host ran out of memory in {who}: {type(exc).__name__}: {exc}".strip() + raised_at(exc)
    return "error", f"{type(exc).__name__}: {exc}".strip() + raised_at(exc)


_WARMED: set[str] = set()


def tiny_chain() -> Profile:
    """A four-stage toy chain: planning it compiles a planner's kernels (``warm_up``,
    benchmarks/gpu/warm_kernels.py).

    Its first stages' backwards need half of their output (``output_saved_bytes``), as a trailing
    ReLU's do, so that the paths real chains take are compiled too (moDNN's segment shrink; its
    warm-up missed it: tests/test_jit_time.py plans real chains after it)."""
    last = Stage("warm", "conv", 1e-3, 2e-3, 1000, 1000, 1000, 100, 100)
    relu = replace(last, output_saved_bytes=500)
    return Profile("warm-up", 1, (1,), "synthetic", 10**9, 1e6, 1e6, 100, 100, (relu, relu, relu, last),
                   profiler="warm-up")


def warm_up(planner: Any) -> None:
    """Plan a tiny chain at its peak, half-way and minimum budgets, once per planner and process, as a case
    plans (``checked_plan``), so that neither Numba compilation nor the first import of a module the
    planning reaches is timed (docs/architecture.md, "Planning kernels")."""
    key = f"{type(planner).__module__}.{type(planner).__qualname__}:{getattr(planner, 'name', '')}"
    if key in _WARMED:
        return
    _WARMED.add(key)
    from harness.bounds import min_memory, peak_memory

    tiny = tiny_chain()
    lo, hi = min_memory(tiny), peak_memory(tiny)
    for budget in (hi, (lo + hi) // 2, lo):
        try:
            checked_plan(planner, tiny, budget, {})
        except BaseException as exc:  # a planner may refuse a toy chain; warming is best effort
            if is_interrupt(exc):  # but a Ctrl-C inside a kernel still stops the run
                raise KeyboardInterrupt from exc


def option_value_refusal(planner: Any, options: dict[str, Any]) -> str | None:
    """Why ``planner`` refuses the values of ``options`` (``slots: -3``), found before any case runs: the tiny
    chain (at a batch of 1024, so that no option bounded by the batch is blamed) planned half-way with the
    options raises ``OptionValueError`` (``harness.options``' checks raise it) where it plans without them.
    None when it plans, when it fails otherwise (a value a real chain may refuse is the case's to say), or
    when the tiny chain cannot tell (the planner fails on it either way)."""
    from harness.bounds import min_memory, peak_memory

    tiny = replace(tiny_chain(), batch_size=1024)
    budget = (min_memory(tiny) + peak_memory(tiny)) // 2
    refused = refused_for_its_options(lambda **opts: planner.plan(tiny, budget, **opts), options, OptionValueError)
    return None if refused is None else str(refused)


def refused_for_its_options(call: Any, options: dict[str, Any], refusal: type[BaseException]) -> BaseException | None:
    """The ``refusal`` that ``call(**options)`` raises where ``call()`` raises none (None otherwise): a plugin
    refusing its options' values, told apart from one that fails on the toy input either way. Any other
    failure is the case's to report; an interrupt is re-raised."""
    def raised(opts: dict[str, Any]) -> BaseException | None:
        try:
            call(**opts)
        except refusal as exc:
            return exc
        except BaseException as exc:
            if is_interrupt(exc):
                raise KeyboardInterrupt from exc
        return None

    refused = raised(options)
    return refused if refused is not None and raised({}) is None else None


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and (when loaded) torch before planning."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def copy_layout(executor: Any = None, options: dict[str, Any] | None = None) -> bool:
    """The copy-engine layout a case plans and runs for: True for one engine per direction.

    The executor's (its ``duplex``) when it names one, else the planner's ``duplex`` option,
    else one engine shared by both directions (papers/004's assumption B). ``plan_case``
    records it on the schedule (``Schedule.duplex``), where the bounds, the validator and
    the executors read it: the plan and the run see the same value.
    """
    layout = getattr(executor, "duplex", None)
    if layout is None:
        layout = (options or {}).get("duplex", False)
    return bool(layout)


@dataclass(frozen=True)
class Planned:
    """A schedule and how it was planned: the chain budget the planner got and how long it took."""

    schedule: Schedule
    planning_budget: int
    plan_time_s: float
    fields: dict[str, Any] = field(default_factory=dict)


def plan_case(planner: Any, profile: Profile, budget: int, options: dict[str, Any] | None = None, *,
              device_budget: bool = False, duplex: bool | None = None, seed: int = 0) -> Planned:
    """Plan ``profile`` for ``budget``: directly (the chain model's bytes), or, with
    ``device_budget``, for what is left of a device budget (``harness.device_memory``).
    Numba compilation is not timed; ``InfeasibleBudget`` goes through.

    ``duplex`` is the copy-engine layout (None: ``copy_layout`` of the options); a planner
    that takes a ``duplex`` option plans for it, and the schedule records it (``Schedule.duplex``).
    """
    options = options or {}
    duplex = copy_layout(None, options) if duplex is None else bool(duplex)
    if duplex != bool(options.get("duplex", False)) and "duplex" in (planner_options(planner) or ()):
        options = {**options, "duplex": duplex}
    warm_up(planner)
    seed_everything(seed)
    fields: dict[str, Any] = {}
    if device_budget:
        from harness.device_memory import plan_for_device  # imported before the clock starts
    with stopwatch() as watch:  # a kernel the toy chain did not compile is still not timed
        if device_budget:
            planned = plan_for_device(planner, profile, budget, options, duplex)
            schedule, planning = planned.schedule, planned.planning_budget  # it carries the device budget
            fields["planning_budget_bytes"] = planning
            if planned.memory is not None:  # the prediction; a run with a memory trace replaces it
                fields.update(_memory_fields(planned.memory))
        else:
            schedule, planning = checked_plan(planner, profile, budget, options), budget
    schedule = replace(schedule, duplex=duplex)  # the device budget's plan was checked when it was made
    return Planned(schedule, planning, watch.seconds, fields)


class SharedPlans:
    """The plans of one suite run, made once for the cases that differ only by their executor.

    A GPU suite's measured run and its ``simulate`` twin plan the same (planner, profile, budget,
    options, budget model, copy layout, seed, repeat: each repeat plans anew, so that its
    ``plan_time_s`` is measured too): given to ``run_case``, this makes the schedule once
    and hands it to both, so the twin simulates what ran, and the second case does not plan
    again (on the 2026-11-29 H200 smoke run, 22 s of its 46 s of planning, 18 s of it hybrid's
    device-budget search). The second row reports the plan's own ``plan_time_s``. A planner's
    refusal (``InfeasibleBudget``) is kept too; any other failure is not. The runner makes one per
    run when it runs the cases one after another in its own process (``harness.runner``); it
    keeps the last ``size`` plans, since a case's executors come one after the other.
    """

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._kept: OrderedDict[tuple[Any, ...], Planned | InfeasibleBudget] = OrderedDict()

    def plan(self, planner: Any, profile: Profile, budget: int, options: dict[str, Any] | None = None, *,
             device_budget: bool = False, duplex: bool = False, seed: int = 0, repeat: int = 0) -> Planned:
        """``plan_case``'s plan, made now or taken from an earlier case of the same inputs (``repeat``,
        the case's repeat, among them)."""
        key = self._key(planner, profile, budget, options, device_budget, duplex, seed, repeat)
        kept = self._kept.get(key) if key is not None else None
        if kept is not None:
            self._kept.move_to_end(key)
            if isinstance(kept, InfeasibleBudget):
                raise kept
            return kept
        try:
            planned = plan_case(planner, profile, budget, options, device_budget=device_budget, duplex=duplex,
                                seed=seed)
        except InfeasibleBudget as exc:
            self._keep(key, exc)
            raise
        self._keep(key, planned)
        return planned

    @staticmethod
    def _key(planner: Any, profile: Profile, budget: int, options: dict[str, Any] | None, device_budget: bool,
             duplex: bool, seed: int, repeat: int) -> tuple[Any, ...] | None:
        # the planner by identity (the registered object, alive as long as the run): two planners equal by
        # value may plan otherwise
        key = (id(planner), profile, budget, json.dumps(options or {}, sort_keys=True, default=repr),
               bool(device_budget), bool(duplex), seed, repeat)
        try:
            hash(key)
        except TypeError:  # a profile a plugin made unhashable: planned each time
            return None
        return key

    def _keep(self, key: tuple[Any, ...] | None, what: Planned | InfeasibleBudget) -> None:
        if key is None:
            return
        self._kept[key] = what
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)


def saved_data_fields(schedule: Schedule, profile: Profile) -> dict[str, Any]:
    """The row's "what it does" columns: the saved bytes the schedule keeps, offloads and
    recomputes in one iteration, the recomputations' time (``harness.memory.saved_data``),
    and the weights that stay resident whatever it does."""
    from harness.memory import saved_data
    from harness.simulate.lowering import pass_profiles

    data = saved_data(schedule, pass_profiles(profile, schedule))
    return dict(kept_bytes=data.kept, offloaded_bytes=data.offloaded, recomputed_bytes=data.recomputed,
                recompute_s=data.recompute_s, weight_bytes=profile.weight_bytes)


def _memory_fields(memory: Any) -> dict[str, Any]:
    return dict(max_live_bytes=memory.chain_bytes, runtime_bytes=memory.runtime_bytes,
                fragmentation_bytes=memory.fragmentation_bytes, reserved_predicted_bytes=memory.reserved_bytes)


@dataclass
class CaseOutcome:
    """What one case gave: its row's figures (``fields``: columns of docs/results.md, status and
    message included), and the schedule and run when there were any."""

    fields: dict[str, Any]
    schedule: Schedule | None = None
    run: Run | None = None


def run_case(planner: Any, profile: Profile, budget: int, executor: Any, workload: Any, *,
             options: dict[str, Any] | None = None, device_budget: bool = False, validate: bool = True,
             seed: int = 0, earlier: Callable[[Planned], dict[str, Any] | None] | None = None,
             plans: SharedPlans | None = None, repeat: int = 0) -> CaseOutcome:
    """Plan, run and judge one case; a failure is the outcome's status and message, never an exception
    (but an interrupt, which is re-raised).

    ``earlier``, given the plan, may return the row figures of an earlier run of the same schedule
    (``harness.same_schedule``): the case then takes them and does not run (the outcome has no run).
    ``plans``, the run's ``SharedPlans``: the plan of an earlier case of the same inputs (and
    ``repeat``) is taken."""
    from harness.bounds import lower_bound

    duplex = copy_layout(executor, options)
    # what the profile says whatever the planner does: a refused budget's row has it too
    fields: dict[str, Any] = {"n_stages": profile.n_stages, "weight_bytes": profile.weight_bytes}
    if device_budget:
        fields["runtime_bytes"] = profile.runtime_bytes
    try:
        # the budget's bound (the tables' common column) is the row's even when no plan comes of it
        fields["budget_lower_bound_s"] = lower_bound(profile, budget, duplex=duplex)
        make_plan = plan_case if plans is None else functools.partial(plans.plan, repeat=repeat)
        planned = make_plan(planner, profile, budget, options, device_budget=device_budget, duplex=duplex, seed=seed)
    except BaseException as exc:  # one failing case is a row, never a lost suite (a plugin's sys.exit, the host's
        # memory running out for a planner's tables too)
        fields["status"], fields["message"] = classify(exc, f"planner {getattr(planner, 'name', planner)!r}")
        if isinstance(exc, InvalidSchedule):
            fields["valid"] = False
        if isinstance(exc, InfeasibleBudget):
            fields["needed_bytes"] = exc.needed_bytes
        return CaseOutcome(fields)
    taken = earlier(planned) if earlier is not None else None
    if taken is not None:
        return CaseOutcome({**fields, **taken}, planned.schedule)
    return execute_plan(planned, profile, budget, executor, workload, validate=validate,
                        budget_lb=fields["budget_lower_bound_s"])


def execute_plan(planned: Planned, profile: Profile, budget: int, executor: Any, workload: Any, *,
                 validate: bool = True, budget_lb: float | None = None) -> CaseOutcome:
    """Run a planned schedule and compute its row's figures; a failure is the outcome's status.

    Every metric the executor reports reaches the row: the documented columns by name, the
    others in ``metrics`` (JSON). The bounds are those of the schedule's copy engines
    (``Schedule.duplex``); ``budget_lb``, the budget's bound when the caller has it already.
    """
    from harness.bounds import lower_bound, schedule_lower_bound
    from harness.results import COLUMNS, STATUSES

    schedule = planned.schedule
    duplex = schedule.duplex
    who = f"executor {getattr(executor, 'name', executor)!r}"
    fields: dict[str, Any] = {"n_stages": profile.n_stages, **planned.fields, "plan_time_s": planned.plan_time_s,
                              "sub_batches": schedule.sub_batches, "schedule_fingerprint": schedule.fingerprint(),
                              "offloaded_stages": len(schedule.offloaded_stages)}
    out = CaseOutcome(fields, schedule)
    try:
        fields.update(saved_data_fields(schedule, profile))
        # the budget's bound: the same for every strategy at this budget (the tables' common column)
        if budget_lb is None:
            budget_lb = lower_bound(profile, budget, duplex=duplex)
        fields["budget_lower_bound_s"] = budget_lb
        # judged against the bound of what it runs: its algorithms, passes, recomputation
        lb = fields["lower_bound_s"] = schedule_lower_bound(profile, schedule, planned.planning_budget)
        try:  # set whenever the executor ran, also when it raised: a row without it did not run
            with stopwatch() as watch:
                run = executor.run(schedule, profile, workload)
        finally:
            fields["run_time_s"] = watch.seconds
        implausible = implausible_run(run)
        if implausible:  # its figures would reach the tables as measured: none of them is kept
            fields.update(status="error", message=f"{who} returned {implausible}")
            return out
        out.run = run
        fields.update(peak_bytes=run.peak_bytes, moved_bytes=run.moved_bytes, status=run.status, message=run.message)
        if run.status not in STATUSES:  # the tables count rows by status: another word would be miscounted
            said = f": {run.message}" if run.message else ""
            fields.update(status="error", message=f"{who} returned the status {run.status!r}, none of "
                          f"{', '.join(STATUSES)}{said}")
        fields.update({k: v for k, v in run.metrics.items() if k in COLUMNS and k not in fields})
        extra = {k: v for k, v in run.metrics.items() if k not in COLUMNS}
        if extra:
            fields["metrics"] = extra
        if run.feasible:
            ideal = profile.compute_time
            fields.update(
                makespan_s=run.makespan, idle_s=run.idle_time,
                ratio_to_lb=run.makespan / lb if lb > 0 else math.nan,
                ratio_to_budget_lb=run.makespan / budget_lb if budget_lb > 0 else math.nan,
                slowdown=run.makespan / ideal if ideal > 0 else math.nan,
                throughput=profile.batch_size / run.makespan if run.makespan > 0 else math.nan,
            )
            if run.trace:
                from harness.device_memory import device_memory

                fields.update(_memory_fields(device_memory(run.trace, profile.runtime_bytes,
                                                           schedule.device_budget_bytes)))
        # an infeasible run of a schedule the planner returned (it did not raise InfeasibleBudget) is the
        # planner's error when the validator finds why: over the budget, or out of dependency order
        if validate and (run.feasible or run.status == "infeasible"):
            from harness.validate import validate as check

            problems = check(schedule, profile, planned.planning_budget)
            if run.feasible or problems:  # `valid` is the verdict on a schedule that ran (docs/results.md)
                fields["valid"] = not problems
            if problems:
                fields.update(status="error", message=f"invalid schedule: {problems[0]}"
                              + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    except BaseException as exc:  # one failing case is a row, never a lost suite (classify re-raises Ctrl-C)
        fields["status"], fields["message"] = classify(exc, who)
        out.run = None
    return out


# the byte counts of a Run that reach a row's columns: an executor's metrics may hold differences (the
# torch executor's unmodelled_bytes), which can be below 0
_RUN_BYTES = ("peak_bytes", "moved_bytes")
_METRIC_BYTES = ("max_memory_allocated", "max_memory_reserved", "held_max_bytes")


def implausible_run(run: Run) -> str | None:
    """What in ``run`` no run can have measured, in words (``a makespan of -1.0 s, peak_bytes -100 (...)``),
    or None: an ``ok`` run's makespan that is not a finite number of seconds >= 0, a byte count below 0."""
    counts = [(name, getattr(run, name)) for name in _RUN_BYTES]
    counts += [(name, run.metrics[name]) for name in _METRIC_BYTES if name in run.metrics]
    problems = [f"{name} {value}" for name, value in counts if _is_number(value) and value < 0]
    if run.feasible and not (_is_number(run.makespan) and 0 <= run.makespan < math.inf):
        problems.insert(0, f"a makespan of {run.makespan!r} s")
    if not problems:
        return None
    return (f"{', '.join(problems)} (an ok run's time is a finite number of seconds >= 0, a number of bytes is "
            "never below 0)")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
