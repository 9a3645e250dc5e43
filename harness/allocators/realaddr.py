"""Planned placement at real addresses: papers/003 section 4 serving device pointers (issue #18).

A :class:`RealAddressAllocator` answers ``alloc(size, device, stream) -> address`` and
``free(ptr, size, device, stream)`` (the signatures of PyTorch's pluggable CUDA allocator)
by driving a :class:`~harness.allocators.session.ProfileGuidedSession`:

- the first monitored iteration is the profiling run: every request goes to the
  **fallback** memory and is recorded (request index ``lambda``, section 4.1's time);
- at its end the session plans the recorded blocks with the chosen allocator plugin (any
  registered one: ``bestfit``, ``greedy-by-size``, ``minisearch``, ...), and the allocator
  obtains **one arena** of the plan's size from the device memory;
- later iterations get ``arena base + planned offset`` for the ``lambda``-th request;
- a request that departs from the profiled sequence (larger than planned, beyond the
  planned requests, planned addresses still taken, or ending beyond the arena) is a
  **departure**: served by the fallback, counted, and the next iteration re-plans from the
  sequence just seen (section 4.3's re-optimisation); the arena is obtained again, larger,
  when the new plan needs more and none of its blocks is alive;
- requests made inside :meth:`unmonitored` (a non-hot part, section
  4.3's interrupt/resume) and outside iterations (weights, optimizer state, the gradient
  check) go to the fallback, unmonitored.

One operation at a time: a lock serialises the calls. A free that arrives while the same
thread is inside another call (on CUDA, a garbage collection during the planning in
:meth:`~RealAddressAllocator.end_iteration` releasing a device tensor, whose free callback
comes back here) waits until that call is over, instead of waiting for a lock its own
thread holds.

Addresses are ``alignment``-aligned (512 bytes by default, what CUDA's caching allocator
guarantees): the session plans in units of the alignment. A request of 0 bytes is served
one unit, so that every live request has its own address.

Memory comes from a :class:`DeviceMemory`: ``malloc(size) -> address`` and ``free(address,
size)``. :class:`FakeMemory` is an address space without memory (tests, and the CPU's
emulation of the planned path); on CUDA it is cudaMalloc/cudaFree
(:mod:`harness.executors._cuda_pluggable`). The allocator never calls the device memory
for a planned request, so the iterations after the plan make no device allocation at all.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from harness.allocators._common import event_order
from harness.allocators.session import Allocation, ProfileGuidedSession, round_up
from harness.allocators.trace import IntTrace

__all__ = ["DeviceMemory", "FakeMemory", "RealAddressStats", "RealAddressAllocator", "trace_events"]


class DeviceMemory(Protocol):
    """Where the arena and the fallback's blocks come from."""

    def malloc(self, size: int) -> int:
        """An address of ``size`` bytes; raises ``MemoryError`` when there is none."""

    def free(self, ptr: int, size: int) -> None:
        """Give back what :meth:`malloc` returned."""


class FakeMemory:
    """An address space without memory: addresses only, never reused, live ranges checked.

    Every ``malloc`` takes fresh addresses above the last ones (``alignment``-aligned), so a
    bug that hands out one address twice cannot hide behind reuse. ``capacity`` (bytes live
    at once) makes ``malloc`` raise ``MemoryError`` beyond it.
    """

    def __init__(self, base: int = 1 << 40, alignment: int = 512, capacity: int | None = None) -> None:
        self.base, self.alignment, self.capacity = base, alignment, capacity
        self.top = base
        self.live: dict[int, int] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.mallocs = 0

    def malloc(self, size: int) -> int:
        size = max(size, 1)
        if self.capacity is not None and self.live_bytes + size > self.capacity:
            raise MemoryError(f"fake device memory: {size} bytes more than the {self.capacity} it has")
        g = self.alignment
        ptr = round_up(self.top, g)
        self.top = ptr + size
        self.live[ptr] = size
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.mallocs += 1
        return ptr

    def free(self, ptr: int, size: int) -> None:
        try:
            self.live_bytes -= self.live.pop(ptr)
        except KeyError:
            raise ValueError(f"fake device memory: free of {ptr:#x}, which is not allocated") from None


