"""Run a suite: expand it into cases, run each one isolated, append its row at once.

For every case: profile (once per model, batch, input size; cached in memory and in the
run folder) -> ``planner.plan(profile, budget, **options)`` -> ``executor.run(schedule,
profile, workload)`` -> for each allocator ``allocator.place(run.trace, **options)`` -> one row.
The cases that share everything but the allocator (a *unit*) are planned and run once.

A case that fails is a row (status ``infeasible``, ``oom`` or ``error`` with a message),
never a lost suite. An interrupt is never a row: Ctrl-C, even when it reaches Python as
the ``SystemError`` of a Numba kernel, stops the run (``interrupted``). Rows are appended
to ``rows.csv`` the moment their unit finishes, so an interrupted run resumes with
``resume=True``: finished case ids are skipped and no case runs twice; an ``error`` row
that records an interrupt (written before interrupts were recognised) is removed and its
case runs again.

Backends: ``local`` runs units in this process (``jobs=1``) or in a process pool
(``harness.workers``: a worker that dies, or a unit past the case time limit
``case_timeout_s``, costs that unit's rows only); ``ray`` runs each unit as a Ray task
(one GPU per task whose executor needs one; under a case time limit the task runs its unit
in a worker process of its own, which the same clock stops). In this process, the cases that
differ only by their executor plan once (``harness.case.SharedPlans``). Planning
time excludes Numba compilation: every process plans once on a tiny chain before it
times a planner (docs/architecture.md, "Planning kernels").
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator

import pandas as pd

from harness.allocators.validate import placement_refusal
from harness.case import SharedPlans, classify, copy_layout, run_case
from harness.device_memory import arena_fits
from harness.errors import MembudgetError, MissingDependency
from harness.jit_time import stopwatch
from harness.model import Profile, load, save
from harness.protocols import Workload
from harness.results import (
    FORMAT_VERSION, ROWS_CSV, TIMELINES, RowWriter, check_statuses, drop_malformed_rows, drop_rows, file_stem,
    finished_case_ids, is_interrupt_row, load_rows, profile_file, read_meta, read_rows_csv, runs_of_suite, write_meta,
    write_parquet,
)
from harness.same_schedule import EarlierRuns
from harness.suite import Case, Suite, iter_units
from harness.workers import WORKER_DIED, Split, run_in_workers

BACKENDS = ("local", "ray")
RETRIABLE = ("error", "oom", "infeasible")  # the row statuses --retry runs again


def new_run_id() -> str:
    """A run id that sorts by time: ``20240131-142501``."""
    return datetime.now().strftime("%Y%m%d-%H%M%S")


# --------------------------------------------------------------------------- one unit


@dataclass(frozen=True)
class Bounds:
    """What every row of a profile is judged against (docs/architecture.md, "Lower bounds")."""

    min_memory: int
    min_memory_optimal: int
    peak_memory: int
    ideal_time: float


def bounds_of(profile: Profile) -> Bounds:
    """The bounds of ``profile`` (harness.bounds)."""
    from harness.bounds import ideal_time, min_memory, peak_memory

    return Bounds(min_memory(profile), min_memory(profile, memory_optimal=True), peak_memory(profile),
                  ideal_time(profile))


@dataclass
class UnitTask:
    """Everything one unit needs, resolved in the parent so that a worker needs no registry."""

    cases: list[Case]
    profile: Profile | None
    bounds: Bounds | None
    profile_error: tuple[str, str] | None
    planner: Any
    executor: Any
    allocators: dict[str, Any]
    want_timeline: bool
    validate: bool
    run_id: str
    device_budget: bool = False  # the suite's budget_model is "device" (harness.device_memory)
    earlier: EarlierRuns | None = None  # the suite's same_schedule is "reuse" (harness.same_schedule)
    plans: SharedPlans | None = None  # the run's, when its units run one after another in this process


@dataclass
class UnitResult:
    """The rows of a unit and, when asked for, its timeline."""

    rows: list[dict[str, Any]]
    timeline: dict[str, Any] | None = None


def base_row(case: Case, run_id: str, bounds: Bounds | None) -> dict[str, Any]:
    """The identity columns of a case's row (and its bounds when the profile exists)."""
    import json

    row: dict[str, Any] = {
        "suite": case.suite, "case_id": case.case_id, "model": case.model, "batch_size": case.batch_size,
        "input_size": case.input_label, "device": case.device, "profiler": case.profiler,
        "planner": case.planner, "planner_label": case.planner_label, "executor": case.executor,
        "allocator": case.allocator, "budget_label": case.budget.label, "repeat": case.repeat,
        "seed": case.seed, "dtype": case.dtype, "run_id": run_id,
        "planner_options": json.dumps(case.planner_options, sort_keys=True) if case.planner_options else "",
    }
    if case.budget.kind == "bytes":
        row["budget_bytes"] = int(case.budget.value)
    if bounds is not None:
        budget = case.budget.resolve(bounds.min_memory, bounds.peak_memory)
        span = bounds.peak_memory - bounds.min_memory
        row.update(
            budget_bytes=budget, min_memory_bytes=bounds.min_memory, peak_memory_bytes=bounds.peak_memory,
            ideal_s=bounds.ideal_time,
            budget_fraction=case.budget.value if case.budget.kind == "fraction"
            else ((budget - bounds.min_memory) / span if span > 0 else float("nan")),
        )
    return row


