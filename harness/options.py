"""The options a planner takes, so that a misspelt one is an error instead of being ignored.

A planner's options are the keyword parameters of its ``plan`` after the profile and the
budget, plus any names it lists in an ``extra_options`` attribute (for options it reads
from ``**options``; ``extra_options = ()`` declares that it takes no others). Planners keep
``**options`` in their signature so that one call shape serves them all; this check is
what stops ``{name: dynprog, slot: 500}`` from planning silently with the default. A
planner whose ``plan`` takes only ``**options`` and declares nothing is not checked: it
reads its options itself (the protocol allows it).
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping, Sequence

from harness.errors import OptionValueError, UnknownOption
from harness.lazy import resolve

_FIXED = 2  # profile, budget_bytes


def _option_parameters(obj: Any) -> list[inspect.Parameter]:
    """The parameters of ``obj.plan`` after the profile and the budget."""
    return list(inspect.signature(obj.plan).parameters.values())[_FIXED:]


def _names(obj: Any, params: list[inspect.Parameter]) -> tuple[str, ...] | None:
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    extra = getattr(obj, "extra_options", None)
    if not named and extra is None and any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return tuple(dict.fromkeys([*named, *(extra or ())]))


def planner_options(planner: Any) -> tuple[str, ...] | None:
    """The option names ``planner.plan`` accepts, in signature order; None when it does not say."""
    obj = resolve(planner)
    return _names(obj, _option_parameters(obj))


def check_planner_options(name: str, planner: Any, options: Mapping[str, Any]) -> None:
    """Raise ``UnknownOption`` naming the planner's options if ``options`` has one it does not take, or
    gives a switch (a parameter whose default is ``True`` or ``False``) a value that is not one of them."""
    obj = resolve(planner)
    params = _option_parameters(obj)
    known = _names(obj, params)
    if known is None:
        return
    unknown = sorted(set(options) - set(known))
    if unknown:
        takes = f"its options: {', '.join(known)}" if known else "it takes no options"
        raise UnknownOption(f"planner {name!r} has no option {', '.join(map(repr, unknown))}; {takes}")
    switches = {p.name for p in params if isinstance(p.default, bool)}
    for key, value in options.items():
        if key in switches and not isinstance(value, bool):
            raise UnknownOption(f"planner {name!r}: option {key} is true or false, got {value!r}")


def int_option(planner: str, name: str, value: Any, minimum: int) -> int:
    """``value`` as an int of at least ``minimum``, else an ``OptionValueError`` (a ``ValueError``) naming
    the planner's option (a bool, a float such as 1.5, a string or a list is refused rather than coerced
    or compared)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionValueError(f"{planner}: option {name} must be an integer >= {minimum}, got {value!r}")
    return value


def choice_option(planner: str, name: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value`` when it is one of ``choices``, else an ``OptionValueError`` (a ``ValueError``) naming the
    planner's (or allocator's) option and its choices."""
    if isinstance(value, bool) or value not in choices:
        raise OptionValueError(f"{planner}: option {name} must be one of {', '.join(map(str, choices))}, "
                               f"got {value!r}")
    return value


def seconds_option(planner: str, name: str, value: Any) -> float | None:
    """``value`` as a finite number of seconds >= 0 (None: no limit; 0: stop at once, the planner's fallback),
    else an ``OptionValueError`` naming the planner's option (a bool, a string, a negative number, nan or
    inf is refused)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise OptionValueError(f"{planner}: option {name} must be a number of seconds >= 0, got {value!r}")
    return float(value)
