"""Units in worker processes: a crash costs its own case, and so does a case past its time limit.

``run_in_workers`` is the ``local`` backend's pool (``harness.runner``): it runs
``execute(task)`` for each task in a pool of ``jobs`` spawned processes and yields the
results as they finish. Two failures become the task's rows (``fail(task, message)``)
instead of ending the run:

- **a worker that dies** (a crash in native code, ``os._exit``, the OS killing it) breaks
  the pool and every unit in it; each of those runs again alone, and the one that dies
  again gets ``WORKER_DIED``, or, when ``split`` divides it (a unit's allocators), each of its
  parts runs alone and only the part that dies gets it;
- **a unit that runs past the case time limit** (``limit`` seconds from the moment its
  worker starts it; the wait in the pool's queue does not count): its worker is killed,
  which frees whatever it held (host and GPU memory), and the unit gets ``timed_out(limit)``.
  The workers report each start through a queue, since the pool itself does not say when a
  unit leaves its queue. The kill breaks the pool; the other units in it run again in a new one.

An interrupt (Ctrl-C, SIGTERM through the runner) shuts the pool down at once: queued
units are cancelled and running workers terminated.

Each worker leads a process group of its own, so that what it starts (a planner's solver, the
planned process) goes with it: a unit past its limit has its worker's group killed, the end of a
pool kills what its workers left running, and a worker whose parent is gone without a word
(``kill -9``) kills its group within ``PARENT_POLL_S``. Left behind, they held the GPU's memory and
the run's stdout (``membudget run | grep`` waited for a planner's ``sleep 600``). A worker's SIGINT
does nothing: Ctrl-C is the main process's (``_start_worker``).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterable, Iterator, NamedTuple

WORKER_DIED = ("the worker process running this case died (a crash in native code, os._exit, or the OS "
               "killing it, e.g. for host memory); the run went on with the other cases")
POLL_S = 1.0  # how often the parent looks for start reports while no started unit has a deadline
PARENT_POLL_S = 0.5  # how often a worker looks whether its parent is still there


def timed_out(limit: float) -> str:
    """The message of a unit stopped by the case time limit ``limit`` (seconds)."""
    return (f"stopped after {limit:g} s: the case time limit (case_timeout_s in the suite, --case-timeout "
            f"on the command line), which counts a new worker's imports and its planners' compilation (seconds: "
            f"the worker that replaces a stopped one starts again); the run went on with the other cases")


def run_in_workers(tasks: Iterable[Any], jobs: int, execute: Callable[[Any], Any], fail: Callable[[Any, str], Any],
                   limit: float | None = None, split: Split | None = None) -> Iterator[Any]:
    """Yield ``execute(task)`` for every task, run in ``jobs`` worker processes, as each finishes.

    ``execute`` is a module-level function (the workers are spawned, so it is pickled by
    name). A task whose worker dies, that runs more than ``limit`` seconds (None: no limit),
    or that cannot be sent to a worker or back (it does not pickle) yields ``fail(task,
    message)`` instead. ``split`` narrows a death down: a task whose worker dies when it runs alone
    is divided by ``split.parts(task)``, each part runs alone, and ``split.join`` makes one result of
    theirs. At most ``2 * jobs`` tasks are submitted ahead, so a long iterable of tasks is consumed
    as the pool goes.
    """
    watch = _Watch(jobs, execute, limit, split)
    pending: dict[Future, Any] = {}
    try:
        for task in tasks:
            try:
                pending[watch.submit(task)] = task
            except BrokenProcessPool:  # a worker died since the last wait
                yield from _recover(watch, {None: task}, pending, fail)
            while len(pending) >= 2 * jobs:
                yield from _collect_finished(watch, pending, fail)
        while pending:
            yield from _collect_finished(watch, pending, fail)
    finally:
        watch.stop()  # an interrupt must not keep the process waiting for its workers


def _result(watch: _Watch, future: Future, task: Any, fail: Callable[[Any, str], Any]) -> Any:
    """The finished ``future``'s result (its pool did not break), or ``fail``'s when it could not travel
    (a plugin object that does not pickle) or the unit raised in its worker, whatever it raised: Ctrl-C does
    not reach a worker, so even a ``KeyboardInterrupt`` from there fails the unit, not the run."""
    try:
        exc = future.exception()  # returned, not raised: a Ctrl-C of this process still stops the run
        if exc is None:
            return future.result()
        return fail(task, f"could not run in a worker process: {type(exc).__name__}: {exc}")
    finally:
        watch.forget(future)


def _collect_finished(watch: _Watch, pending: dict[Future, Any], fail: Callable[[Any, str], Any]) -> Iterator[Any]:
    """Yield the results of the units that finished; a broken pool sends them all to ``_recover``."""
    broken: dict[Future | None, Any] = {}
    done, abandoned = watch.wait(pending)
    for future in done:
        task = pending.pop(future)
        if isinstance(future.exception(), BrokenProcessPool):
            broken[future] = task
            continue
        yield _result(watch, future, task, fail)
    if broken or abandoned:
        yield from _recover(watch, broken, pending, fail)


def _recover(watch: _Watch, broken: dict[Future | None, Any], pending: dict[Future, Any],
             fail: Callable[[Any, str], Any]) -> Iterator[Any]:
    """The pool is broken, and with it every unit it held: the units stopped for their time limit
    fail, and the watch starts a new pool. When the watch killed a worker of this pool, that
    explains the break and the others go back into the new pool (into ``pending``); otherwise a
    worker died, and each other unit runs again alone, so that the one that dies again fails
    (``WORKER_DIED``) by itself."""
    broken.update(pending)
    pending.clear()
    killed = watch.killed
    watch.stop()
    again = []
    for future, task in broken.items():
        stopped = watch.stopped(future)
        watch.forget(future)
        if stopped:
            yield fail(task, timed_out(watch.limit))
        else:
            again.append(task)
    watch.start()
    if killed:
        pending.update({watch.submit(task): task for task in again})
    else:
        for task in again:
            yield _run_alone(watch, task, fail)


def _run_alone(watch: _Watch, task: Any, fail: Callable[[Any, str], Any], divide: bool = True) -> Any:
    """``task`` in a worker of its own: its result, or ``fail``'s when that worker dies or runs out of time;
    a task that dies and ``watch.split`` divides (``divide``) runs again part by part."""
    alone = _Watch(1, watch.execute, watch.limit)
    try:
        future = alone.submit(task)
        done, _ = alone.wait([future])
        if done and not isinstance(future.exception(), BrokenProcessPool):
            return _result(alone, future, task, fail)
        if alone.stopped(future):
            return fail(task, timed_out(alone.limit))
    finally:
        alone.stop()
    parts = watch.split.parts(task) if watch.split is not None and divide else []
    if len(parts) < 2:
        return fail(task, WORKER_DIED)
    return watch.split.join([_run_alone(watch, part, fail, divide=False) for part in parts])


class Split(NamedTuple):
    """How to narrow a task whose worker died down to the part that kills it: ``parts(task)``, the tasks
    that do its work between them (one, or none, when it cannot be divided), and ``join(results)``, the
    task's result made of theirs (each a result or a ``fail``)."""

    parts: Callable[[Any], list[Any]]
    join: Callable[[list[Any]], Any]