def execute_unit(task: UnitTask) -> UnitResult:
    """Plan, run and place one unit; every failure becomes the rows' status and message."""
    now = lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")  # noqa: E731
    rows = [base_row(c, task.run_id, task.bounds) for c in task.cases]
    if task.profile is None or task.bounds is None:
        status, message = task.profile_error or ("error", "no profile")
        for row in rows:
            row.update(status=status, message=message, finished_at=now())
        return UnitResult(rows)
    case, profile, bounds = task.cases[0], task.profile, task.bounds
    budget = case.budget.resolve(bounds.min_memory, bounds.peak_memory)
    if case.profiler == "file":  # the case's model is the file's path: an executor runs the model the profile names
        workload = Workload.of(profile, case.device)
    else:
        workload = Workload(case.model, case.batch_size, case.input_size, case.device, case.dtype)
    earlier = None
    if task.earlier is not None and not any(c.allocator for c in task.cases):  # a placement needs a run's trace
        earlier = functools.partial(task.earlier.taken_by, rows[0], want_timeline=task.want_timeline)
    outcome = run_case(task.planner, profile, budget, task.executor, workload, options=case.planner_options,
                       device_budget=task.device_budget, validate=task.validate, seed=case.seed, earlier=earlier,
                       plans=task.plans, repeat=case.repeat)
    common, run = outcome.fields, outcome.run
    if common["status"] != "ok" and budget < bounds.min_memory_optimal and "needs at least" not in common["message"]:
        common["message"] += (f" (the budget {budget} bytes is below the minimum: any schedule without "
                              f"sub-batching needs at least {bounds.min_memory_optimal} bytes)")
    timeline = None
    if run is not None and run.feasible:
        if task.want_timeline and run.timeline:
            timeline = {
                "case_id": case.unit_id, "planner": case.planner_label, "model": case.model,
                "budget_bytes": budget, "makespan_s": run.makespan,
                "events": [[e.label, e.stream, e.start, e.end] for e in run.timeline],
            }
            common["timeline"] = f"{TIMELINES}/{file_stem(case.unit_id)}.json"
    for row, c in zip(rows, task.cases):
        row.update(common)
        if c.allocator and run is not None and common["status"] == "ok" and run.trace:
            try:
                allocator = task.allocators[c.allocator]
                with stopwatch() as watch:  # Numba's compilation is not the allocator's time
                    placement = allocator.place(run.trace, **c.allocator_options)
                place_time = watch.seconds
                refusal = placement_refusal(run.trace, placement)
                if refusal:
                    row.update(status="error", message=f"allocator {c.allocator}: {refusal}")
                else:
                    capped = getattr(allocator, "serves_under_cap", None)
                    fits = arena_fits(placement.arena_bytes, budget, profile.runtime_bytes, task.device_budget,
                                      None if capped is None else (lambda cap: capped(run.trace, cap)))
                    row.update(place_time_s=place_time, arena_bytes=placement.arena_bytes,
                               max_live_bytes=placement.max_live_bytes, fragmentation=placement.fragmentation,
                               arena_fits_budget=fits,
                               placement_optimal=placement.optimal,
                               placement_lower_bound_bytes=placement.lower_bound_bytes)
            except BaseException as exc:  # an allocator's sys.exit too (classify re-raises Ctrl-C)
                status, message = classify(exc, "the allocator")
                row.update(status=status, message=f"allocator {c.allocator}: {message}")
        row["finished_at"] = now()
    return UnitResult(rows, timeline)


# --------------------------------------------------------------------------- the run


@dataclass
class RunOutcome:
    """What ``run_suite`` did: the run folder, all its rows, and how many cases ran now."""

    run_dir: Path
    rows: pd.DataFrame
    ran: int
    skipped: int
    notes: list[str] = field(default_factory=list)


