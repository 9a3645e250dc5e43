"""Helpers shared by the built-in allocators."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from harness.allocators.trace import IntTrace, max_live_bytes
from harness.model import Placement


def make_placement(
    allocator: str,
    trace: IntTrace,
    offsets: Sequence[int] | np.ndarray,
    *,
    arena_bytes: int | None = None,
    optimal: bool | None = None,
    notes: str = "",
    lower_bound_bytes: int | None = None,
) -> Placement:
    """A ``Placement`` for ``trace``; the arena defaults to the highest block end."""
    off = np.asarray(offsets, dtype=np.int64)
    if arena_bytes is None:
        arena_bytes = int((off + trace.size).max()) if len(trace) else 0
    return Placement(
        allocator=allocator,
        offsets=tuple(int(x) for x in off),
        arena_bytes=int(arena_bytes),
        max_live_bytes=max_live_bytes(trace),
        optimal=optimal,
        notes=notes,
        lower_bound_bytes=None if lower_bound_bytes is None else int(lower_bound_bytes),
    )


def event_order(trace: IntTrace) -> np.ndarray:
    """Event codes in time order: ``i`` for the allocation of block i, ``~i`` for its free.

    Frees come before allocations at equal times (half-open lifetimes); among equal events,
    trace order. Online allocators replay a trace in this order. Blocks that occupy
    nothing (size 0, or an empty lifetime ``lower == upper``) have no events: they are
    placed at offset 0.
    """
    active = np.flatnonzero((trace.size > 0) & (trace.upper > trace.lower)).astype(np.int64)
    m = len(active)
    times = np.concatenate([trace.upper[active], trace.lower[active]])
    kinds = np.concatenate([np.zeros(m, np.int64), np.ones(m, np.int64)])
    owners = np.concatenate([active, active])
    order = np.lexsort((owners, kinds, times))
    codes = np.where(kinds[order] == 1, owners[order], ~owners[order])
    return codes


@contextmanager
def best_placement_on_interrupt(placement_of: Callable[[Any], Placement]) -> Iterator[None]:
    """Around an allocator's search: an interrupt (a ``KeyboardInterrupt``) that carries the search's best
    result so far as ``partial`` goes on carrying it as a ``Placement`` (``placement_of(partial)``) in
    ``placement``, as ``harness.protocols.Allocator`` describes, for ``membudget place`` to print."""
    try:
        yield
    except KeyboardInterrupt as exc:
        partial = getattr(exc, "partial", None)
        if partial is not None:
            exc.placement = placement_of(partial)
        raise
