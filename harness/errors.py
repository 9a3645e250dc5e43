"""Errors a user sees: each says what is wrong and what to do about it."""

from __future__ import annotations

import sys
import traceback


class MembudgetError(Exception):
    """Base of every error the harness reports to a user (no traceback needed)."""


class PluginWarning(UserWarning):
    """A plugin problem the registry worked around (``harness.plugins``): the CLI prints it as one line."""


class UnknownPlugin(MembudgetError, KeyError):
    """A suite or command named a profiler, planner, executor, allocator or model nobody registered."""

    def __init__(self, kind: str, name: str, available: list[str], hint: str | None = None):
        """``available``: every registered name; ``hint`` replaces their list in the message (long lists)."""
        self.kind, self.name, self.available = kind, name, available
        choices = ", ".join(sorted(available)) or "(none registered)"
        super().__init__(f"unknown {kind} {name!r}; " + (hint if hint is not None else f"available: {choices}"))

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class InfeasibleBudget(MembudgetError):
    """The budget is below what the planner (or any schedule) can work with.

    ``needed_bytes``: the bytes the planner knows it would need, an int above the refused
    budget (the minimum memory, or the peak of the leanest schedule it tried). Planners
    always pass it; the conformance kit checks it rather than the message's wording.
    """

    def __init__(self, message: str, needed_bytes: int | None = None):
        self.needed_bytes = needed_bytes
        super().__init__(message)


class UnknownOption(MembudgetError, ValueError):
    """A planner was given an option its ``plan`` does not take (a typo would otherwise be ignored)."""


class PlanContractError(MembudgetError, TypeError):
    """A planner returned what the ``Planner`` contract forbids (no ``Schedule``, a schedule for a
    budget larger than it was given): the message names the planner (``harness.schedules``)."""


class InvalidSchedule(PlanContractError):
    """A planner returned a schedule the vocabulary's rules refuse before anything reads it: an operation or a
    transfer of the wrong kind, a stage out of the chain, a missing backward, an algorithm the stage does not
    have (``harness.validate.check_structure``). ``violations`` lists them; the message is the first."""

    def __init__(self, violations: list) -> None:
        self.violations = violations
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        super().__init__(f"invalid schedule: {violations[0]}{more}")


class OptionValueError(MembudgetError, ValueError):
    """A planner's option has a value it cannot take: the message names the planner and the option."""


class MissingDependency(MembudgetError):
    """An optional package a feature needs is not installed: the message names the feature and the
    ``pip install`` that adds it (OR-Tools for the ``exact`` allocator, Ray for the ``ray`` backend)."""


class ProfilingError(MembudgetError):
    """A model could not be profiled: the message says which model, what failed, and what to try."""


# What a plugin's code can raise that is its own failure, not an interrupt: every exception but
# KeyboardInterrupt (Ctrl-C, and SIGTERM as the command line raises it). A plugin that calls sys.exit, or
# lets a GeneratorExit escape, fails its case (or is skipped); it never ends the run without a word. A case
# goes further (harness.case.classify): any BaseException a plugin raises fails it (asyncio.CancelledError),
# and only a KeyboardInterrupt where Ctrl-C raises one (not in a pool worker) stops the run.
PLUGIN_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit, GeneratorExit)


# the libraries a plugin calls into: a failure inside one is reported at the caller's line, via the library's
LIBRARIES = frozenset({"numpy", "numba", "llvmlite", "pandas", "pyarrow", "pydantic", "pydantic_core", "pluggy",
                       "yaml", "rich", "scipy", "torch", "torchvision", "transformers", "ray", "ortools"})


def raised_at(exc: BaseException) -> str:
    """Where ``exc`` was raised, as `` (at module:line in function)``, named by module so that a row's
    message reads the same on every machine: the innermost frame of the traceback outside Python's
    standard library and outside the libraries of ``LIBRARIES``, so a plugin's slip names its line,
    followed by ``via`` the innermost library frame when the error came from inside one (a pandas
    ``KeyError``), and by ``called from`` the plugin's innermost frame when the error came from
    inside the harness (a planning helper given a stage that does not exist). Empty when no frame
    qualifies, and for the harness's own errors (``MembudgetError``), whose words say what failed
    and whose it was."""
    if isinstance(exc, MembudgetError):
        return ""
    own = inner = caller = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        module = str(frame.f_globals.get("__name__", ""))
        top = module.split(".")[0]
        if not module or top in sys.stdlib_module_names:
            continue
        inner = f"{module}:{line} in {frame.f_code.co_name}"
        if top not in LIBRARIES:
            own = inner
            if top != "harness":
                caller = inner
    if own is None:
        return f" (at {inner})" if inner else ""
    where = own if own == inner else f"{own}, via {inner}"
    if caller is not None and caller != own:
        where += f", called from {caller}"
    return f" (at {where})"