class ProfileCache:
    """One profile per (model, batch, input size, dtype), kept in memory and in the run folder."""

    def __init__(self, suite: Suite, folder: Path):
        self.suite, self.folder = suite, folder
        self._done: dict[tuple, tuple[Profile | None, Bounds | None, tuple[str, str] | None]] = {}

    def get(self, case: Case) -> tuple[Profile | None, Bounds | None, tuple[str, str] | None]:
        """(profile, bounds, None), or (None, None, (status, message)) when profiling failed."""
        key = case.profile_key
        if key not in self._done:
            self._done[key] = self._make(case)
        return self._done[key]

    def _make(self, case: Case):
        from harness.plugins import registry

        path = self.folder / profile_file(case.model, case.batch_size, case.input_label, case.dtype)
        try:
            if path.exists():
                profile = load(Profile, path)
            else:
                workload = Workload(case.model, case.batch_size, case.input_size, case.device, case.dtype)
                profile = registry().profiler(case.profiler).profile(workload)
                self.folder.mkdir(parents=True, exist_ok=True)
                save(profile, path)
            return profile, bounds_of(profile), None
        except BaseException as exc:  # a profiler's sys.exit too (classify re-raises Ctrl-C)
            status, message = classify(exc, f"profiler {case.profiler!r}")
            return None, None, (status, f"profiling failed: {message}")


RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]*$")


def _check_arguments(run_id: str | None, resume: bool, overwrite: bool, backend: str, jobs: int,
                     case_timeout: float | None, retry: Collection[str]) -> None:
    """Refuse what would misbehave, before anything is written: a run id that is a path, a
    contradiction, no workers, a time limit that is not a positive number of seconds or that the
    backend cannot keep, a backend that is not installed, a retry of no earlier run or of no failure."""
    if run_id is not None and not RUN_ID.match(run_id):
        raise MembudgetError(f"--run-id {run_id!r}: a run id is one plain folder name (letters, digits and "
                             f"._=+-, starting with a letter or digit), e.g. nightly-2024-01-31")
    if resume and overwrite:
        raise MembudgetError("--resume or --overwrite, not both: resume keeps the finished cases, "
                             "overwrite deletes them")
    wrong = [status for status in retry if status not in RETRIABLE]
    if wrong:
        raise MembudgetError(f"--retry {wrong[0]!r}: the statuses a case can be run again for are "
                             f"{', '.join(RETRIABLE)}")
    if retry and not resume:
        raise MembudgetError("--retry runs again the failed cases of an earlier run: add --resume")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise MembudgetError(f"--jobs {jobs!r}: the number of workers is a whole number >= 1")
    if backend not in BACKENDS:
        raise MembudgetError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if case_timeout is not None:
        if isinstance(case_timeout, bool) or not isinstance(case_timeout, (int, float)) or not case_timeout > 0 \
                or case_timeout == float("inf"):
            raise MembudgetError(f"case time limit {case_timeout!r} (case_timeout_s, --case-timeout): a number "
                                 "of seconds > 0")
    if backend == "ray":
        _import_ray()


def _import_ray() -> Any:
    """The ``ray`` module; ``MissingDependency`` says how to install it when it is missing."""
    try:
        import ray
    except ImportError:
        raise MissingDependency("the ray backend needs Ray: pip install 'membudget[ray]'") from None
    return ray


def _resolve_run_dir(suite: Suite, root: Path, run_id: str | None, resume: bool,
                     overwrite: bool) -> tuple[Path, bool, bool]:
    """(the run folder, whether the run resumes it, whether it is to be replaced first)."""
    suite_dir = root / suite.name
    if run_id is not None:
        path = suite_dir / run_id
        if path.exists() and not resume:
            if not overwrite:
                raise MembudgetError(f"{path} exists: resume it (--resume) or replace it (--overwrite)")
            return path, False, True
        return path, resume and path.exists(), False
    if resume:
        runs = runs_of_suite(suite_dir)
        if runs:
            return runs[-1].path, True, False
    path = suite_dir / new_run_id()
    while path.exists():  # two runs in the same second
        path = path.with_name(path.name + "-1")
    return path, False, False


