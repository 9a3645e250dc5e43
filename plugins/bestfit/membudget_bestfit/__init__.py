"""membudget-bestfit: the profile-guided best-fit placement of papers/003 (Sekiyama et al.).

Registers the allocator ``bestfit``: the best-fit heuristic of papers/003 section 3.2
(offset lines, the lowest-then-leftmost line, the longest-lifetime block that fits,
lift-up merging) as a Numba kernel (``_kernels.bestfit_kernel``) with a plain-Python
reference (``_kernels.bestfit_reference``). Time is counted as section 4.1 counts it
(:func:`harness.allocators.trace.to_int_trace`). By default the paper's pass is the first
of a few squeaky-wheel rounds (:mod:`membudget_bestfit.improve`) that keep the smallest
arena; ``BestFit(paper_only=True)`` is the paper's pass alone.

Section 4.3 (non-hot propagation) is :meth:`BestFit.session`: a
:class:`~membudget_bestfit.session.ProfileGuidedSession` that profiles a sample run,
serves planned offsets afterwards, leaves what is requested between ``interrupt()`` and
``resume()`` to a dynamic pool, and re-optimises when a request is larger than planned.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from harness.allocators._common import make_placement
from harness.allocators.trace import IntTrace, as_int_trace
from harness.hookspecs import hookimpl
from harness.model import MemoryBlock, Placement
from membudget_bestfit._kernels import bestfit_kernel, bestfit_offsets, bestfit_reference
from membudget_bestfit.improve import DEFAULT_ROUNDS, squeaky_wheel
from membudget_bestfit.session import Allocation, ProfileGuidedSession

__all__ = [
    "BestFit",
    "ProfileGuidedSession",
    "Allocation",
    "bestfit_kernel",
    "bestfit_reference",
    "bestfit_offsets",
    "squeaky_wheel",
    "membudget_register_allocators",
]

__version__ = "0.1.0"


class BestFit:
    """``bestfit``: papers/003's best-fit heuristic, planned ahead from the profiled trace.

    ``kernel``: ``"numba"`` (default) or ``"python"`` (the reference; same offsets, slower).
    ``paper_only``: one pass of section 3.2's rule as the paper states it. By default the
    allocator runs the squeaky-wheel rounds of :mod:`membudget_bestfit.improve` instead:
    that pass first, then up to ``rounds`` - 1 reruns that place the blocks left above the
    max-live bytes earlier; the smallest arena is kept (never larger than the paper's).
    """

    name = "bestfit"
    description = "profile-guided best-fit of papers/003 (offset lines, longest lifetime first)"

    def __init__(self, kernel: str = "numba", *, paper_only: bool = False, rounds: int = DEFAULT_ROUNDS) -> None:
        if kernel not in ("numba", "python"):
            raise ValueError(f"kernel must be 'numba' or 'python', got {kernel!r}")
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {rounds}")
        self.kernel = kernel
        self.paper_only = paper_only
        self.rounds = rounds

    def offsets(self, trace: Union[IntTrace, Sequence[MemoryBlock]]) -> np.ndarray:
        """Best-fit offsets for ``trace`` (one per block, in trace order)."""
        t = as_int_trace(trace)
        return bestfit_offsets(t.lower, t.upper, t.size, kernel=self.kernel,
                               paper_only=self.paper_only, rounds=self.rounds)

    def place(self, trace: Sequence[MemoryBlock]) -> Placement:
        """Place ``trace``: arena = the highest block end of the best-fit placement."""
        t = as_int_trace(trace)
        off = self.offsets(t)
        mode = "paper_only" if self.paper_only else f"rounds<={self.rounds}"  # squeaky-wheel rounds, at most
        return make_placement(self.name, t, off, notes=f"kernel={self.kernel} {mode}")

    def session(self, **options) -> ProfileGuidedSession:
        """A profile-guided allocation session (papers/003 sections 4.1-4.3) that plans with this allocator."""
        return ProfileGuidedSession(self, **options)


@hookimpl
def membudget_register_allocators(register):
    """Register ``bestfit``."""
    register(BestFit())
