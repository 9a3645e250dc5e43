"""The options an allocator takes: the keyword parameters of its ``place``.

An allocator takes the options its ``place(trace, **options)`` names as keyword
parameters, or those listed in an ``options`` attribute when ``place`` takes
``**options``; any other name is an error that lists them (``membudget place --option``
and a suite's allocator entries are checked here).
"""

from __future__ import annotations

import inspect
from typing import Any

from harness.errors import UnknownOption

__all__ = ["allocator_options", "check_allocator_options", "time_limit_option"]


def allocator_options(alloc: Any) -> tuple[str, ...]:
    """The option names ``alloc.place`` takes besides the trace (``()``: none)."""
    params = list(inspect.signature(alloc.place).parameters.values())[1:]
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if any(p.kind == p.VAR_KEYWORD for p in params):
        named += list(getattr(alloc, "options", ()) or ())
    return tuple(dict.fromkeys(named))


def check_allocator_options(name: str, alloc: Any, options: dict[str, Any]) -> None:
    """``UnknownOption`` naming what ``alloc.place`` takes when ``options`` has a name it does not."""
    known = allocator_options(alloc)
    unknown = sorted(set(options) - set(known))
    if unknown:
        takes = f"its options: {', '.join(known)}" if known else "it takes no options"
        raise UnknownOption(f"allocator {name!r} has no option {', '.join(map(repr, unknown))}; {takes}")


def time_limit_option(value: Any) -> Any:
    """``value`` when it is an allocator's time limit, seconds >= 0 (``inf`` too) or None for none; else a
    ``ValueError`` that says so (a bool, a string, a negative number or nan)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0):
        raise ValueError(f"time_limit must be a number of seconds >= 0 (or None), got {value!r}")
    return value
