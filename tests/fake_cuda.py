"""The CUDA runtime's streams and events on the CPU, with a check of the order of every memory access.

The torch executor's CUDA path (``CudaCopies``, the waits and room rules of ``_Execution``) runs
only on a GPU, and a GPU is lent to few sessions: a fault there costs the one call a session
gets. ``FakeCuda`` runs that path on the CPU. It stands in for what the executor calls of
``torch.cuda`` (streams, events, synchronisation, the memory statistics, pinned host memory),
while every operation really runs, at once, on the CPU. Beside it, a dispatch mode notes which
stream each operation was issued on and which memory it reads and writes, and reports an access
that the streams' order does not put after an earlier conflicting one: a race on a GPU.

The order is the happens-before relation of streams and events, kept with vector clocks (the
method of PyTorch's CUDA Sanitizer, ``torch.cuda._sanitizer``, which needs a GPU: a stream's
operations are ordered; ``wait_event`` orders a stream after what an event recorded; a host
synchronisation orders everything issued after it). Memory is tracked by storage, not by view.
Two of the caching allocator's rules are checked as well:

- memory newly allocated on a stream may be memory that stream's earlier operations used and
  freed (the allocator hands it out at once, in stream order): so another stream that touches it
  must be ordered after the allocating stream's last operation (a prefetch's copy writing a block
  its compute stream just regrew);
- memory freed while another stream still uses it goes back to its stream's pool at once unless
  ``record_stream`` named that stream: so every use by another stream must be ordered before the
  free, or recorded (an offload's copy reading the storage its shrink frees).

A storage freed by its last reference going (not by ``UntypedStorage.resize_``) is seen at the next
operation, wait or synchronisation, and judged as of then. What it cannot see: the host's own reads
of pinned buffers; memory an operation grows in place (``Tensor.resize_``, ``out=`` arguments:
the executor's operations have none); buffers an operation updates without saying so in its schema
(batch norm's running statistics: read, for the check); and timing: every event is complete as soon
as it is recorded, or, with ``events_complete="when waited"``, only once the host waits for it, so
each mode checks one order of the copies, not all. The third mode, ``events_complete="in time"``,
times the streams (``FakeCuda``): the order its virtual clocks give is the one a GPU running every
operation in the profile's time would take.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

_FACTORY = re.compile(r"new_.*|.*_like")  # as torch.cuda._sanitizer has it
Clock = dict[int, int]  # stream id -> the last of its operations ordered before this point


@dataclass
class Access:
    """One operation's read or write of a storage."""

    stream: int
    seq: int
    op: str
    write: bool


@dataclass
class Memory:
    """What the check knows of one live storage: its stream, its last write, the reads since."""

    stream: int | None  # allocated on (None: before the check began)
    write: Access | None = None
    reads: list[Access] = field(default_factory=list)
    recorded: set[int] = field(default_factory=set)  # streams named by record_stream

    @property
    def owner(self) -> int:
        """The stream whose pool the memory returns to (memory from before the check: the compute stream's)."""
        return self.stream if self.stream is not None else 0