# --------------------------------------------------------------------------- the pool and its clock

KILL_GRACE_S = 30.0  # how long a killed worker's pool may take to break before its units are given up

_started: Any = None  # in a worker: the queue its start reports go to


def _start_worker(started: Any, parent: int) -> None:
    global _started
    _started = started
    # Ctrl-C is the main process's: it stops the run and terminates the workers, which would otherwise
    # each print "Process SpawnProcess-N:" as they die of it. A handler that does nothing, not SIG_IGN: a
    # program a worker starts (the planned process) gets the default back at exec
    signal.signal(signal.SIGINT, _leave_to_the_main_process)
    os.setpgid(0, 0)  # a group of its own (out of the terminal's Ctrl-C): what it starts is killed with it
    _die_with(parent)
    from harness.case import ctrl_c_never_raises_here

    ctrl_c_never_raises_here()  # a KeyboardInterrupt here is a plugin's: its case's error row


def _leave_to_the_main_process(signum: int, frame: Any) -> None:
    """A worker's SIGINT handler: nothing (the main process ends the run and terminates the workers)."""


def _die_with(parent: int) -> None:
    """In a worker: kill its process group (itself and what it started) once ``parent`` is gone, a
    ``kill -9`` that terminated no worker. A thread polls: a worker in C code that holds the GIL goes when
    that call returns (``PR_SET_PDEATHSIG`` would end the worker at once but leave what it started, and
    fires when the thread that started it ends, not the process)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="membudget-parent-watch", daemon=True).start()


def _kill_group(pid: int) -> None:
    """Kill the process group of worker ``pid`` (itself and what it started), if there is one."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # gone, or no group: the worker never made its own
        pass


def _execute_reporting(execute: Callable[[Any], Any], task: Any, token: int) -> Any:
    """In a worker: say that unit ``token`` starts now (written before it runs), then run it."""
    if _started is not None:
        _started.put((token, os.getpid(), time.monotonic()))  # one clock for every process of the machine
    return execute(task)


