"""Wall-clock times less Numba's compilation: the ``*_time_s`` columns of a row (docs/results.md).

A Numba kernel compiles, or loads from its on-disk cache, at its first call with new argument
types. ``harness.case.warm_up`` plans a toy chain before a planner is timed, but a real chain can
take a path the toy one does not (another signature, a kernel the toy chain never reaches), and
that first call's compilation then landed in the row: the quick suite's published rows of
2026-11-28 had a ``recompute`` plan at 2.5 s against a median of 3 ms and a ``bestfit`` placement
at 14 s against 0.8 ms. Numba holds its compiler lock while it compiles or loads a kernel and
reports it as the event ``"numba:compiler_lock"`` (``numba.core.event``, its documented event
API), so :func:`stopwatch` takes the time spent under that lock off the wall time, whatever path
the planner, executor or allocator took. The lock's event also covers waiting for it, which is
not the timed code's work either.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Stopwatch", "stopwatch"]


@dataclass
class Stopwatch:
    """What :func:`stopwatch` measured once its block has ended (also when it raised).

    ``seconds``: the wall time less ``jit_seconds``, the time Numba spent compiling or loading
    kernels from its cache (waiting for its compiler lock included).
    """

    seconds: float = 0.0
    jit_seconds: float = 0.0


@contextmanager
def stopwatch() -> Iterator[Stopwatch]:
    """Time the block, Numba's compilation excluded: ``with stopwatch() as watch: ...; watch.seconds``."""
    from numba.core import event

    watch = Stopwatch()
    listener = event.TimingListener()  # counts nested acquisitions of the (reentrant) lock once
    started = time.perf_counter()
    try:
        with event.install_listener("numba:compiler_lock", listener):
            yield watch
    finally:
        wall = time.perf_counter() - started
        watch.jit_seconds = min(wall, listener.duration) if listener.done else 0.0
        watch.seconds = wall - watch.jit_seconds
