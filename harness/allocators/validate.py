"""The placement validator every allocator's tests use.

A placement is valid when every block has an offset, every block lies inside the arena
(``0 <= offset`` and ``offset + size <= arena_bytes``) and no two blocks share an
address while both are alive. Lifetimes are those of the integer trace
(:func:`harness.allocators.trace.to_int_trace`), which keeps every overlap of the float
trace, so a placement valid here is valid for the executor's trace too.

The check sweeps the events in time order and keeps the live blocks sorted by offset:
while the live blocks are disjoint, a new block can only collide with its neighbours in
that order, so each allocation costs a binary search (plus a scan of the live blocks
only when a collision is found, to report every block it hits).
"""

from __future__ import annotations

import bisect
import numbers
from dataclasses import dataclass
from typing import Literal, Sequence, Union

import numpy as np

from harness.allocators.trace import IntTrace, as_int_trace, max_live_bytes
from harness.model import MemoryBlock, Placement

__all__ = ["Violation", "PlacementError", "violations", "check_placement", "is_valid", "placement_refusal"]

ViolationKind = Literal["count", "whole", "negative", "arena", "overlap", "max_live"]


@dataclass(frozen=True)
class Violation:
    """One way a placement is wrong: its ``kind``, the block indices involved, and a message."""

    kind: ViolationKind
    blocks: tuple[int, ...]
    message: str


class PlacementError(AssertionError):
    """Raised by :func:`check_placement` for an invalid placement; ``violations`` lists why."""

    def __init__(self, violations: list[Violation]):
        self.violations = violations
        head = "; ".join(v.message for v in violations[:5])
        more = f" (and {len(violations) - 5} more)" if len(violations) > 5 else ""
        super().__init__(f"invalid placement: {head}{more}")


