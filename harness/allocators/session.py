"""Profile-guided allocation at run time: papers/003 sections 4.1-4.3 as an API, for any allocator.

A :class:`ProfileGuidedSession` stands between a training loop and device memory:

- **profiling** (section 4.1): during the first iteration every request is served from a
  dynamic pool and monitored: the ``lambda``-th request of the iteration gets block id
  ``lambda``, and the time ``y`` advances by one at every monitored allocation and free;
- **optimisation** (section 4.2): at the end of that iteration the monitored blocks are
  placed by the session's allocator (any registered one: papers/003 uses best-fit, the
  ``membudget-bestfit`` plugin's default); the session then owns one region of ``arena_bytes`` (``u``) and
  answers the ``lambda``-th request of every later iteration with the planned offset
  ``x_lambda`` (``lambda`` restarts at every :meth:`begin_iteration`);
- **interrupt/resume** (section 4.3, first workaround): requests made between
  :meth:`interrupt` and :meth:`resume` (a non-hot part of the propagation) are not
  monitored and not planned: they go to the dynamic pool and do not advance ``lambda``
  or ``y``;
- **re-optimisation** (section 4.3, second workaround): monitoring continues after the
  plan is made; a request larger than planned (or beyond the planned requests, or one
  whose planned addresses are still taken, i.e. the part was not as hot as profiled) is
  served from the pool for this iteration and the plan is recomputed at the end of it
  from the newly observed parameters. Sizes are kept at the largest seen for each
  ``lambda``, so a smaller request never needs re-optimisation (as the paper notes).

Memory is modelled, not allocated: an :class:`Allocation` says which region (``plan`` or
``pool``) and which offset in it (:mod:`harness.allocators.realaddr` turns them into
device addresses). The pool is a first-fit free list (512-byte
granularity); :attr:`ProfileGuidedSession.pool_bytes` is its high-water mark.
Allocations made outside ``begin_iteration()``/``end_iteration()`` (weights, optimizer
state) are not monitored either, nor is the free of a block allocated in an earlier
iteration (a gradient kept until the next iteration clears it).

``alignment`` (default 1): planned sizes are rounded up to a multiple of it and the plan is
made in units of it, so every planned offset is aligned whatever the allocator (CUDA
wants 512 bytes). ``capacity`` (default None, unbounded): a planned block that would end
beyond it is a departure (the real arena is that big; :mod:`~harness.allocators.realaddr`
sets it).
"""

from __future__ import annotations

import bisect
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Literal, NamedTuple

from harness.allocators.trace import blocks_from_events, to_int_trace
from harness.model import Placement

__all__ = ["Allocation", "SessionStats", "ProfileGuidedSession"]

MAX_REASONS = 100  # the first reasons for re-optimising that SessionStats keeps


