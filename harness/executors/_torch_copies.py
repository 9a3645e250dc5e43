"""The copy engines of the torch executor: offloads and prefetches of saved blocks.

``CudaCopies`` runs the copies on side CUDA streams (one shared by both directions, or
one per direction when ``duplex``), into and out of pinned host buffers from a pool
that is reused across iterations. A copy is ordered after the compute it depends on
with an event; the compute stream waits for a copy only where the schedule says so
(``Transfer.wait_op``), before a backward that reads the data, or, for a block that kept its
head on the device, before a prefetch regrows it (its offload's shrink must be over). A storage that a copy
still reads is released with ``record_stream``, so the caching allocator reuses its
memory only once both the copy and the compute that wrote it are done (the
simulator's rule: an offload releases at max(copy end, end of F_i), papers/004
assumption E).

``CpuCopies`` is the same interface with host memory standing in for device memory:
every copy is synchronous, so it stalls the (only) compute stream for its duration.

Both record a ``Clock`` mark around every operation and copy, which gives the
measured timeline of an iteration.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.executors._torch_store import Block, flat_bytes


class HostPool:
    """Host buffers by exact size, reused across iterations (pinned on CUDA).

    A buffer handed back with an event is handed out again with it: the copy that writes it next
    waits for that event (the copy that read it is over) on its own stream, not the host.
    """

    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned
        self._free: dict[int, list[tuple[torch.Tensor, Any]]] = {}
        self.allocated_bytes = 0

    def take(self, nbytes: int) -> tuple[torch.Tensor, Any]:
        """A host buffer of ``nbytes`` bytes (uint8), and the event its last reader's copy recorded
        (None for none): what writes the buffer must wait for it. A wait on the host here held back
        the operations issued after it (moDNN's offload after a prefetch that read the buffer it
        reuses: the next forward was issued only once that prefetch was over)."""
        free = self._free.get(nbytes)
        if free:
            return free.pop()
        self.allocated_bytes += nbytes
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pinned), None

    def give(self, buf: torch.Tensor, event: Any = None) -> None:
        """Return ``buf`` to the pool with ``event`` (if any), which its next writer waits for."""
        self._free.setdefault(buf.numel(), []).append((buf, event))

    def clear(self) -> None:
        """Drop every buffer."""
        self._free.clear()
        self.allocated_bytes = 0


@dataclass
class Mark:
    """A point in time on a stream: a CUDA event or a ``perf_counter`` reading."""

    value: Any


@dataclass
class Clock:
    """Marks on the compute and copy streams, resolved to seconds after the iteration."""

    cuda: bool
    origin: Mark | None = None
    spans: list[tuple[str, str, Mark, Mark]] = field(default_factory=list)

    def mark(self, stream: Any = None) -> Mark:
        """Now, on ``stream`` (CUDA) or on the host clock (CPU)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(stream)
            return Mark(event)
        return Mark(time.perf_counter())

    def start(self, stream: Any = None) -> None:
        """Set time zero of the iteration."""
        self.origin = self.mark(stream)
        self.spans.clear()

    def span(self, label: str, stream_name: str, start: Mark, end: Mark) -> None:
        """Record an interval of work on a stream."""
        self.spans.append((label, stream_name, start, end))

    def seconds(self, mark: Mark) -> float:
        """Seconds from the origin to ``mark`` (after the device has synchronised)."""
        assert self.origin is not None
        if self.cuda:
            return self.origin.value.elapsed_time(mark.value) / 1e3
        return mark.value - self.origin.value

    def between(self, start: Mark, end: Mark) -> float:
        """Seconds from ``start`` to ``end``."""
        if self.cuda:
            return start.value.elapsed_time(end.value) / 1e3
        return end.value - start.value


class CpuCopies:
    """Synchronous copies between two kinds of host memory (the CPU stand-in for a GPU)."""

    cuda = False

    def __init__(self, pool: HostPool, clock: Clock) -> None:
        self.pool, self.clock = pool, clock
        self.moved_bytes = 0
        self.stall_s = 0.0

    def offload(self, plan: list[tuple[Block, int]], label: str) -> None:
        """Move the tail of each block to a host buffer and shrink its storage."""
        start = self.clock.mark()
        for block, take in plan:
            host, _ = self.pool.take(take)  # every copy is over: there is nothing to wait for
            keep = block.nbytes - block.moved - take
            host.copy_(flat_bytes(block.storage)[keep:keep + take])
            block.storage.resize_(keep)
            block.host, block.moved = host, block.moved + take
            self.moved_bytes += take
        end = self.clock.mark()
        self.stall_s += self.clock.between(start, end)
        self.clock.span(label, "copy", start, end)
        return None

    def prefetch(self, blocks: list[Block], label: str) -> None:
        """Grow each block's storage back and copy its tail in."""
        start = self.clock.mark()
        for block in blocks:
            if not block.moved:
                continue
            keep = block.nbytes - block.moved
            block.storage.resize_(block.nbytes)
            flat_bytes(block.storage)[keep:].copy_(block.host)
            self.pool.give(block.host)
            self.moved_bytes += block.moved
            block.host, block.moved = None, 0
        end = self.clock.mark()
        self.stall_s += self.clock.between(start, end)
        self.clock.span(label, "copy", start, end)
        return None

    def wait(self, handle: Any) -> None:
        """Nothing to wait for: every copy is already complete."""

    def join(self) -> None:
        """Nothing in flight: the iteration ends with its last operation."""

    def synchronize(self) -> None:
        """Nothing in flight on the CPU."""

    def resolve(self) -> None:
        """Stall time is known as the copies run."""