class RunLock:
    """One writer per run folder: an exclusive ``flock`` on a file beside it (``.<run id>.lock``, holding
    the writer's pid, removed afterwards), taken before the folder is replaced or written. Two processes appending to one
    ``rows.csv`` duplicated cases, and an ``--overwrite`` under a running run mixed the two."""

    def __init__(self, run_dir: Path) -> None:
        self.path, self.fd = run_dir.with_name(f".{run_dir.name}.lock"), None
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise MembudgetError(f"{run_dir} is being written by another membudget run (pid {holder}): wait for "
                                 "it to finish, or use another --run-id") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd

    def release(self) -> None:
        """Let another run write the folder: the file goes, and closing it releases the lock."""
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None


def _tasks(suite: Suite, units: list[list[Case]], cache: ProfileCache, run_id: str,
           earlier: EarlierRuns | None, plans: SharedPlans | None) -> Iterator[UnitTask]:
    from harness.plugins import registry

    reg = registry()
    for unit in units:
        profile, bounds, error = cache.get(unit[0])
        case = unit[0]
        yield UnitTask(
            cases=unit, profile=profile, bounds=bounds, profile_error=error,
            planner=reg.planner(case.planner), executor=reg.executor(case.executor),
            allocators={c.allocator: reg.allocator(c.allocator_name) for c in unit if c.allocator},
            want_timeline=suite.wants_timeline(case), validate=suite.spec.validate_schedules, run_id=run_id,
            device_budget=suite.spec.budget_model == "device", earlier=earlier, plans=plans,
        )


def _on_cuda(case: Case) -> bool:
    return str(case.device).startswith("cuda")


def _needs_gpu(task: UnitTask) -> bool:
    return bool(getattr(task.executor, "needs_gpu", False)) or _on_cuda(task.cases[0])


def _run_local(tasks: Iterable[UnitTask], jobs: int, limit: float | None) -> Iterator[UnitResult]:
    if jobs <= 1 and limit is None:
        for task in tasks:
            yield execute_unit(task)
        return
    yield from run_in_workers(tasks, jobs, execute_unit, _failed, limit, BY_CASE)


def _one_case_each(task: UnitTask) -> list[UnitTask]:
    """``task`` as one unit per case (each with its own allocator): a worker that dies placing one
    allocator's trace then costs that allocator's row, not the unit's."""
    return [replace(task, cases=[case], allocators={case.allocator: task.allocators[case.allocator]}
                    if case.allocator else {}) for case in task.cases]


def _joined(results: list[UnitResult]) -> UnitResult:
    """One unit's result from its cases' (``_one_case_each``)."""
    return UnitResult([row for result in results for row in result.rows],
                      next((r.timeline for r in results if r.timeline is not None), None))


BY_CASE = Split(_one_case_each, _joined)


def _failed(task: UnitTask, message: str) -> UnitResult:
    """The ``error`` rows of a unit that did not finish (its worker died or ran out of time), with the
    budget's bound when the profile is at hand (the tables' common column, as any other row has it)."""
    result = execute_unit(replace(task, profile=None, profile_error=("error", message)))
    if task.profile is not None and task.bounds is not None:
        from harness.bounds import lower_bound

        case = task.cases[0]
        budget = case.budget.resolve(task.bounds.min_memory, task.bounds.peak_memory)
        try:
            bound = lower_bound(task.profile, budget, duplex=copy_layout(task.executor, case.planner_options))
        except Exception:  # noqa: BLE001 - the rows say why the unit failed; the bound is a courtesy
            return result
        for row in result.rows:
            row["budget_lower_bound_s"] = bound
    return result


def _execute_unit_on_ray(task: UnitTask, driver: int) -> UnitResult:
    """A Ray task's unit. Ctrl-C stops the run in the driver (process ``driver``), which cancels what is left
    by killing its workers, so a ``KeyboardInterrupt`` inside a task in another process is a plugin's own:
    an ``error`` row naming it (Ray would report it as the task cancelled). A task Ray runs in the driver
    itself (its local mode) leaves Ctrl-C an interrupt."""
    from harness.case import ctrl_c_never_raises_here

    if os.getpid() != driver:
        ctrl_c_never_raises_here()
    return execute_unit(task)


def _execute_unit_limited(task: UnitTask, limit: float) -> UnitResult:
    """A Ray task's unit under the case time limit: run in a worker process of this task's own,
    which ``harness.workers`` kills once the unit has run ``limit`` seconds (its rows are then
    ``error`` rows, as on the local backend). Ray's own cancel would lose the unit's rows."""
    return list(run_in_workers([task], 1, execute_unit, _failed, limit, BY_CASE))[0]


