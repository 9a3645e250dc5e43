"""papers/003 sections 4.1-4.3 at run time, planned with best-fit by default.

The session itself is the core's :class:`harness.allocators.session.ProfileGuidedSession`
(it plans with any allocator); this module keeps the plugin's name for it, with
``BestFit()`` as the allocator when none is given.
"""

from __future__ import annotations

from typing import Any

from harness.allocators import session as _core
from harness.allocators.session import Allocation, SessionStats

__all__ = ["Allocation", "SessionStats", "ProfileGuidedSession"]


class ProfileGuidedSession(_core.ProfileGuidedSession):
    """The core session (``harness.allocators.session``), planning with ``BestFit()`` unless told otherwise."""

    def __init__(self, allocator: Any = None, **options: Any) -> None:
        if allocator is None:
            from membudget_bestfit import BestFit

            allocator = BestFit()
        super().__init__(allocator, **options)