@dataclass
class RealAddressStats:
    """What a :class:`RealAddressAllocator` served: counts and bytes.

    The requests served at planned addresses and the unmonitored ones are the session's
    counts (``session.stats.planned``, ``.unmonitored``). ``departures`` counts monitored
    requests, after a plan exists, that the plan could not serve (each went to the
    fallback); ``departures_by_iteration`` the same per iteration; ``recorded`` the requests
    of profiling iterations (before any plan); ``errors`` the frees of unknown addresses
    (ignored, never raised through a C callback).

    ``held_peak_bytes`` is the most the device memory held for this allocator at once (the arena plus
    the fallback's live blocks: the fallback gives each block back when it is freed);
    it and ``fallback_peak_bytes`` are high-water marks since the last
    :meth:`RealAddressAllocator.reset_peaks` (the torch executor resets them before its timed
    iterations, as it resets the caching allocator's); ``process_peak_bytes`` is never reset.
    """

    requests: int = 0
    recorded: int = 0
    departures: int = 0
    departures_by_iteration: list[int] = field(default_factory=list)
    fallback_live_bytes: int = 0
    fallback_peak_bytes: int = 0
    held_peak_bytes: int = 0
    process_peak_bytes: int = 0
    arena_allocations: int = 0
    errors: list[str] = field(default_factory=list)


class _Exclusive:
    """The allocator's lock for one call; on leaving it, the frees deferred meanwhile (also when it raised).

    Only a free may arrive inside another call of the same thread (it waits); anything else there
    would run in the middle of that call's bookkeeping, and is refused (on CUDA the callback then
    serves it with cudaMalloc). A class rather than a generator: it is entered twice for every
    allocation of a planned CUDA iteration (``bench_realaddr.py``)."""

    __slots__ = ("owner",)

    def __init__(self, owner: RealAddressAllocator) -> None:
        self.owner = owner

    def __enter__(self) -> None:
        owner = self.owner
        owner._lock.acquire()
        if owner._depth:
            owner._lock.release()
            raise RuntimeError("an allocator call inside another one on the same thread")
        owner._depth = 1

    def __exit__(self, *exc: object) -> None:
        owner = self.owner
        try:
            if owner._deferred:
                owner._run_deferred()
        finally:
            owner._depth = 0
            owner._lock.release()