class _RaySession:
    """Ray for one run: started when no cluster runs yet, and then stopped only once the run folder is
    settled (meta.json written, lock released), since a signal during Ray's start or stop meets Ray's
    handlers, not ours. Ray's start-up handler turns SIGTERM into ``SystemExit`` (which is handed to the
    handler it replaced: the command's, which says terminated), and its shutdown leaves SIGTERM's
    default action in place for a second or more (the process dies at once: the handler is put back
    after it)."""

    def __init__(self) -> None:
        self.ray: Any = None
        self.started = False

    def connect(self, jobs: int) -> Any:
        """The ``ray`` module, with a cluster to run on: the caller's, or one started here."""
        ray = self.ray = _import_ray()
        if not ray.is_initialized():
            self.started = True
            with _own_sigterm_handler() as handler:
                try:
                    ray.init(num_cpus=jobs if jobs > 1 else None, include_dashboard=False, log_to_driver=False,
                             logging_level="ERROR")
                except SystemExit as exc:
                    if exc.code == signal.SIGTERM and callable(handler):
                        handler(signal.SIGTERM, None)
                    raise
        return ray

    def close(self) -> None:
        """Stop the cluster started here (its workers and the tasks still on them)."""
        if self.started:
            self.started = False
            with _own_sigterm_handler():
                self.ray.shutdown()


@contextmanager
def _own_sigterm_handler() -> Iterator[Any]:
    """Puts SIGTERM's handler (the one installed on entry, which it yields) back on exit, whatever Ray
    did with it."""
    handler = signal.getsignal(signal.SIGTERM)
    try:
        yield handler
    finally:
        if handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)


def _run_ray(tasks: Iterable[UnitTask], jobs: int, limit: float | None, session: _RaySession) -> Iterator[UnitResult]:
    ray = session.connect(jobs)
    task_of: dict[Any, UnitTask] = {}
    try:
        # a unit whose worker dies runs once more (as the local pool runs it again alone), then fails
        remote = ray.remote(max_retries=1)(_execute_unit_on_ray if limit is None else _execute_unit_limited)
        arguments = (os.getpid(),) if limit is None else (limit,)

        def submit(task: UnitTask) -> Any:
            return remote.options(num_cpus=1, num_gpus=1 if _needs_gpu(task) else 0).remote(task, *arguments)

        for task in tasks:
            try:
                ref = submit(task)
            except Exception as exc:  # it does not serialise (a plugin holding a lock): that case fails
                cause = exc.__cause__ or exc  # Ray's own words quote the whole task, its profile included
                yield _failed(task, f"could not run as a Ray task: {type(cause).__name__}: {cause}")
                continue
            task_of[ref] = task
        pending = list(task_of)
        while pending:  # a wait without a timeout blocks in C++, where Ctrl-C never reaches Python
            done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            if done:
                yield _ray_result(ray, done[0], task_of.pop(done[0]), submit)
    except BaseException:
        # the ones not collected yet, on the caller's cluster; a cluster started here stops with its tasks
        # (a forced cancel of tasks just finishing crashed Ray 2.60's task manager: a native abort, exit 1)
        if not session.started:
            for ref in task_of:
                ray.cancel(ref, force=True)
        raise


def _ray_result(ray: Any, ref: Any, task: UnitTask, submit: Callable[[UnitTask], Any] | None = None) -> UnitResult:
    """The Ray task's result; its unit's ``error`` rows when its worker died (twice, or was killed by
    Ray's memory monitor) or the unit raised in the worker (what ``execute_unit`` does not turn into rows
    itself: the harness's own failure, or a result that does not travel back). A unit of several cases
    whose worker died runs again case by case (``submit``), as the local pool's does. Any other Ray error
    (the cluster failing) stops the run: no case of it could run."""
    while not ray.wait([ref], num_returns=1, timeout=1.0)[0]:  # Ctrl-C reaches Python between waits
        pass
    try:
        return ray.get(ref)
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.OutOfMemoryError):
        parts = _one_case_each(task) if submit is not None else []
        if len(parts) < 2:
            return _failed(task, WORKER_DIED)
        return _joined([_ray_result(ray, submit(part), part) for part in parts])
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None) or exc
        first = (str(cause).splitlines() or [""])[0]
        return _failed(task, f"could not run as a Ray task: {type(cause).__name__}: {first}")