class StreamOrder:
    """Vector clocks of the streams and the host, and the accesses of every storage."""

    def __init__(self) -> None:
        self.clocks: dict[int, Clock] = {}
        self.host: Clock = {}
        self.seq = 0
        self.memory: dict[int, Memory] = {}
        self.races: list[str] = []
        self.names: dict[int, str] = {}
        # storages another stream than their own used: checked as freed once their last reference is gone
        self.watched: dict[int, tuple[StorageWeakRef, Memory]] = {}

    def add_stream(self, stream: int, name: str) -> None:
        self.host[stream] = 0
        self.clocks[stream] = dict(self.host)
        self.names[stream] = name

    def _after(self, stream: int, access: Access) -> bool:
        return access.stream == stream or access.seq <= self.clocks[stream].get(access.stream, -1)

    @staticmethod
    def _join(into: Clock, other: Clock) -> None:
        for s, n in other.items():
            into[s] = max(into.get(s, -1), n)

    # -- synchronisation (each looks first for storages freed since the last operation)
    def record(self, stream: int) -> Clock:
        """What an event recorded on ``stream`` now stands for."""
        return dict(self.clocks[stream])

    def wait(self, stream: int, clock: Clock) -> None:
        self.poll()
        self._join(self.clocks[stream], clock)

    def wait_stream(self, stream: int, other: int) -> None:
        self.poll()
        self._join(self.clocks[stream], self.clocks[other])

    def host_waits(self, clock: Clock) -> None:
        """The host knows ``clock``'s operations are over: all it issues next comes after them."""
        self.poll()
        self._join(self.host, clock)
        for c in self.clocks.values():
            self._join(c, self.host)

    def synchronize(self) -> None:
        for s, c in self.clocks.items():
            self.host[s] = max(self.host.get(s, -1), c[s])
        self.host_waits(self.host)

    # -- memory
    def _race(self, text: str) -> None:
        if len(self.races) < 20:
            self.races.append(text)

    def _conflict(self, key: int, access: Access, earlier: Access) -> None:
        self._race(f"{access.op} on {self.names[access.stream]} {'writes' if access.write else 'reads'} storage "
                   f"{key:#x}, unordered after {earlier.op} on {self.names[earlier.stream]} "
                   f"({'wrote' if earlier.write else 'read'} it)")

    def launch(self, stream: int, op: str, reads: set[int], writes: set[int], fresh: set[int],
               storages: dict[int, torch.UntypedStorage]) -> None:
        """An operation on ``stream``: ``fresh`` storages it allocated; ``storages``, those of its device
        memory (pinned host memory aside), watched for their free."""
        if fresh:  # memory freed since may be what it gets (between waits the verdict on a free is the same)
            self.poll()
        for key in fresh:
            self.allocate(key, stream)
        self.seq += 1
        self.clocks[stream][stream] = self.seq
        for key in reads - writes:
            access = Access(stream, self.seq, op, False)
            mem = self.memory.setdefault(key, Memory(None))
            if mem.write is not None and not self._after(stream, mem.write):
                self._conflict(key, access, mem.write)
            mem.reads.append(access)
        for key in writes:
            access = Access(stream, self.seq, op, True)
            mem = self.memory.setdefault(key, Memory(None))
            for earlier in (mem.reads or ([mem.write] if mem.write else [])):
                if not self._after(stream, earlier):
                    self._conflict(key, access, earlier)
            mem.write, mem.reads = access, []
        for key, storage in storages.items():
            mem = self.memory.get(key)
            if mem is not None and mem.owner != stream and key not in self.watched:
                self.watched[key] = (StorageWeakRef(storage), mem)

    def poll(self) -> None:
        """Storages freed since the last look by their last reference going (autograd releasing a
        prefetched block after its backward): the free rule applies to them, as of now."""
        for key, (ref, mem) in list(self.watched.items()):
            if ref.expired():
                del self.watched[key]
                if self.memory.get(key) is mem:
                    self.free(key, None, "the last reference dropped")

    def allocate(self, key: int, stream: int, host: bool = False) -> None:
        """New memory on ``stream``: for the allocator it may be what that stream's operations so
        far used (a write by the last one before this allocation), unless it is pinned host memory."""
        last = self.clocks[stream][stream]
        write = None if host or last <= 0 else Access(stream, last, "the allocator's reuse", True)
        self.memory[key] = Memory(None if host else stream, write)

    def record_stream(self, key: int, stream: int) -> None:
        self.memory.setdefault(key, Memory(None)).recorded.add(stream)

    def free(self, key: int, stream: int | None, op: str) -> None:
        """Memory freed (by ``op``, issued on ``stream``, or by the host): back in its own stream's pool at once."""
        mem = self.memory.pop(key, None)
        if mem is None:
            return
        owner = mem.owner
        for earlier in mem.reads + ([mem.write] if mem.write else []):
            if earlier.stream == owner or earlier.stream in mem.recorded:
                continue
            if not self._after(owner, earlier):
                by = f"{op} on {self.names[stream]}" if stream is not None else op
                self._race(f"{by} frees storage {key:#x} to {self.names[owner]}'s pool "
                           f"while {earlier.op} on {self.names[earlier.stream]} may still "
                           f"{'write' if earlier.write else 'read'} it (no record_stream)")


def _storage(t: torch.Tensor) -> tuple[int, torch.UntypedStorage] | None:
    """The key (address) and storage of ``t``'s memory; None when it has none."""
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    key = _key(s)
    return (key, s) if key else None


def _key(storage: torch.UntypedStorage) -> int:
    """A storage's address, 0 when it holds nothing."""
    return storage.data_ptr() if storage.nbytes() else 0


class FakeStream:
    """A CUDA stream: an identity for the order check; its operations run at once. ``t``: in timed
    mode, the virtual second its last operation issued ends."""

    def __init__(self, cuda: FakeCuda, name: str) -> None:
        self.cuda, self.cuda_stream = cuda, len(cuda.order.clocks)
        self.t = 0.0
        cuda.order.add_stream(self.cuda_stream, name)
        cuda.streams.append(self)

    def wait_event(self, event: FakeEvent) -> None:
        if not self.cuda.ignores(self, event):
            self.cuda.order.wait(self.cuda_stream, event.clock)
            if event.time is not None:
                self.t = max(self.t, event.time)

    def wait_stream(self, other: FakeStream) -> None:
        self.cuda.order.wait_stream(self.cuda_stream, other.cuda_stream)
        self.t = max(self.t, other.t)


