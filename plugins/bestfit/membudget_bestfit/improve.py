"""Squeaky-wheel rounds over section 3.2's best-fit: an extension, the paper's rule first.

Why the paper's rule alone leaves gaps
--------------------------------------
Best-fit (papers/003 section 3.2) builds the placement on a skyline and never goes back.
On a training iteration the forward pass's nested activations are placed first (they
live longest) and their stacking order fixes where the backward pass's short blocks can
go. A backward block whose lifetime straddles the end of two forward blocks fits no
single offset line; the line is lifted ("lift up") over space that stays empty below it
for the line's whole time range, and the blocks placed later stack above the hole. On
the quick suite's offloading traces (VGG-11, ResNet-18) this put the arena up to 9.4%
above the max-live bytes although CP-SAT (``exact``) places them at max-live. The
choices themselves follow the paper (lowest then leftmost line, longest lifetime that
fits, lift-up merging with the lower neighbour or both); no tie-break order the paper
leaves open fixes it (measured: the best of six tie-break orders still 9.4%).

What this adds
--------------
The paper leaves what to do with a poor placement open: section 4.3 re-optimises only
when a request outgrows the profile, and section 5.3.2 notes that DSA can be solved
again on idle CPUs. Here the heuristic is rerun with another order of preference
(squeaky-wheel optimisation, Joslin & Clements 1999): the first round is the paper's
rule exactly; after each round the blocks whose top lies above the max-live bytes (a
lower bound of every placement) move, in their order, to the front of the order, and
the next round places them first. The skyline, the line choice and the lift-up stay the
paper's; only which fitting block a line takes changes. The smallest arena of all rounds
is kept, so the result is never worse than the paper's rule; the rounds stop at
max-live (optimal), when an order repeats, or after ``rounds`` rounds. Everything is
deterministic.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from membudget_bestfit._kernels import bestfit_kernel, bestfit_reference, paper_priority

__all__ = ["DEFAULT_ROUNDS", "Rounds", "squeaky_wheel", "promote"]

DEFAULT_ROUNDS = 32


class Rounds(NamedTuple):
    """What :func:`squeaky_wheel` did: the best ``offsets``, the rounds ``done`` and
    whether the deadline ended them (``timed_out``) before the optimum, a repeated order
    or the round limit did."""

    offsets: np.ndarray
    done: int
    timed_out: bool


def promote(priority: np.ndarray, tops: np.ndarray, bound: int) -> np.ndarray:
    """``priority`` with the blocks whose top exceeds ``bound`` moved to the front (stable)."""
    over = tops[priority] > bound
    return np.concatenate([priority[over], priority[~over]])


def squeaky_wheel(lower, upper, size, *, lower_bound: int, rounds: int = DEFAULT_ROUNDS,
                  kernel: str = "numba", deadline: float | None = None) -> Rounds:
    """Best offsets over up to ``rounds`` rounds of best-fit (:class:`Rounds`).

    Round 1 is the paper's order (:func:`paper_priority`); ``lower_bound`` (the max-live
    bytes of these blocks) ends the search when reached and picks the blocks to promote.
    ``deadline`` (a ``time.perf_counter()`` value, None: none) ends the rounds once it has
    passed; round 1 always runs, so a placement is always there. Interrupted (Ctrl-C) after
    round 1, the ``KeyboardInterrupt`` carries the best ``Rounds`` so far as ``partial``
    (``timed_out`` false: the interrupt, not the deadline, ended them).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    lo, up, sz = (np.ascontiguousarray(a, dtype=np.int64) for a in (lower, upper, size))
    place = bestfit_kernel if kernel == "numba" else bestfit_reference
    priority = paper_priority(lo, up, sz)
    best, best_arena = None, None
    seen: set[bytes] = set()
    done = 0
    try:
        while done < rounds:
            seen.add(priority.tobytes())
            offsets = place(lo, up, sz, priority)
            done += 1
            tops = offsets + sz
            arena = int(tops.max()) if len(tops) else 0
            if best_arena is None or arena < best_arena:
                best, best_arena = offsets, arena
            if arena <= lower_bound:
                break
            priority = promote(priority, tops, lower_bound)
            if priority.tobytes() in seen:
                break
            if done < rounds and deadline is not None and time.perf_counter() >= deadline:
                return Rounds(best, done, True)
    except KeyboardInterrupt as exc:
        if best is not None:
            exc.partial = Rounds(best, done, False)
        raise
    return Rounds(best, done, False)