class CudaCopies:
    """Copies on side CUDA streams with events; the compute stream waits where told and before it
    regrows a block whose offload kept its head (``prefetch``)."""

    cuda = True

    def __init__(self, device: torch.device, pool: HostPool, clock: Clock, duplex: bool) -> None:
        self.device, self.pool, self.clock = device, pool, clock
        self.compute = torch.cuda.current_stream(device)
        self.d2h = torch.cuda.Stream(device)
        self.h2d = torch.cuda.Stream(device) if duplex else self.d2h
        self.duplex = duplex
        self.moved_bytes = 0
        self._waits: list[tuple[Mark, Mark]] = []
        self.stall_s = 0.0

    def offload(self, plan: list[tuple[Block, int]], label: str) -> torch.cuda.Event:
        """Copy the tails out after the compute issued so far; release the device bytes."""
        ready = torch.cuda.Event()
        ready.record(self.compute)
        hosts = [self.pool.take(take) for _, take in plan]
        with torch.cuda.stream(self.d2h):
            self.d2h.wait_event(ready)
            for _, read in hosts:
                if read is not None:
                    self.d2h.wait_event(read)  # the prefetch that last read the buffer is over
            start = self.clock.mark(self.d2h)
            for (block, take), (host, _) in zip(plan, hosts):
                keep = block.nbytes - block.moved - take
                flat = flat_bytes(block.storage)
                host.copy_(flat[keep:keep + take], non_blocking=True)
                flat.record_stream(self.d2h)  # the old memory is reused only after this copy
                del flat
                block.storage.resize_(keep)  # a shrink reallocates on this stream
                if keep:
                    flat_bytes(block.storage).record_stream(self.compute)
                block.host, block.moved = host, block.moved + take
                self.moved_bytes += take
            done = torch.cuda.Event()
            done.record(self.d2h)
            self.clock.span(label, "d2h" if self.duplex else "copy", start, self.clock.mark(self.d2h))
        for block, _ in plan:
            block.ready = done
        return done

    def prefetch(self, blocks: list[Block], label: str) -> torch.cuda.Event:
        """Allocate each block again on the compute stream, then copy its tail in on the side stream
        once the compute issued so far is over; may raise ``torch.OutOfMemoryError``.

        The compute stream allocates, so that a prefetched block returns to the pool the rest of
        the chain's memory comes from when its backward frees it (the caching allocator keeps a
        pool per stream; allocated on the side stream, the blocks it freed were of no use to the
        compute stream, whose reserve then grew to the cap, where the allocator synchronises the
        device). The copy may write memory the compute stream freed but has not finished using:
        so it starts after the compute issued so far, which is when the schedule issues it (the
        start or end of an operation) or, for one that waited for memory, when an operation ends."""
        resized: list[Block] = []
        try:
            for block in blocks:
                if not block.moved:
                    continue
                if block.moved < block.nbytes and isinstance(block.ready, torch.cuda.Event):
                    # the regrowth copies the kept head on the compute stream: the offload's shrink
                    # wrote that head on its own stream, after the tail's copy
                    self.compute.wait_event(block.ready)
                block.storage.resize_(block.nbytes)
                resized.append(block)
        finally:
            issued = torch.cuda.Event()
            issued.record(self.compute)
            with torch.cuda.stream(self.h2d):
                self.h2d.wait_event(issued)
                for block in resized:
                    if isinstance(block.ready, torch.cuda.Event):
                        self.h2d.wait_event(block.ready)  # the offload must be over (duplex streams)
                start = self.clock.mark(self.h2d)
                for block in resized:
                    # no record_stream: the compute stream waits for this copy before the backward reads
                    # the block (or frees it), and the executor synchronises before it drops the store;
                    # marked, a freed block would wait for every prefetch queued behind this one
                    flat_bytes(block.storage)[block.nbytes - block.moved:].copy_(block.host, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self.h2d)
                self.clock.span(label, "h2d" if self.duplex else "copy", start, self.clock.mark(self.h2d))
            for block in resized:
                self.pool.give(block.host, done)
                self.moved_bytes += block.moved
                block.host, block.moved, block.ready = None, 0, done
        return done

    def wait(self, handle: Any) -> None:
        """Make the compute stream wait for a copy; the time it stands still is the stall."""
        if handle is None:
            return
        before = self.clock.mark(self.compute)
        self.compute.wait_event(handle)
        self._waits.append((before, self.clock.mark(self.compute)))

    def join(self) -> None:
        """Make the compute stream wait for every copy issued (the iteration ends with the last one)."""
        self.compute.wait_stream(self.d2h)
        if self.h2d is not self.d2h:
            self.compute.wait_stream(self.h2d)

    def synchronize(self) -> None:
        """Wait for every stream of the device."""
        torch.cuda.synchronize(self.device)

    def resolve(self) -> None:
        """Turn the recorded waits into stall seconds (after ``synchronize``)."""
        self.stall_s += sum(self.clock.between(a, b) for a, b in self._waits)
        self._waits.clear()
