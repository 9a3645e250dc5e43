"""Errors a user sees: each says what is wrong and what to do about it."""

from __future__ import annotations


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


class ProfilingError(MembudgetError):
    """A model could not be profiled: the message says which model, what failed, and what to try."""


# What a plugin's code can raise that is its own failure, not an interrupt: every exception but
# KeyboardInterrupt (Ctrl-C, and SIGTERM as the command line raises it). A plugin that calls sys.exit, or
# lets a GeneratorExit escape, fails its case (or is skipped); it never ends the run without a word.
PLUGIN_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit, GeneratorExit)


def raised_at(exc: BaseException) -> str:
    """Where ``exc`` was raised, as `` (at module:line in function)``: the innermost frame outside
    Python's standard library, named by module so that a row's message reads the same on every
    machine. A plugin's slip (a ``KeyError`` in its planner) then names its line. Empty when no
    frame of the traceback qualifies."""
    import sys
    import traceback

    where = ""
    for frame, line in traceback.walk_tb(exc.__traceback__):
        module = str(frame.f_globals.get("__name__", ""))
        if module and module.split(".")[0] not in sys.stdlib_module_names:
            where = f" (at {module}:{line} in {frame.f_code.co_name})"
    return where
