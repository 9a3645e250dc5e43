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

import time
from typing import Sequence, Union

import numpy as np

from harness.allocators._common import best_placement_on_interrupt, make_placement
from harness.allocators.options import time_limit_option
from harness.allocators.trace import IntTrace, as_int_trace
from harness.hookspecs import hookimpl
from harness.model import MemoryBlock, Placement
from membudget_bestfit._kernels import (
    bestfit_kernel, bestfit_offsets, bestfit_reference, bestfit_rounds, compile_kernels,
)
from membudget_bestfit.improve import DEFAULT_ROUNDS, Rounds, squeaky_wheel
from membudget_bestfit.session import Allocation, ProfileGuidedSession

__all__ = [
    "BestFit",
    "ProfileGuidedSession",
    "Allocation",
    "bestfit_kernel",
    "bestfit_reference",
    "bestfit_offsets",
    "bestfit_rounds",
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
    ``time_limit`` (seconds, default None: none) ends the rounds once it has passed; the
    first round always runs. Without it the placement is the same on every machine.
    ``rounds`` and ``time_limit`` are also options of :meth:`place` (``membudget place
    --option time_limit=2``).
    """

    name = "bestfit"
    description = "profile-guided best-fit of papers/003 (offset lines, longest lifetime first)"
    options = ("time_limit", "rounds")

    def __init__(self, kernel: str = "numba", *, paper_only: bool = False, rounds: int = DEFAULT_ROUNDS,
                 time_limit: float | None = None) -> None:
        if kernel not in ("numba", "python"):
            raise ValueError(f"kernel must be 'numba' or 'python', got {kernel!r}")
        self.kernel = kernel
        self.paper_only = paper_only
        checked = self._check(rounds=rounds, time_limit=time_limit)
        self.rounds, self.time_limit = checked["rounds"], checked["time_limit"]

    @classmethod
    def _check(cls, **options) -> dict:
        """``options`` (``rounds``, ``time_limit``) checked; an unknown name is a TypeError, a bad value a ValueError."""
        unknown = sorted(set(options) - set(cls.options))
        if unknown:
            raise TypeError(f"bestfit has no option {', '.join(map(repr, unknown))}; its options: "
                            f"{', '.join(cls.options)}")
        rounds = options.get("rounds")
        if isinstance(rounds, float) and rounds.is_integer():  # --option rounds=1e2 reads as a float
            rounds = int(rounds)
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds must be an integer of at least 1, got {options.get('rounds')!r}")
        return {"rounds": rounds, "time_limit": time_limit_option(options.get("time_limit"))}

    def deterministic(self) -> "BestFit":
        """The same allocator without a time limit: the same placement on every machine."""
        return BestFit(self.kernel, paper_only=self.paper_only, rounds=self.rounds)

    def offsets(self, trace: Union[IntTrace, Sequence[MemoryBlock]]) -> np.ndarray:
        """Best-fit offsets for ``trace`` (one per block, in trace order)."""
        return self.rounds_run(trace).offsets

    def rounds_run(self, trace: Union[IntTrace, Sequence[MemoryBlock]], **options) -> Rounds:
        """The offsets for ``trace``, the rounds run and whether the time limit ended them
        (options as for :meth:`place`). The time limit counts from here, the kernel compiled first."""
        if self.kernel == "numba":
            compile_kernels()
        started = time.perf_counter()
        settings = self._check(**{"rounds": self.rounds, "time_limit": self.time_limit, **options})
        t = as_int_trace(trace)
        tl = settings["time_limit"]
        return bestfit_rounds(t.lower, t.upper, t.size, kernel=self.kernel, paper_only=self.paper_only,
                              rounds=settings["rounds"], deadline=None if tl is None else started + tl)

    def place(self, trace: Sequence[MemoryBlock], **options) -> Placement:
        """Place ``trace``: arena = the highest block end of the best-fit placement.

        ``options`` (``rounds``, ``time_limit``) override the allocator's for this call.
        Interrupted after the first round, the ``KeyboardInterrupt`` carries the best
        placement so far as ``placement`` (``membudget place`` prints it).
        """
        t = as_int_trace(trace)
        with best_placement_on_interrupt(lambda partial: self._placement(t, partial)):
            run = self.rounds_run(t, **options)
        return self._placement(t, run)

    def _placement(self, t: IntTrace, run: Rounds) -> Placement:
        if self.paper_only:
            mode = "paper_only"
        else:
            mode = f"{run.done} round(s)" + (", ended by the time limit" if run.timed_out else "")
        return make_placement(self.name, t, run.offsets, notes=f"kernel={self.kernel} {mode}")

    def session(self, **options) -> ProfileGuidedSession:
        """A profile-guided allocation session (papers/003 sections 4.1-4.3) that plans with this allocator."""
        return ProfileGuidedSession(self, **options)


@hookimpl
def membudget_register_allocators(register):
    """Register ``bestfit``."""
    register(BestFit())