def violations(
    trace: Union[IntTrace, Sequence[MemoryBlock]],
    placement: Union[Placement, Sequence[int]],
    arena_bytes: int | None = None,
    *,
    limit: int = 100,
) -> list[Violation]:
    """Everything wrong with ``placement`` for ``trace`` (an empty list when it is valid).

    ``placement`` is a :class:`Placement` (its arena and max-live bytes are checked too)
    or a bare sequence of offsets (then ``arena_bytes``, when given, bounds them).
    Stops after ``limit`` violations.
    """
    t = as_int_trace(trace)
    n = len(t)
    found: list[Violation] = []
    if isinstance(placement, Placement):
        offsets = placement.offsets
        arena = placement.arena_bytes if arena_bytes is None else arena_bytes
        expected_live = max_live_bytes(t)
        if placement.max_live_bytes != expected_live:
            found.append(
                Violation(
                    "max_live", (),
                    f"max_live_bytes is {placement.max_live_bytes}, the trace's is {expected_live}",
                )
            )
    else:
        offsets = placement
        arena = arena_bytes
    if len(offsets) != n:
        return found + [Violation("count", (), f"{len(offsets)} offsets for {n} blocks")]
    found += [Violation("whole", (), f"{what} is {value!r}, not a whole number of bytes (an int)")
              for what, value in (("arena_bytes", arena), ("max_live_bytes", getattr(placement, "max_live_bytes", 0)))
              if value is not None and not _whole(value)]
    if n and np.asarray(offsets).dtype.kind not in "iu":  # floats would be cut to whole bytes below without a word
        odd = [k for k, o in enumerate(offsets) if not _whole(o)]
        if odd:
            return found + [Violation("whole", (odd[0],), f"block {t.ids[odd[0]]}: offset {offsets[odd[0]]!r} is not a "
                                                          "whole number of bytes (an int)")]
    off = np.asarray(offsets, dtype=np.int64) if n else np.zeros(0, np.int64)
    end = off + t.size
    for i in np.flatnonzero(off < 0)[:limit]:
        found.append(Violation("negative", (int(i),), f"block {t.ids[i]}: negative offset {int(off[i])}"))
    if arena is not None:
        for i in np.flatnonzero(end > arena)[:limit]:
            found.append(
                Violation(
                    "arena", (int(i),),
                    f"block {t.ids[i]}: addresses [{int(off[i])}, {int(end[i])}) end beyond the arena of {arena} "
                    "bytes",
                )
            )
    if len(found) >= limit:
        return found[:limit]

    # sweep: frees before allocations at the same time (half-open lifetimes)
    times = np.concatenate([t.upper, t.lower])
    kinds = np.concatenate([np.zeros(n, np.int64), np.ones(n, np.int64)])
    owners = np.concatenate([np.arange(n), np.arange(n)])
    order = np.lexsort((owners, kinds, times))
    live_keys: list[tuple[int, int]] = []  # (offset, block), sorted
    size = t.size
    for e in order:
        i = int(owners[e])
        if size[i] == 0 or t.upper[i] == t.lower[i]:
            continue  # occupies no address, or is never alive
        key = (int(off[i]), i)
        if kinds[e] == 0:
            pos = bisect.bisect_left(live_keys, key)
            if pos < len(live_keys) and live_keys[pos] == key:
                live_keys.pop(pos)
            continue
        pos = bisect.bisect_left(live_keys, key)
        clash = False
        if pos > 0:
            j = live_keys[pos - 1][1]
            clash |= int(end[j]) > key[0]
        if pos < len(live_keys):
            j = live_keys[pos][1]
            clash |= int(off[j]) < int(end[i])
        if clash:
            for _, j in live_keys:
                if int(off[j]) < int(end[i]) and int(off[i]) < int(end[j]):
                    a, b = sorted((i, j))
                    found.append(
                        Violation(
                            "overlap", (a, b),
                            f"blocks {t.ids[a]} (addresses [{int(off[a])}, {int(end[a])})) and {t.ids[b]} "
                            f"([{int(off[b])}, {int(end[b])})) share addresses while both alive (event ranks "
                            f"[{int(t.lower[a])}, {int(t.upper[a])}) and [{int(t.lower[b])}, {int(t.upper[b])}) "
                            "of harness.allocators.trace.to_int_trace)",
                        )
                    )
                    if len(found) >= limit:
                        return found
        live_keys.insert(pos, key)
    return found


def is_valid(
    trace: Union[IntTrace, Sequence[MemoryBlock]],
    placement: Union[Placement, Sequence[int]],
    arena_bytes: int | None = None,
) -> bool:
    """Whether ``placement`` is valid for ``trace`` (see :func:`violations`)."""
    return not violations(trace, placement, arena_bytes, limit=1)


def _whole(value: object) -> bool:
    """True for an integer (Python's or NumPy's), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def placement_refusal(trace: Union[IntTrace, Sequence[MemoryBlock]], placement: object) -> str | None:
    """Why the runner refuses what an allocator plugin returned for ``trace`` (None: nothing): not a
    :class:`Placement`, a placement with :func:`violations` (the first three), or a lower bound above its
    own arena. The core judges every placement a row reports, as ``membudget place`` does, so that an
    allocator cannot win a table with overlapping blocks or a max-live of its own."""
    if not isinstance(placement, Placement):
        return f"returned a {type(placement).__name__}, not a harness.model.Placement"
    found = violations(trace, placement, limit=3)
    if found:
        return "invalid placement: " + "; ".join(v.message for v in found)
    bound = placement.lower_bound_bytes
    if bound is not None and bound > placement.arena_bytes:
        return f"claims a lower bound of {bound} bytes, above its own arena of {placement.arena_bytes} bytes"
    return None


def check_placement(
    trace: Union[IntTrace, Sequence[MemoryBlock]],
    placement: Union[Placement, Sequence[int]],
    arena_bytes: int | None = None,
) -> None:
    """Raise :class:`PlacementError` listing the violations if ``placement`` is invalid."""
    found = violations(trace, placement, arena_bytes)
    if found:
        raise PlacementError(found)