def round_up(n: int, granule: int) -> int:
    """``n`` rounded up to a multiple of ``granule`` (an alignment or a pool's granularity)."""
    return -(-int(n) // granule) * granule


class Allocation(NamedTuple):
    """One served request: ``region`` (``plan`` or ``pool``) and ``offset`` in it.

    ``index`` is the request's ``lambda`` in its iteration (None when it was not
    monitored); ``handle`` identifies it for :meth:`ProfileGuidedSession.free`.
    Immutable; a tuple because one is made for every device allocation of a planned
    iteration (``benchmarks/bench_realaddr.py``).
    """

    handle: int
    size: int
    region: Literal["plan", "pool"]
    offset: int
    index: int | None


@dataclass
class SessionStats:
    """Counters of a session: iterations, (re-)optimisations, where requests were served."""

    iterations: int = 0
    optimizations: int = 0
    reoptimizations: int = 0
    planned: int = 0
    pooled: int = 0
    unmonitored: int = 0
    reasons: list[str] = field(default_factory=list)  # the first MAX_REASONS


class _FirstFitPool:
    """The dynamic pool: first fit over an address-ordered free list, growing at the top."""

    def __init__(self, granularity: int = 512) -> None:
        self.g = granularity
        self.addr: list[int] = []
        self.size: list[int] = []
        self.top = 0

    def malloc(self, size: int) -> tuple[int, int]:
        """``(address, rounded size)`` of the lowest free block that fits, else at the top."""
        size = max(self.g, round_up(size, self.g))
        for k, s in enumerate(self.size):
            if s >= size:
                a = self.addr[k]
                if s == size:
                    del self.addr[k], self.size[k]
                else:
                    self.addr[k] += size
                    self.size[k] -= size
                return a, size
        a = self.top
        self.top += size
        return a, size

    def free(self, addr: int, size: int) -> None:
        """Return a block, merging with free neighbours; a free block at the top shrinks the pool."""
        k = bisect.bisect_left(self.addr, addr)
        if k > 0 and self.addr[k - 1] + self.size[k - 1] == addr:
            k -= 1
            self.size[k] += size
        else:
            self.addr.insert(k, addr)
            self.size.insert(k, size)
        if k + 1 < len(self.addr) and self.addr[k] + self.size[k] == self.addr[k + 1]:
            self.size[k] += self.size[k + 1]
            del self.addr[k + 1], self.size[k + 1]
        if self.addr[-1] + self.size[-1] == self.top:  # give the top back
            self.top = self.addr[-1]
            del self.addr[-1], self.size[-1]


class ProfileGuidedSession:
    """Profile, plan with ``allocator``, serve planned offsets, re-optimise (module docstring).

    ``allocator`` is the planner of offsets: any object with ``place(trace) -> Placement``
    (a registered allocator). Typical use::

        s = ProfileGuidedSession(allocator)   # or BestFit().session()
        for it in range(iterations):
            s.begin_iteration()
            a = s.malloc(nbytes)          # planned offset after the first iteration
            with s.unmonitored():         # a non-hot part
                b = s.malloc(other)       # always from the pool
                s.free(b)
            s.free(a)
            s.end_iteration()             # plans after the sample run, re-plans when needed
    """

    def __init__(self, allocator: Any, *, pool_granularity: int = 512, alignment: int = 1,
                 capacity: int | None = None) -> None:
        if alignment < 1:
            raise ValueError(f"alignment must be at least 1, got {alignment}")
        self.allocator = allocator
        self.alignment = alignment
        self.capacity = capacity
        self.stats = SessionStats()
        self._pool = _FirstFitPool(pool_granularity)
        self._pool_peak = 0
        self._plan: Placement | None = None
        # per lambda, the planned offset and size (lists: the hot path indexes them one at a time)
        self._plan_offsets: list[int] = []
        self._plan_sizes: list[int] = []
        self._in_iteration = False
        self._interrupted = 0
        self._lam = 0
        self._events: list[tuple[str, int, int]] = []
        self._need_reopt = False
        self._next_handle = 0
        self._iteration = 0  # numbers the iterations, so that a free knows where its allocation was made
        self._live: dict[int, tuple[Allocation, int | None]] = {}  # handle -> (allocation, iteration if monitored)
        self._carried: set[int] = set()  # lambdas whose block outlives its iteration (freed in a later one)
        self._live_plan: list[tuple[int, int, int]] = []  # (offset, end, handle), sorted

    # ------------------------------------------------------------------ state
    @property
    def plan(self) -> Placement | None:
        """The current plan (best-fit placement of the profiled blocks), None before the first."""
        return self._plan

    @property
    def arena_bytes(self) -> int:
        """``u``: the planned region's size (0 before the first plan)."""
        return self._plan.arena_bytes if self._plan is not None else 0

    @property
    def pool_bytes(self) -> int:
        """The dynamic pool's high-water mark in bytes."""
        return self._pool_peak

    @property
    def total_bytes(self) -> int:
        """Planned region plus pool high-water mark: the device memory the session needed."""
        return self.arena_bytes + self.pool_bytes

    @property
    def monitoring(self) -> bool:
        """Whether requests made now are monitored (inside an iteration, not interrupted)."""
        return self._in_iteration and self._interrupted == 0

    # ------------------------------------------------------------------ iteration
    def begin_iteration(self) -> None:
        """Start an iteration: ``lambda`` and ``y`` restart, monitoring starts."""
        if self._in_iteration:
            raise RuntimeError("begin_iteration() inside an iteration; call end_iteration() first")
        self._in_iteration = True
        self._iteration += 1
        self._interrupted = 0
        self._lam = 0
        self._events = []
        self._need_reopt = self._plan is None

    def end_iteration(self) -> bool:
        """End the iteration; plan (first time) or re-plan (when needed). Returns whether it did."""
        if not self._in_iteration:
            raise RuntimeError("end_iteration() outside an iteration")
        self._in_iteration = False
        self.stats.iterations += 1
        if not self._need_reopt:
            return False
        self.optimize()
        return True

    def interrupt(self) -> None:
        """Stop monitoring: requests until :meth:`resume` are served by the pool, unplanned."""
        self._interrupted += 1

    def resume(self) -> None:
        """Resume monitoring after :meth:`interrupt`."""
        if self._interrupted == 0:
            raise RuntimeError("resume() without interrupt()")
        self._interrupted -= 1

    @contextmanager
    def unmonitored(self) -> Iterator[None]:
        """``interrupt()`` ... ``resume()`` as a context manager."""
        self.interrupt()
        try:
            yield
        finally:
            self.resume()

    # ------------------------------------------------------------------ requests
    def malloc(self, size: int) -> Allocation:
        """Serve a request of ``size`` bytes (see the module docstring for where it goes)."""
        if size < 0:
            raise ValueError("size must be >= 0")
        handle = self._next_handle
        self._next_handle = handle + 1
        if self._in_iteration and not self._interrupted:  # monitored (the hot path: no property)
            index = self._lam
            self._lam = index + 1
            self._events.append(("alloc", index, size))
            alloc = self._try_plan(handle, index, size)
            if alloc is None:
                alloc = self._from_pool(handle, size, index)
                self.stats.pooled += 1
            else:
                self.stats.planned += 1
            self._live[handle] = (alloc, self._iteration)
        else:
            self.stats.unmonitored += 1
            alloc = self._from_pool(handle, size, None)
            self._live[handle] = (alloc, None)
        return alloc

    def _from_pool(self, handle: int, size: int, index: int | None) -> Allocation:
        addr, _ = self._pool.malloc(size)
        self._pool_peak = max(self._pool_peak, self._pool.top)
        return Allocation(handle, size, "pool", addr, index)

    def free(self, allocation: Allocation) -> None:
        """Release an allocation made by :meth:`malloc`."""
        try:
            alloc, made_in = self._live.pop(allocation.handle)
        except KeyError:
            raise ValueError(f"allocation {allocation.handle} is not live") from None
        if made_in == self._iteration and self._in_iteration and alloc.index is not None:
            self._events.append(("free", alloc.index, 0))
        elif made_in is not None and made_in != self._iteration and alloc.index is not None:
            # carried into this iteration: its planned addresses are taken from the iteration's
            # start until now, so the next plan keeps it apart from everything (see optimize)
            self._carried.add(alloc.index)
        if alloc.region == "pool":
            self._pool.free(alloc.offset, max(self._pool.g, round_up(alloc.size, self._pool.g)))
        else:
            key = (alloc.offset, alloc.offset + alloc.size, alloc.handle)
            k = bisect.bisect_left(self._live_plan, key)
            if k < len(self._live_plan) and self._live_plan[k] == key:
                self._live_plan.pop(k)

    def _try_plan(self, handle: int, index: int, size: int) -> Allocation | None:
        if self._plan is None:
            return None
        sizes = self._plan_sizes
        if index >= len(sizes):
            self._reopt(f"request {index} beyond the {len(sizes)} planned")
            return None
        if size > sizes[index]:
            self._reopt(f"request {index}: {size} bytes > {sizes[index]} planned")
            return None
        offset = self._plan_offsets[index]
        end = offset + size
        if self.capacity is not None and end > self.capacity:
            self._reopt(f"request {index}: ends at {end}, beyond the arena's {self.capacity} bytes")
            return None
        if size > 0:
            live = self._live_plan
            k = bisect.bisect_left(live, (offset, end, handle))
            if (k > 0 and live[k - 1][1] > offset) or (k < len(live) and live[k][0] < end):
                self._reopt(f"request {index}: planned addresses still in use (not hot)")
                return None
            live.insert(k, (offset, end, handle))
        return Allocation(handle, size, "plan", offset, index)

    def _reopt(self, reason: str) -> None:
        self._need_reopt = True
        if len(self.stats.reasons) < MAX_REASONS:
            self.stats.reasons.append(reason)

    # ------------------------------------------------------------------ planning
    def profiled_blocks(self):
        """The monitored blocks of the current (or last) iteration, as section 4.1 counts time.

        Sizes are the largest seen for each ``lambda`` over the session's plans.
        """
        blocks = blocks_from_events(self._events)
        out = []
        for b in blocks:
            lam = int(b.name)
            size = b.size
            if lam < len(self._plan_sizes):
                size = max(size, self._plan_sizes[lam])
            out.append((lam, size, b))
        out.sort(key=lambda r: r[0])
        return out

    def optimize(self) -> Placement:
        """Plan offsets from the last monitored iteration (also the re-optimisation)."""
        rows = self.profiled_blocks()
        from harness.model import MemoryBlock

        n, g = len(rows), self.alignment
        # sizes rounded up to the alignment and planned in units of it: every offset aligned
        # a block carried into the next iteration also holds its addresses from that iteration's
        # start: planned as alive from time 0, it overlaps (and is kept apart from) every block
        trace = [MemoryBlock(id=lam, name=str(lam), size=-(-size // g),
                             alloc=0 if lam in self._carried else b.alloc, free=b.free)
                 for lam, size, b in rows]
        placement = self.allocator.place(trace)
        if g > 1:
            placement = replace(placement, offsets=tuple(int(o) * g for o in placement.offsets),
                                arena_bytes=placement.arena_bytes * g, max_live_bytes=placement.max_live_bytes * g,
                                lower_bound_bytes=None if placement.lower_bound_bytes is None
                                else placement.lower_bound_bytes * g)
        offsets = [0] * n
        sizes = [0] * n
        for k, (lam, size, _) in enumerate(rows):
            offsets[lam] = int(placement.offsets[k])
            sizes[lam] = round_up(size, g)
        if self._plan is not None:
            self.stats.reoptimizations += 1
        self.stats.optimizations += 1
        self._plan = placement
        self._plan_offsets = offsets
        self._plan_sizes = sizes
        self._need_reopt = False
        return placement

    def profile_trace(self):
        """The last monitored iteration as an integer trace (for inspection and tests)."""
        return to_int_trace([b for _, _, b in self.profiled_blocks()])