class FakeEvent:
    """A CUDA event: the point of a stream it was recorded at, and the host time then (in timed
    mode, ``time``: the virtual second that point is reached)."""

    active: FakeCuda | None = None

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.cuda = FakeEvent.active
        self.clock: Clock = {}  # never recorded: waiting for it waits for nothing, as on CUDA
        self.stream: FakeStream | None = None
        self.at: float | None = None
        self.recorded_before = 0  # the device synchronisations before it was recorded
        self.waited = False
        self.time: float | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        self.stream = stream or self.cuda.current
        self.clock = self.cuda.order.record(self.stream.cuda_stream)
        self.at, self.recorded_before, self.waited = time.perf_counter(), self.cuda.syncs, False
        self.time = self.cuda.issue(self.stream)

    def synchronize(self) -> None:
        self.cuda.order.host_waits(self.clock)
        self.waited = True
        if self.time is not None:
            self.cuda.host_t = max(self.cuda.host_t, self.time)

    def query(self) -> bool:
        if self.cuda.events_complete == "in time":
            done = self.time is None or self.time <= self.cuda.host_t
        else:
            done = (self.cuda.events_complete == "at once" or self.waited
                    or self.cuda.syncs > self.recorded_before)
        if done:
            self.synchronize()  # the host saw it complete: what it issues next comes after
        return done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None, "elapsed_time of an event never recorded"
        if self.cuda.events_complete == "in time":
            return (end.time - self.time) * 1e3
        return (end.at - self.at) * 1e3


class _Check(TorchDispatchMode):
    """Every operation: its stream, the storages it reads, writes and allocates."""

    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__()
        self.cuda = cuda

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        inputs: dict[int, torch.UntypedStorage] = {}
        reads: set[int] = set()
        writes: set[int] = set()
        factory = _FACTORY.fullmatch(schema.name.split("::")[-1]) is not None  # reads its inputs' shapes only
        named = list(zip(schema.arguments, args)) + [(a, kwargs[a.name]) for a in schema.arguments if a.name in kwargs]
        for argument, value in named:
            alias = argument.alias_info
            for t in pytree.tree_leaves(value):
                if isinstance(t, (torch.UntypedStorage, torch.TypedStorage)):
                    storage = t if isinstance(t, torch.UntypedStorage) else t.untyped_storage()
                    if key := _key(storage):
                        inputs[key] = storage  # set_'s source: an alias, not a read
                    continue
                if not isinstance(t, torch.Tensor) or (found := _storage(t)) is None:
                    continue
                key, storage = found
                inputs[key] = storage
                if alias is not None and alias.is_write:
                    writes.add(key)
                elif alias is None and not factory:
                    reads.add(key)
        out = func(*args, **kwargs)
        fresh: set[int] = set()
        device = {k: s for k, s in inputs.items() if not self.cuda.is_host(k)}
        aliased = any(r.alias_info is not None for r in schema.returns)
        for t in pytree.tree_leaves(out):
            if aliased or not isinstance(t, torch.Tensor) or (found := _storage(t)) is None or found[0] in inputs:
                continue
            key, storage = found
            fresh.add(key)
            writes.add(key)
            if not self.cuda.pinning:
                held = self.cuda.refuse(int(storage.nbytes()))  # after the fact: the tensor is dropped
                self.cuda.note_allocation(key, storage, held)
                device[key] = storage
        self.cuda.issue(self.cuda.current, self.cuda.link_seconds(func, args))
        self.cuda.order.launch(self.cuda.current.cuda_stream, str(func), reads, writes, fresh, device)
        return out


