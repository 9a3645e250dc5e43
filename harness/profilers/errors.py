"""The error a profiler raises for a model it cannot trace, cut into a chain, or measure."""

from __future__ import annotations

from harness.errors import MembudgetError


class ProfilingError(MembudgetError):
    """A model could not be profiled: the message says which model, what failed, and what to try."""
