"""TFLite's greedy-by-size offset assignment (Pisarchyk & Lee, 2020).

As in ``tensorflow/lite/delegates/gpu/common/memory_management/greedy_by_size_assignment.h``
(``GreedyBySizeAssignment``): take the blocks in non-increasing order of size (trace
order among equal sizes); for each, look at the blocks already placed whose lifetimes
intersect its own, in order of offset, and put it in the *smallest* gap between them
that it fits in (the gap below the lowest one included); if no gap fits, put it right
above the highest of them. It plans offsets ahead, as best-fit does, but by size only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from harness.allocators._common import make_placement
from harness.allocators.trace import IntTrace, as_int_trace
from harness.model import MemoryBlock, Placement

__all__ = ["GreedyBySize", "greedy_by_size_offsets"]


def greedy_by_size_offsets(trace: IntTrace) -> np.ndarray:
    """The greedy-by-size offsets of ``trace`` (one per block, int64)."""
    n = len(trace)
    offsets = np.zeros(n, dtype=np.int64)
    order = np.lexsort((np.arange(n), -trace.size))  # size descending, then trace order
    lo, up, sz = trace.lower, trace.upper, trace.size
    placed_idx = np.empty(n, dtype=np.int64)
    k = 0
    for i in order:
        if sz[i] == 0 or up[i] == lo[i]:
            continue  # occupies nothing: offset 0
        cand = placed_idx[:k]
        hit = cand[(lo[cand] < up[i]) & (lo[i] < up[cand])]
        if len(hit):
            hit = hit[np.lexsort((hit, offsets[hit]))]
            starts = offsets[hit]
            ends = starts + sz[hit]
            prev_end = np.concatenate(([0], np.maximum.accumulate(ends)[:-1]))
            gaps = starts - prev_end
            fits = np.flatnonzero(gaps >= sz[i])
            if len(fits):
                best = fits[np.argmin(gaps[fits])]  # smallest gap, lowest one among ties
                offsets[i] = prev_end[best]
            else:
                offsets[i] = ends.max()
        placed_idx[k] = i
        k += 1
    return offsets


class GreedyBySize:
    """``greedy-by-size``: largest block first, into the smallest gap among time-overlapping blocks."""

    name = "greedy-by-size"
    description = "TFLite greedy-by-size offsets: largest first, smallest fitting gap"

    def place(self, trace: Sequence[MemoryBlock]) -> Placement:
        """Plan offsets for the whole trace ahead (sizes and lifetimes known)."""
        t = as_int_trace(trace)
        return make_placement(self.name, t, greedy_by_size_offsets(t))
