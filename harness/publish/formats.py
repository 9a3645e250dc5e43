"""How a published page writes a number: milliseconds, bytes, ratios, gradient errors, file names."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from harness.units import format_bytes


def number(value: Any) -> float | None:
    """A cell's value as a float, or None when it is missing (None, NA, NaN) or not a number."""
    if value is None or value is pd.NA:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def below_the_weights(budget_bytes: Any, weight_bytes: Any) -> bool:
    """True when a budget is below the weights alone: no schedule runs there (none moves weights), so the
    budget's lower bound (papers/004 Prop. 3, finite at any budget) is not shown as if it could be reached."""
    budget, weights = number(budget_bytes), number(weight_bytes)
    return budget is not None and weights is not None and budget < weights


def fmt_ms(value: Any) -> str:
    """Seconds as milliseconds, or ``-``."""
    f = number(value)
    return "-" if f is None else f"{f * 1e3:.2f}"


def fmt_bytes(value: Any) -> str:
    """Bytes with a binary unit, or ``-``."""
    f = number(value)
    return "-" if f is None else format_bytes(f)


def fmt_error(value: Any) -> str:
    """A gradient error in two significant digits (``3.1e-07``), or ``-``."""
    v = number(value)
    return "-" if v is None else f"{v:.1e}"


def fmt_ratio(value: Any) -> str:
    """A ratio with three decimals, or ``-``."""
    f = number(value)
    return "-" if f is None else f"{f:.3f}"


def slug(text: str) -> str:
    """``text`` as a file-name stem (``harness.results.file_stem``), short enough for a plot's name."""
    from harness.results import file_stem

    return file_stem(text, limit=200)  # plot names add up to 35 bytes around it
