"""Byte quantities as people write them: ``512MiB``, ``4GiB``, ``1.5GB``, ``1e9``; budget fractions.

A byte quantity is a whole number of bytes from 0 to ``MAX_BYTES`` (2**63 - 1, what a
64-bit count holds). A budget fraction is a share of the span from the minimum memory to
the keep-all peak: 0..1 in a suite, 0%..100% on the command line, one rule for both
(:func:`check_fraction`).
"""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
MAX_BYTES = 2**63 - 1
FRACTION_RULE = "a fraction of the span min..peak must be within 0..100% (0..1 in a suite)"
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """Return the number of bytes in ``text`` (an int, or a string with an optional unit)."""
    if isinstance(text, bool):
        raise ValueError(f"not a byte quantity: {text!r}")
    if isinstance(text, (int, float)):
        if text < 0 or text != text:
            raise ValueError(f"a byte quantity cannot be negative: {text!r}")
        _check_size(text, text)
        if text != int(text) and text < 1024:
            raise ValueError(f"not a whole number of bytes: {text!r} (for a share of the span min..peak write e.g. 50%)")
        return int(text)
    if text.strip().startswith("-"):
        raise ValueError(f"a byte quantity cannot be negative: {text!r}")
    match = _PATTERN.match(text)
    if not match or match.group(2).upper() not in _UNITS:
        raise ValueError(
            f"not a byte quantity: {text!r} (write e.g. 1073741824, 512MiB, 4GiB or 1.5GB)"
        )
    number, unit = match.group(1), _UNITS[match.group(2).upper()]
    value = int(number) * unit if number.isdigit() else float(number) * unit  # digits: exact
    _check_size(value, text)
    if value != int(value) and value < 1024:
        raise ValueError(f"not a whole number of bytes: {text!r} (for a share of the span min..peak write e.g. 50%)")
    return int(value)


def _check_size(value: float, text: str | int | float) -> None:
    if not math.isfinite(value) or value > MAX_BYTES:  # exact, for floats too
        raise ValueError(f"too large: {text!r} (at most {MAX_BYTES} bytes)")


def check_fraction(fraction: float) -> float:
    """``fraction`` when it lies within [0, 1]; else ``ValueError(FRACTION_RULE)`` (NaN too).

    The one rule for budget fractions: a suite's ``budgets: {fractions: [...]}`` and the
    command line's ``--budget 50%`` both call it.
    """
    if not 0 <= fraction <= 1:
        raise ValueError(FRACTION_RULE)
    return fraction


def format_bytes(n: float) -> str:
    """Format a byte count with a binary unit, e.g. ``1.50 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