class _Watch:
    """A pool of spawned workers, and the clock that kills a unit's worker once the unit has run
    ``limit`` seconds (and how to divide a unit whose worker died: ``split``). ``start`` makes a new pool (with its own queue of start reports: a worker
    killed while writing to a queue could leave it locked) after ``stop``."""

    def __init__(self, jobs: int, execute: Callable[[Any], Any], limit: float | None,
                 split: Split | None = None) -> None:
        self.jobs, self.execute, self.limit, self.split = jobs, execute, limit, split
        self._context = multiprocessing.get_context("spawn")
        self._tokens: dict[Future, int] = {}  # the units not yet collected
        self._started: dict[int, tuple[int, float]] = {}  # token -> (worker pid, start)
        self._stopped: dict[int, float] = {}  # token -> when its worker was killed
        self._count = itertools.count()
        self.start()

    def start(self) -> None:
        """A new pool of ``jobs`` workers."""
        # a SimpleQueue's put writes before it returns: the report is there before the unit runs
        self._reports = self._context.SimpleQueue() if self.limit is not None else None
        self.killed = False  # whether the watch killed a worker of this pool (which then breaks)
        self.pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=self._context,
                                        initializer=_start_worker, initargs=(self._reports, os.getpid()))

    def submit(self, task: Any) -> Future:
        """Submit ``task``; raises ``BrokenProcessPool`` when a worker died since the last wait."""
        token = next(self._count)
        future = self.pool.submit(_execute_reporting, self.execute, task, token)
        self._tokens[future] = token
        return future

    def wait(self, futures: Iterable[Future]) -> tuple[set[Future], bool]:
        """Wait until one of ``futures`` is done (a killed worker's unit is done: its pool broke),
        killing the worker of each unit past the time limit meanwhile. Returns the done futures, and
        True instead when a killed worker's pool has not broken within ``KILL_GRACE_S`` (a process
        the kill cannot end at once, e.g. in the GPU driver): its units are then given up."""
        futures = list(futures)
        while True:
            done, _ = wait(futures, timeout=self._next_wake(futures), return_when=FIRST_COMPLETED)
            if done:
                return done, False
            if self._kill_overdue(futures):
                return set(), True

    def stopped(self, future: Future | None) -> bool:
        """Whether ``future``'s unit was stopped for running past the time limit."""
        return future is not None and self._tokens.get(future) in self._stopped

    def forget(self, future: Future | None) -> None:
        """Drop what the watch keeps of a collected unit (its future holds the unit's rows)."""
        token = self._tokens.pop(future, None) if future is not None else None
        self._started.pop(token, None)
        self._stopped.pop(token, None)

    def stop(self) -> None:
        """Shut the pool down without waiting: queued units are cancelled, running workers ended, and what
        the workers started killed with their process groups."""
        processes = list((getattr(self.pool, "_processes", None) or {}).values())  # CPython's; terminate() needs them
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():  # SIGTERM ignored or blocked
                process.kill()
                process.join(timeout=1)
            _kill_group(process.pid)  # a planner's child the worker left running
        if self._reports is not None:
            self._reports.close()

    def _read_reports(self) -> None:
        live = set(self._tokens.values())  # a unit can be collected before its report is read
        while not self._reports.empty():
            token, pid, started = self._reports.get()
            if token in live:
                self._started[token] = (pid, started)

    def _next_wake(self, futures: list[Future]) -> float | None:
        """Seconds until the next unit's deadline (a killed one's: the end of its grace), at most
        ``POLL_S`` so that new start reports are read; None (no timeout) without a limit."""
        if self.limit is None:
            return None
        self._read_reports()
        deadlines = []
        for token in map(self._tokens.get, futures):
            if token in self._stopped:
                deadlines.append(self._stopped[token] + KILL_GRACE_S)
            elif token in self._started:
                deadlines.append(self._started[token][1] + self.limit)
        if not deadlines:
            return POLL_S
        return min(POLL_S, max(0.0, min(deadlines) - time.monotonic()) + 0.01)

    def _kill_overdue(self, futures: list[Future]) -> bool:
        """Kill the worker of each unit past the limit; True when a killed one outlived its grace."""
        now = time.monotonic()
        for token in map(self._tokens.get, futures):
            if token in self._stopped:
                if now - self._stopped[token] >= KILL_GRACE_S:
                    return True
            elif token in self._started and now - self._started[token][1] >= self.limit:
                self._stopped[token] = now
                self.killed = True
                _kill_group(self._started[token][0])  # gone already when it finished, or died, a moment ago
        return False