def _as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def run_suite(
    suite: Suite,
    results_root: str | Path = "results",
    *,
    run_id: str | None = None,
    resume: bool = False,
    backend: str = "local",
    jobs: int = 1,
    progress: bool = True,
    overwrite: bool = False,
    case_timeout: float | None = None,
    retry: Collection[str] = (),
    on_rows: Callable[[list[dict[str, Any]]], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> RunOutcome:
    """Run every case of ``suite`` not yet in the run folder; return the folder and all its rows.

    ``resume`` continues the run ``run_id`` (default: the suite's latest) instead of
    starting a new one; ``overwrite`` replaces an existing run folder ``run_id``.
    ``case_timeout`` (seconds; default the suite's ``case_timeout_s``) stops a unit that runs
    longer and makes its rows ``error`` rows (``harness.workers``); with a limit, even
    ``jobs=1`` runs its units in a worker process, since only a process can be stopped.
    ``KeyboardInterrupt`` (or any failure once the run folder exists) stops the run after
    marking it interrupted; every finished case is already on disk. A run id that is not one
    plain folder name, ``resume`` with ``overwrite``, ``jobs < 1`` or the ``ray`` backend
    without Ray is a ``MembudgetError`` before anything is written. ``retry`` (statuses of
    ``RETRIABLE``, with ``resume`` only) runs again this suite's cases whose rows have those
    statuses: their rows are removed first, so each case keeps one row. ``on_note`` hears each
    note known before the cases run (nothing to resume, rows dropped, another suite) when the run
    starts; they are also in the outcome's ``notes``.
    """
    if case_timeout is None:
        case_timeout = suite.spec.case_timeout_s
    _check_arguments(run_id, resume, overwrite, backend, jobs, case_timeout, retry)
    _check_cuda_present(suite)
    root = Path(results_root).absolute()  # a planner may change the working folder (a solver's temporary one)
    run_dir, resuming, replacing = _resolve_run_dir(suite, root, run_id, resume, overwrite)
    lock, ray = RunLock(run_dir), _RaySession()
    try:
        if replacing:
            try:
                shutil.rmtree(run_dir)
            except OSError as exc:  # rmtree names the file inside, relative to the folder
                raise OSError(exc.errno, f"cannot replace it ({exc.strerror})", str(run_dir)) from None
        return _run_in(suite, root, run_dir, resuming, resume, run_id, backend, jobs, case_timeout, progress,
                       retry, on_rows, ray, on_note)
    except KeyboardInterrupt as exc:  # the command's message names what an interrupt leaves behind
        exc.run_dir = run_dir if (run_dir / "meta.json").is_file() else None  # type: ignore[attr-defined]
        raise
    finally:
        lock.release()
        ray.close()  # last: the run folder says complete or interrupted, and is free


def _check_cuda_present(suite: Suite) -> None:
    """A suite on ``device: cuda`` needs a CUDA GPU: refused before a run folder exists, where every case
    would otherwise be an error row."""
    if not str(suite.spec.device).startswith("cuda"):  # every case's device
        return
    from harness.environment import cuda_device

    if cuda_device() is None:
        raise MembudgetError(f"suite {suite.name} runs on a CUDA GPU (device: {suite.spec.device}) and this machine "
                             "has none that torch can use: run it on a GPU machine (docs/gpu.md)")


def _check_same_gpu(cases: list[Case], run_dir: Path, meta: dict[str, Any]) -> None:
    """A run measured on one model of GPU resumes on the same one: its stored profiles (times, link
    rates, runtime bytes) and its rows are that GPU's, and a table mixing two GPUs ranks nothing."""
    earlier = (meta.get("environment") or {}).get("cuda_device")
    if not earlier or not any(_on_cuda(c) for c in cases):
        return
    from harness.environment import cuda_device

    now = cuda_device()
    if now is not None and now != earlier:
        raise MembudgetError(f"{run_dir} was measured on the GPU {earlier!r}, this machine's is {now!r}: resume it "
                             "on that GPU, or start another --run-id")


def _check_one_row_per_case(run_dir: Path) -> None:
    """A run folder to resume has one row per case (publish and compare refuse one that has not): a case
    with two rows, which only an edit by hand makes, is refused, naming them, before anything runs. The
    rows that record an interrupt are not counted: resume drops them."""
    rows_of: dict[str, list[int]] = {}
    rows = read_rows_csv(run_dir / ROWS_CSV)
    check_statuses(run_dir / ROWS_CSV, rows)  # before a case runs, not at the end when the tables are made
    for number, row in enumerate(rows, start=1):  # not lines: a message may span two
        if not is_interrupt_row(row):
            rows_of.setdefault(row["case_id"], []).append(number)
    twice = next(((case, at) for case, at in rows_of.items() if len(at) > 1), None)
    if twice:
        case, at = twice
        numbers = ", ".join(map(str, at[:-1])) + f" and {at[-1]}"
        raise MembudgetError(f"{run_dir / ROWS_CSV}: the case {case!r} has {len(at)} rows (rows {numbers} after "
                             "the header); a run has one row per case: delete all but one and resume again")


def _run_in(suite: Suite, root: Path, run_dir: Path, resuming: bool, resume: bool, run_id: str | None, backend: str,
            jobs: int, case_timeout: float | None, progress: bool, retry: Collection[str],
            on_rows: Callable[[list[dict[str, Any]]], None] | None, ray: _RaySession,
            on_note: Callable[[str], None] | None = None) -> RunOutcome:
    """``run_suite`` once its run folder is chosen and locked."""
    meta = read_meta(run_dir) if resuming else {}  # first: a run of a newer format is refused untouched
    run_dir.mkdir(parents=True, exist_ok=True)
    notes = list(suite.skipped)
    if resume and not resuming and run_dir.name != run_id:
        notes.append(f"nothing to resume under {root / suite.name}: started run {run_dir.name}")
    elif resume and not resuming:
        others = sorted(d.name for d in (root / suite.name).iterdir() if d.is_dir() and d != run_dir
                        and (d / "meta.json").is_file())
        shown = ", ".join(others[-5:]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        known = f" (a misspelt id? the suite's runs are {shown})" if others else ""
        notes.append(f"{run_dir} does not exist yet: started it{known}")
    cases = suite.cases()
    if suite.spec.same_schedule == "reuse" and any(c.allocator for c in cases):
        notes.append("same_schedule: reuse leaves the cases with an allocator alone (a placement needs its own "
                     "run's memory trace): they run their schedules")
    _check_same_gpu(cases, run_dir, meta)  # before a row is dropped or meta.json written
    if resuming:
        torn, tail = drop_malformed_rows(run_dir)
        if torn:
            notes.append(f"{len(torn)} torn row(s) of {run_dir / ROWS_CSV} (line {', '.join(map(str, torn))}: "
                         "fewer or more cells than the header) dropped; their cases run again")
        if tail:
            notes.append(f"the last row of {run_dir / ROWS_CSV} was torn (a write cut short: no newline at its "
                         "end) and dropped; its case runs again")
        _check_one_row_per_case(run_dir)
    ids = {c.case_id for c in cases}
    if resuming:
        again: set[str] = set()

        def stale(row: dict[str, Any]) -> bool:  # interrupts, and with --retry this suite's failed cases
            if is_interrupt_row(row):  # (only this suite's: the GPU suite's parts share a run folder)
                return True
            if row["status"] in retry and row["case_id"] in ids:
                again.add(row["case_id"])
                return True
            return False

        interrupted = drop_rows(run_dir, stale) - again
        if interrupted:
            notes.append(f"{len(interrupted)} case(s) recorded as errors by an interrupt run again")
        if retry:
            notes.append(f"{len(again)} case(s) with status {' or '.join(dict.fromkeys(retry))} run again (--retry)")
    finished = finished_case_ids(run_dir) if resuming else set()
    done = finished & ids
    if len(finished) > len(done):  # e.g. the GPU suite's parts, which share one run folder
        notes.append(f"{len(finished) - len(done)} row(s) of {run_dir} are cases this suite does not have "
                     "(run from another suite file or an earlier version of this one); they are kept")
    todo_units = [[c for c in unit if c.case_id not in done] for unit in iter_units(cases)]
    todo_units = [u for u in todo_units if u]
    n_todo = sum(len(u) for u in todo_units)
    if resuming and not n_todo:
        notes.append(f"every case of the suite has its row in {run_dir} already: nothing to run (--retry STATUS runs "
                     "the cases of a status again)")
    cores = _usable_cores()
    if backend == "local" and jobs > cores and len(todo_units) > cores:
        notes.append(f"--jobs {jobs} is more than the {cores} CPU core{'s' if cores > 1 else ''} this process may use: "
                     "the cases share cores, "
                     "and the times they measure (plan_time_s, a torch executor's iterations) are slower for it")

    from harness.environment import environment
    from harness.plugins import registry

    env = environment()
    session = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "backend": backend,
               "jobs": jobs, "case_timeout_s": case_timeout, "cases_to_run": n_todo, "cases_already_done": len(done),
               "retry": list(dict.fromkeys(retry)), "git": env.get("git", {}),  # the code this session's rows ran
               "plugin_versions": {f"{e['kind']}:{e['name']}": f"{e['plugin']} {e['version']}"
                                   for e in env.get("plugins", [])}}
    if meta and _as_json(meta.get("spec")) != _as_json(suite.raw):  # keep the specs the earlier rows ran
        meta.setdefault("earlier_specs", []).append({"source": meta.get("source"), "spec": meta.get("spec")})
        notes.append(f"the suite differs from the one {run_dir} ran before; meta.json keeps that one under "
                     "earlier_specs")
    meta.update(
        format_version=FORMAT_VERSION, suite=suite.name, run_id=run_dir.name, source=suite.source, spec=suite.raw, status="running",
        cases=len(ids | finished), skipped_plugins=[*suite.skipped, *registry().problems], environment=env,
        device=suite.spec.device, profiler=suite.spec.profiler,
    )
    if str(suite.spec.device).lower().endswith(".json"):  # a card described in a file: the page names the card
        from harness.profilers import devices

        meta["device_name"] = devices.spec(suite.spec.device).name
    meta.setdefault("sessions", []).append(session)
    write_meta(run_dir, meta)

    if on_note is not None:
        for note in notes[len(suite.skipped):]:  # the suite's own notes were read with it
            on_note(note)
    status = "running"
    try:  # from here on, whatever happens, meta.json stops saying "running"
        writer = RowWriter(run_dir / ROWS_CSV)
        cache = ProfileCache(suite, run_dir / "profiles")
        # the runs so far, which later cases of the same schedule take (filled as rows arrive: with --jobs 1 and
        # no time limit a unit is made when the one before it has finished; a worker pool's unit gets those
        # finished when it was sent, a few units ahead; Ray's, those of rows.csv: it sends every unit at once)
        earlier = None
        if suite.spec.same_schedule == "reuse":
            earlier = EarlierRuns()
            earlier.add(read_rows_csv(run_dir / ROWS_CSV, strict=False))
        # the cases that differ only by their executor plan once (harness.case.SharedPlans), where the units
        # run one after another here: a worker's or Ray's copy of the task would share nothing
        plans = SharedPlans() if backend == "local" and jobs <= 1 and case_timeout is None else None
        tasks = _tasks(suite, todo_units, cache, run_dir.name, earlier, plans)
        results = (_run_ray(tasks, jobs, case_timeout, ray) if backend == "ray"
                   else _run_local(tasks, jobs, case_timeout))
        with _progress(progress, n_todo, suite.name) as advance:
            for result in results:
                if result.timeline is not None:
                    _save_timeline(run_dir, result.timeline)
                writer.append(result.rows)
                if earlier is not None:
                    earlier.add(result.rows)
                if on_rows:
                    on_rows(result.rows)
                advance(len(result.rows), result.rows[-1]["case_id"])
        status = "complete"
    finally:
        status = "complete" if status == "complete" else "interrupted"
        # what reached rows.csv: an interrupt between writing rows and counting them cannot skew it
        ran = len(finished_case_ids(run_dir) - finished)
        session.update(finished=datetime.now(timezone.utc).isoformat(timespec="seconds"), cases_run=ran,
                       status=status)
        meta["status"] = status
        write_meta(run_dir, meta)
        if (run_dir / ROWS_CSV).exists():
            try:
                write_parquet(run_dir)
            except OSError:
                if status == "complete":
                    raise
                # else the error that stopped the run (rows.csv's full disk) is the one to report
    return RunOutcome(run_dir, load_rows(run_dir), ran, len(done), notes)


def _usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, where the system says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def _save_timeline(run_dir: Path, timeline: dict[str, Any]) -> None:
    import json

    folder = run_dir / TIMELINES
    folder.mkdir(exist_ok=True)
    (folder / f"{file_stem(timeline['case_id'])}.json").write_text(json.dumps(timeline))


class _progress:
    """A rich progress bar on stderr (a no-op when disabled)."""

    def __init__(self, enabled: bool, total: int, title: str):
        self.enabled, self.total, self.title = enabled, total, title
        self._bar = None

    def __enter__(self) -> Callable[[int, str], None]:
        from rich.console import Console

        console = Console(stderr=True) if self.enabled else None
        if console is None or not console.is_terminal:  # a log file gets no bar (rich left a blank line in it)
            return lambda n, what: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("[bold]{task.fields[title]}"), BarColumn(bar_width=30), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("{task.fields[what]}", markup=False),
                             console=console, transient=True)
        self._bar.__enter__()
        task = self._bar.add_task("run", total=self.total, title=self.title, what="")
        return lambda n, what: self._bar.update(task, advance=n, what=what if len(what) <= 40 else "…" + what[-39:])

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