class RealAddressAllocator:
    """One arena at planned offsets, a fallback for the rest (module docstring).

    ``allocator``: the allocator plugin that plans (``place(trace) -> Placement``).
    ``memory``: the device memory (arena and fallback), ``fallback``: other memory for the
    fallback (default ``memory``).
    """

    def __init__(self, allocator: Any, memory: DeviceMemory, *, fallback: DeviceMemory | None = None,
                 alignment: int = 512) -> None:
        self.memory = memory
        self.fallback = fallback if fallback is not None else memory
        self.alignment = alignment
        self.session = ProfileGuidedSession(allocator, alignment=alignment, pool_granularity=alignment)
        self.stats = RealAddressStats()
        self.arena_base: int | None = None
        self.arena_capacity = 0
        self._by_ptr: dict[int, Allocation] = {}
        self._lock = threading.RLock()
        self._depth = 0  # calls of this thread under way: a free inside one is deferred
        self._deferred: list[int] = []
        self._exclusive = _Exclusive(self)
        self._iteration_departures = 0

    # ------------------------------------------------------------------ figures
    @property
    def plan_bytes(self) -> int:
        """The current plan's arena (0 before the first plan)."""
        return self.session.arena_bytes

    @property
    def reserved_bytes(self) -> int:
        """The most this allocator held from the device at once (arena plus live fallback blocks) since
        the last :meth:`reset_peaks`. Not arena + fallback peak: the fallback's peak is the profiling
        iteration's, whose blocks were given back before the arena was obtained."""
        return self.stats.held_peak_bytes

    def _held_changed(self) -> None:
        s = self.stats
        held = self.arena_capacity + s.fallback_live_bytes
        s.held_peak_bytes = max(s.held_peak_bytes, held)
        s.process_peak_bytes = max(s.process_peak_bytes, held)

    def reset_peaks(self) -> None:
        """Start the high-water marks again from what is held now (``torch.cuda.reset_peak_memory_stats``)."""
        with self._lock:
            s = self.stats
            s.fallback_peak_bytes = s.fallback_live_bytes
            s.held_peak_bytes = self.arena_capacity + s.fallback_live_bytes

    def in_arena(self, ptr: int) -> bool:
        """Whether ``ptr`` lies in the arena."""
        return self.arena_base is not None and self.arena_base <= ptr < self.arena_base + self.arena_capacity

    # ------------------------------------------------------------------ requests
    def alloc(self, size: int, device: int = 0, stream: int = 0) -> int:
        """An address for ``size`` bytes: planned when the plan serves it, else from the fallback."""
        with self._exclusive:
            a = self.session.malloc(max(int(size), 1))
            self.stats.requests += 1
            if a.region == "plan" and self.arena_base is None:  # cannot happen with capacity 0; be safe
                self.session.free(a)
                raise RuntimeError("a planned request with no arena")
            if a.region == "plan":
                ptr = self.arena_base + a.offset
            else:
                rounded = round_up(a.size, self.alignment)
                try:
                    ptr = self.fallback.malloc(rounded)
                except BaseException:
                    self.session.free(a)
                    raise
                self.stats.fallback_live_bytes += rounded
                self.stats.fallback_peak_bytes = max(self.stats.fallback_peak_bytes, self.stats.fallback_live_bytes)
                self._held_changed()
                if a.index is None:
                    pass  # unmonitored (the session counts it)
                elif self.session.plan is None:
                    self.stats.recorded += 1
                else:
                    self.stats.departures += 1
                    self._iteration_departures += 1
            self._by_ptr[ptr] = a
            return ptr

    def free(self, ptr: int, size: int = 0, device: int = 0, stream: int = 0) -> None:
        """Release ``ptr`` (``size`` is not needed: the allocator remembers it)."""
        with self._lock:
            if self._depth:  # this thread is inside another call (module docstring)
                self._deferred.append(ptr)
                return
            with self._exclusive:
                self._release(ptr)

    def _release(self, ptr: int) -> None:
        a = self._by_ptr.pop(ptr, None)
        if a is None:
            self.stats.errors.append(f"free of {ptr:#x}, which this allocator did not serve")
            return
        self.session.free(a)
        if a.region == "pool":
            rounded = round_up(a.size, self.alignment)
            self.fallback.free(ptr, rounded)
            self.stats.fallback_live_bytes -= rounded
            self._held_changed()

    def _run_deferred(self) -> None:
        while self._deferred:
            ptr = self._deferred.pop(0)
            try:
                self._release(ptr)
            except Exception as exc:  # noqa: BLE001 - a free has no caller to tell
                self.stats.errors.append(f"deferred free of {ptr:#x}: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ iterations
    def begin_iteration(self) -> None:
        """Start a monitored iteration (``lambda`` restarts)."""
        with self._exclusive:
            self.session.begin_iteration()
            self._iteration_departures = 0

    def end_iteration(self) -> bool:
        """End it; plan or re-plan when needed and (re)obtain the arena. Returns whether it planned.

        Call it where the device memory may be allocated (on CUDA: not inside an allocator
        callback).
        """
        with self._exclusive:
            planned = self.session.end_iteration()
            self.stats.departures_by_iteration.append(self._iteration_departures)
            if self.session.plan is not None:
                self._fit_arena()
            return planned

    def unmonitored(self) -> Any:
        """Requests inside are not monitored (papers/003 section 4.3): the session's ``interrupt()``
        ... ``resume()`` as a context manager."""
        return self.session.unmonitored()

    def _fit_arena(self) -> None:
        need = self.session.arena_bytes
        if need <= self.arena_capacity:
            self.session.capacity = self.arena_capacity
            return
        if any(self.in_arena(p) for p in self._by_ptr):
            # planned blocks still alive: the arena cannot move; requests beyond it depart
            self.session.capacity = self.arena_capacity
            return
        self.release_arena()
        capacity = round_up(need, self.alignment)
        # no arena until the malloc succeeds: every planned request departs to the fallback
        self.session.capacity = 0
        self.arena_capacity = 0
        self.arena_base = self.memory.malloc(capacity)
        self.arena_capacity = capacity
        self._held_changed()
        self.stats.arena_allocations += 1
        self.session.capacity = capacity

    def release_arena(self) -> None:
        """Give the arena back (nothing planned may be alive)."""
        if self.arena_base is not None:
            self.memory.free(self.arena_base, self.arena_capacity)
            self.arena_base, self.arena_capacity = None, 0
            self.session.capacity = 0
            self._held_changed()

    def close(self) -> None:
        """Give back the arena; the fallback's live blocks stay with their owners."""
        with self._exclusive:
            self.release_arena()

    def summary(self) -> dict[str, int]:
        """The figures an executor reports (``Run.metrics`` keys)."""
        s, st = self.stats, self.session.stats
        return {
            "arena_bytes": int(self.arena_capacity),
            "plan_bytes": int(self.plan_bytes),
            "plan_max_live_bytes": int(self.session.plan.max_live_bytes if self.session.plan else 0),
            "fallback_peak_bytes": int(s.fallback_peak_bytes),
            "planned_reserved_bytes": int(self.reserved_bytes),
            "planned_process_peak_bytes": int(s.process_peak_bytes),
            "requests": int(s.requests),
            "planned_requests": int(st.planned),
            "departures": int(s.departures),
            "unmonitored_requests": int(st.unmonitored),
            "reoptimizations": int(st.reoptimizations),
            "arena_allocations": int(s.arena_allocations),
        }


def trace_events(trace: IntTrace) -> list[tuple[str, int, int]]:
    """The requests of a recorded trace in time order: ``("alloc", block, size)`` / ``("free", block, 0)``.

    What a program made of the trace's allocations and frees would ask an allocator
    (frees first at equal times; blocks with nothing to hold are left out).
    """
    out: list[tuple[str, int, int]] = []
    for code in event_order(trace):
        code = int(code)
        if code >= 0:
            out.append(("alloc", code, int(trace.size[code])))
        else:
            out.append(("free", ~code, 0))
    return out


def replay(real: RealAddressAllocator, events: Sequence[tuple[str, Any, int]], *,
           check: bool = True) -> dict[Any, int]:
    """Play ``events`` (as :func:`trace_events` gives them) through ``real`` in one iteration.

    With ``check``, every address served is tested against the live ones: two live
    requests never share a byte (``AssertionError`` otherwise). Returns the addresses of
    the requests still alive at the end (they are not freed).
    """
    live: dict[Any, tuple[int, int]] = {}
    starts: list[int] = []  # sorted starts of live ranges, for the overlap test
    ends: dict[int, int] = {}
    real.begin_iteration()
    for kind, key, size in events:
        if kind == "alloc":
            ptr = real.alloc(size)
            end = ptr + max(size, 1)
            if check:
                k = int(np.searchsorted(starts, ptr))
                if k > 0 and ends[starts[k - 1]] > ptr:
                    raise AssertionError(f"request {key} at {ptr:#x} overlaps a live one at {starts[k - 1]:#x}")
                if k < len(starts) and starts[k] < end:
                    raise AssertionError(f"request {key} at {ptr:#x}+{size} overlaps a live one at {starts[k]:#x}")
                starts.insert(k, ptr)
                ends[ptr] = end
            live[key] = (ptr, size)
        else:
            ptr, size = live.pop(key)
            real.free(ptr, size)
            if check:
                starts.remove(ptr)
                del ends[ptr]
    real.end_iteration()
    return {key: ptr for key, (ptr, _) in live.items()}