class FakeCuda:
    """``torch.cuda`` on the CPU, for as long as ``install`` is active (a pytest ``monkeypatch``).

    ``events_complete``: "at once" (every copy is over as soon as it is issued: the executor never
    waits for memory), "when waited" (an event is complete only once the host synchronised with
    it: the executor's waits for offloads to free their memory all run), or "in time" (timed
    mode: ``link_bps``, the host link's (device-to-host, host-to-device) bytes per second, is
    required). ``ignore_wait``: a predicate (stream, event) naming waits to leave out, and
    ``ignore_record_stream``, to leave out every ``record_stream``: faults, to show that the check
    sees them.

    Timed mode is a GPU with an infinitely fast host: every stream has a virtual clock; an
    operation starts once its stream's previous one is over and the host has issued it (the host's
    clock moves only when it waits: an event's or the device's synchronisation); a copy between
    pinned host memory and the device takes its bytes over the link's rate, the compute an
    operation is ``charge``d with takes that long, every other operation no time; an event is
    complete once the host's clock has reached the time its stream reached it; ``elapsed_time``
    is in virtual time. So the executor's own clock measures how long its order of issue and
    waits would take on a device that ran every operation in the profile's time.
    """

    TOTAL = 64 << 30

    def __init__(self, events_complete: str = "at once",
                 ignore_wait: Callable[[FakeStream, FakeEvent], bool] | None = None,
                 ignore_record_stream: bool = False,
                 link_bps: tuple[float, float] | None = None) -> None:
        assert events_complete in ("at once", "when waited", "in time"), events_complete
        assert (events_complete == "in time") == (link_bps is not None), "timed mode, and only it, needs link_bps"
        self.events_complete = events_complete
        self.ignore_wait, self.ignore_record_stream = ignore_wait, ignore_record_stream
        self.link_bps = link_bps
        self.host_t = 0.0  # timed mode: the host's virtual clock
        self.streams: list[FakeStream] = []
        self.order = StreamOrder()
        self.current = FakeStream(self, "the compute stream")
        self._host: dict[int, StorageWeakRef] = {}
        self._device: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0
        self.fraction = 1.0
        self.syncs = 0
        self.pinning = False  # a pinned host buffer is being allocated

    @property
    def races(self) -> list[str]:
        """The unordered accesses seen, in words (at most 20)."""
        return self.order.races

    def ignores(self, stream: FakeStream, event: FakeEvent) -> bool:
        return self.ignore_wait is not None and self.ignore_wait(stream, event)

    # -- timed mode
    def issue(self, stream: FakeStream, seconds: float = 0.0) -> float:
        """An operation of ``seconds`` issued on ``stream`` now: the virtual second it ends."""
        stream.t = max(stream.t, self.host_t) + seconds
        return stream.t

    def charge(self, seconds: float) -> None:
        """Compute of ``seconds`` on the current stream (timed mode: the profile's time of an operation)."""
        self.issue(self.current, seconds)

    def link_seconds(self, func: Any, args: tuple) -> float:
        """Timed mode: the seconds of a copy between pinned host memory and the device over the link;
        0 for any other operation."""
        if self.link_bps is None or func is not torch.ops.aten.copy_.default:
            return 0.0
        dst, src = args[0], args[1]
        found_dst, found_src = _storage(dst), _storage(src)
        to_host = found_dst is not None and self.is_host(found_dst[0])
        from_host = found_src is not None and self.is_host(found_src[0])
        if to_host == from_host:
            return 0.0
        return dst.numel() * dst.element_size() / self.link_bps[0 if to_host else 1]

    # -- memory
    def is_host(self, key: int) -> bool:
        """Whether the storage at ``key`` is pinned host memory."""
        ref = self._host.get(key)
        return ref is not None and not ref.expired()

    def note_allocation(self, key: int, storage: torch.UntypedStorage, held: int) -> None:
        """A new device storage, allocated while ``held`` bytes were (``refuse``'s answer just before)."""
        nbytes = int(storage.nbytes())
        self._device[key] = (StorageWeakRef(storage), nbytes)
        self.peak = max(self.peak, held + nbytes)

    def refuse(self, nbytes: int) -> int:
        """The bytes allocated now; torch's out-of-memory error where ``nbytes`` more would pass the memory
        fraction's cap."""
        held = self.allocated()
        if nbytes > 0 and held + nbytes > self.fraction * self.TOTAL:
            raise torch.OutOfMemoryError(
                f"FakeCuda out of memory: {nbytes} bytes asked, {held} allocated, "
                f"cap {int(self.fraction * self.TOTAL)}")
        return held

    def forget(self, key: int) -> None:
        """The storage at ``key`` was freed (a resize moved it)."""
        self._device.pop(key, None)

    def allocated(self) -> int:
        """The bytes of the live storages allocated under the check (pinned host memory is not noted)."""
        for key in [k for k, (ref, _) in self._device.items() if ref.expired()]:
            del self._device[key]
        return sum(n for _, n in self._device.values())

    @contextlib.contextmanager
    def _pinned_allocation(self) -> Iterator[None]:
        before, self.pinning = self.pinning, True
        try:
            yield
        finally:
            self.pinning = before

    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        """``t``, noted as pinned host memory (outside the device's statistics and cap)."""
        if (found := _storage(t)) is not None:
            self._host[found[0]] = StorageWeakRef(found[1])
            self.order.allocate(found[0], self.current.cuda_stream, host=True)
        return t

    def _pin(self, t: torch.Tensor) -> torch.Tensor:
        with self._pinned_allocation():
            return self.pinned(t.clone())

    # -- the stand-ins
    def _stream(self, device: Any = None, priority: int = 0) -> FakeStream:
        return FakeStream(self, f"side stream {len(self.order.clocks)}")

    @contextlib.contextmanager
    def _use(self, stream: FakeStream | None) -> Iterator[None]:
        before, self.current = self.current, stream or self.current
        try:
            yield
        finally:
            self.current = before

    def _resize(self, original: Callable) -> Callable:
        cuda = self

        def resize_(storage: torch.UntypedStorage, nbytes: int) -> torch.UntypedStorage:
            # the new block is allocated while the old one is still held (one of the same size, which
            # torch's CPU resize also makes, is noted but not checked against the cap)
            held = cuda.refuse(nbytes) if nbytes != int(storage.nbytes()) else cuda.allocated()
            old = _key(storage)
            original(storage, nbytes)
            new = _key(storage)
            stream = cuda.current.cuda_stream
            reads = {old} if old and new else set()
            fresh = {new} if new and new != old else set()
            if fresh:
                cuda.note_allocation(new, storage, held)
            writes = fresh if reads else set()  # a regrowth from nothing copies nothing: only allocates
            cuda.order.launch(stream, "UntypedStorage.resize_", reads, writes, fresh, {new: storage} if new else {})
            if old and old != new:
                cuda.forget(old)
                cuda.order.free(old, stream, "UntypedStorage.resize_")
            return storage

        return resize_

    def _record_stream(self, t: torch.Tensor, stream: FakeStream) -> None:
        if (found := _storage(t)) is not None and not self.ignore_record_stream:
            self.order.record_stream(found[0], stream.cuda_stream)

    def _empty(self, original: Callable) -> Callable:
        def empty(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
            if not pin_memory:
                return original(*args, **kwargs)
            with self._pinned_allocation():
                return self.pinned(original(*args, **kwargs))

        return empty

    def install(self, monkeypatch: Any) -> FakeCuda:
        """Patch ``torch.cuda`` and the few tensor methods the executor's CUDA path calls."""
        cuda, mp = self, monkeypatch
        mp.setattr(FakeEvent, "active", self)
        mp.setattr(torch.cuda, "Event", FakeEvent)
        mp.setattr(torch.cuda, "Stream", self._stream)
        mp.setattr(torch.cuda, "current_stream", lambda device=None: cuda.current)
        mp.setattr(torch.cuda, "stream", self._use)
        mp.setattr(torch.cuda, "synchronize", lambda device=None: cuda._synchronize())
        mp.setattr(torch.cuda, "empty_cache", lambda: None)
        mp.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: cuda._reset_peak())
        mp.setattr(torch.cuda, "memory_allocated", lambda device=None: cuda.allocated())
        mp.setattr(torch.cuda, "max_memory_allocated", lambda device=None: cuda.peak)
        mp.setattr(torch.cuda, "max_memory_reserved", lambda device=None: cuda.peak)
        mp.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, device=None: setattr(cuda, "fraction", f))
        mp.setattr(torch.cuda, "get_device_properties", lambda device=None: _Properties(cuda.TOTAL))
        mp.setattr(torch.cuda, "get_device_name", lambda device=None: "FakeCuda")
        mp.setattr(torch.cuda.memory, "_set_allocator_settings", lambda settings: None)
        mp.setattr(torch.UntypedStorage, "resize_", self._resize(torch.UntypedStorage.resize_))
        mp.setattr(torch.Tensor, "record_stream", lambda t, stream: cuda._record_stream(t, stream))
        mp.setattr(torch.Tensor, "pin_memory", lambda t, device=None: cuda._pin(t))
        mp.setattr(torch, "empty", self._empty(torch.empty))
        return self

    @contextlib.contextmanager
    def checking(self) -> Iterator[FakeCuda]:
        """Note every operation's accesses while the block runs."""
        with _Check(self):
            yield self

    def _synchronize(self) -> None:
        self.order.synchronize()
        self.syncs += 1  # every event recorded so far is complete
        self.host_t = max([self.host_t] + [s.t for s in self.streams])

    def _reset_peak(self) -> None:
        self.peak = self.allocated()


@dataclass
class _Properties:
    total_memory: int
