"""Memory traces as allocators see them: integer lifetimes, sizes, CSV files.

An executor reports a trace as ``MemoryBlock``s alive on ``[alloc, free)`` with float
times. Allocators work on an :class:`IntTrace`: the same blocks with integer, half-open
lifetimes ``[lower, upper)``.

Time is counted as papers/003 section 4.1 counts it: a global integer ``y`` starts at
one and is increased after every allocation and every free, so each event gets its own
time and ``lower``/``upper`` are ranks of events. Events at the same float time are
ordered so that nothing overlaps that did not overlap before and nothing that overlapped
stops overlapping:

1. frees of blocks that were alive for a positive time (their half-open lifetime ends
   at that instant, so they must not collide with what is allocated then);
2. allocations, in trace order;
3. frees of zero-length blocks (``alloc == free``): a real allocation occupies memory
   for a moment, so such a block is kept alive over one event rather than dropped.

Hence a placement valid for the integer trace is valid for the float one.

Trace files use the CSV format of the public allocation benchmarks (MiniMalloc's and
idealloc's suites): a header ``id,lower,upper,size`` and one row per block with a
half-open lifetime; an ``offset`` column, when present, carries a solution. MiniMalloc's
older column names are accepted as its converter (``src/converter.cc``) accepts them
(``buffer``/``buffer_id`` for ``id``, ``start``/``begin`` for ``lower``, ``end`` for an
*inclusive* upper bound, read as ``end + 1``). Beware: the asplos2024 benchmark files
once shipped with a ``buffer,start,end,size`` header whose ``end`` was exclusive (the
same numbers now appear under ``id,lower,upper,size``, and only the half-open reading
fits their capacity); read such a file with ``end_inclusive=False``. The first line must
be the header, and every block needs its own id (a file with a duplicate id is refused).

A zero-length block in an integer trace (``lower == upper``, an empty half-open
lifetime) occupies no time: it holds no bytes in the max-live count, takes no part in a
placement and gets offset 0 (``membudget place`` hands the allocator only the other
blocks). Beware that :func:`to_memory_blocks` turns such a block into a float block with
``alloc == free``, which rule 3 above keeps alive over one event: drop them first.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np

from harness.model import MemoryBlock

__all__ = [
    "IntTrace",
    "TraceError",
    "to_int_trace",
    "as_int_trace",
    "to_memory_blocks",
    "blocks_from_events",
    "blocks_from_torch_snapshot",
    "inference_trace",
    "max_live_bytes",
    "live_bytes_profile",
    "read_csv",
    "write_csv",
    "read_csv_offsets",
]


class TraceError(ValueError):
    """A trace (or trace file) that does not describe valid blocks."""


@dataclass(frozen=True, eq=False)
class IntTrace:
    """Blocks with integer half-open lifetimes ``[lower[i], upper[i])`` and ``size[i]`` bytes.

    Index ``i`` is the block's position in the trace it came from, so an allocator's
    ``offsets[i]`` belongs to the i-th ``MemoryBlock`` it was given. ``ids`` names the
    blocks (the CSV ``id`` column, or ``MemoryBlock.id`` as text).
    """

    lower: np.ndarray
    upper: np.ndarray
    size: np.ndarray
    ids: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        lower = np.ascontiguousarray(self.lower, dtype=np.int64)
        upper = np.ascontiguousarray(self.upper, dtype=np.int64)
        size = np.ascontiguousarray(self.size, dtype=np.int64)
        if not (lower.shape == upper.shape == size.shape) or lower.ndim != 1:
            raise TraceError("lower, upper and size must be 1-D arrays of the same length")
        if len(size) and (size < 0).any():
            i = int(np.flatnonzero(size < 0)[0])
            raise TraceError(f"block {i}: size must be >= 0, got {int(size[i])}")
        if len(size) and (upper < lower).any():
            i = int(np.flatnonzero(upper < lower)[0])
            raise TraceError(f"block {i}: upper {int(upper[i])} < lower {int(lower[i])}")
        ids = tuple(self.ids) if self.ids else tuple(str(i) for i in range(len(size)))
        if len(ids) != len(size):
            raise TraceError(f"{len(ids)} ids for {len(size)} blocks")
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "ids", ids)

    def __len__(self) -> int:
        return len(self.size)

    @property
    def max_live_bytes(self) -> int:
        """The most bytes alive at any one time: a lower bound on any arena."""
        return max_live_bytes(self)

    @property
    def horizon(self) -> tuple[int, int]:
        """``(first lower, last upper)``; ``(0, 0)`` for an empty trace."""
        if not len(self):
            return (0, 0)
        return int(self.lower.min()), int(self.upper.max())

    def subset(self, indices: Sequence[int]) -> IntTrace:
        """The blocks at ``indices``, in that order."""
        idx = np.asarray(indices, dtype=np.int64)
        return IntTrace(self.lower[idx], self.upper[idx], self.size[idx], tuple(self.ids[i] for i in idx))

    def rows(self) -> list[tuple[str, int, int, int]]:
        """``(id, lower, upper, size)`` per block."""
        return [
            (self.ids[i], int(self.lower[i]), int(self.upper[i]), int(self.size[i])) for i in range(len(self))
        ]


# --------------------------------------------------------------------------- conversion


def to_int_trace(trace: Sequence[MemoryBlock]) -> IntTrace:
    """Convert float-time ``MemoryBlock``s to integer times as papers/003 section 4.1 counts them.

    ``y`` starts at 1 and is increased after each allocation and each free, so a trace of
    ``n`` blocks uses the times ``1 .. 2n``. Ties between events at the same float time
    follow the order in the module docstring. Blocks never freed (``free`` is ``inf``) are
    freed after every other event, in trace order.
    """
    n = len(trace)
    if n == 0:
        return IntTrace(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), ())
    alloc = np.fromiter((b.alloc for b in trace), dtype=np.float64, count=n)
    free = np.fromiter((b.free for b in trace), dtype=np.float64, count=n)
    size = np.fromiter((b.size for b in trace), dtype=np.int64, count=n)
    if np.isnan(alloc).any() or np.isnan(free).any():
        raise TraceError("alloc and free times must not be NaN")
    bad = np.flatnonzero(free < alloc)
    if len(bad):
        b = trace[int(bad[0])]
        raise TraceError(f"block {b.id} ({b.name}): free {b.free} < alloc {b.alloc}")
    # event keys: (time, class, index); class 0 = free of a positive-length block,
    # 1 = allocation, 2 = free of a zero-length block.
    idx = np.arange(n, dtype=np.int64)
    times = np.concatenate([alloc, free])
    classes = np.concatenate([np.ones(n, np.int64), np.where(free > alloc, 0, 2)])
    owners = np.concatenate([idx, idx])
    order = np.lexsort((owners, classes, times))  # last key is the primary one
    rank = np.empty(2 * n, dtype=np.int64)
    rank[order] = np.arange(1, 2 * n + 1, dtype=np.int64)
    ids = tuple(str(b.id) for b in trace)
    return IntTrace(rank[:n], rank[n:], size, ids)


def as_int_trace(trace: Union[IntTrace, Sequence[MemoryBlock]]) -> IntTrace:
    """``trace`` itself if it is an :class:`IntTrace`, else its conversion (:func:`to_int_trace`)."""
    if isinstance(trace, IntTrace):
        return trace
    return to_int_trace(trace)


FLOAT_EXACT = 2**53  # the integers a float holds exactly, and MemoryBlock's times are floats


def ranked_times(trace: IntTrace) -> IntTrace | None:
    """``trace`` with each time replaced by its rank among the trace's times, when some time is beyond
    what a float holds exactly (2**53: nanosecond timestamps are); None when every time fits.

    ``to_memory_blocks`` hands the times on as floats, and beyond 2**53 neighbouring times become one
    float: blocks one after the other would overlap. Ranks keep the order of every time, so the same
    blocks overlap, the max-live bytes are the same, and any placement of one is a placement of the other.
    """
    if not len(trace) or max(int(np.abs(trace.lower).max()), int(np.abs(trace.upper).max())) < FLOAT_EXACT:
        return None
    times = np.unique(np.concatenate([trace.lower, trace.upper]))
    return IntTrace(np.searchsorted(times, trace.lower), np.searchsorted(times, trace.upper), trace.size, trace.ids)


def to_memory_blocks(trace: IntTrace, names: Sequence[str] | None = None) -> tuple[MemoryBlock, ...]:
    """``MemoryBlock``s with the integer times as floats, so any allocator can place an ``IntTrace``.

    Block ids are the trace's ids where they are integers, else the position; the name is
    the id text (or ``names[i]``).
    """
    blocks = []
    for i in range(len(trace)):
        text = trace.ids[i]
        try:
            bid = int(text)
        except ValueError:
            bid = i
        blocks.append(
            MemoryBlock(
                id=bid,
                name=names[i] if names is not None else text,
                size=int(trace.size[i]),
                alloc=float(trace.lower[i]),
                free=float(trace.upper[i]),
            )
        )
    return tuple(blocks)


def blocks_from_events(events: Iterable[tuple[str, Any, int]]) -> tuple[MemoryBlock, ...]:
    """Blocks from a sequence of ``("alloc", key, size)`` / ``("free", key, _)`` events.

    This is the monitoring of papers/003 section 4.1: the time ``y`` starts at 1 and is
    increased after each event; block ids are given in the order of allocation (``lambda``).
    A key may be reused once freed. Blocks still alive at the end are freed after the last
    event, in allocation order.
    """
    y = 1
    live: dict[Any, int] = {}
    rows: list[list[Any]] = []  # [key, size, lower, upper]
    for kind, key, size in events:
        if kind == "alloc":
            if key in live:
                raise TraceError(f"allocation of {key!r}, which is already alive")
            live[key] = len(rows)
            rows.append([key, int(size), y, None])
        elif kind == "free":
            if key not in live:
                raise TraceError(f"free of {key!r}, which is not alive")
            rows[live.pop(key)][3] = y
        else:
            raise TraceError(f"unknown event kind {kind!r} (alloc or free)")
        y += 1
    for i in sorted(live.values()):
        rows[i][3] = y
        y += 1
    return tuple(
        MemoryBlock(id=i, name=str(key), size=size, alloc=float(lo), free=float(up))
        for i, (key, size, lo, up) in enumerate(rows)
    )


def blocks_from_torch_snapshot(snapshot: Mapping[str, Any], device: int = 0) -> tuple[MemoryBlock, ...]:
    """Blocks from a ``torch.cuda.memory._snapshot()`` taken with ``_record_memory_history``.

    Reads ``snapshot["device_traces"][device]``: ``alloc`` entries allocate the block at
    ``addr`` (``size`` bytes, the caching allocator's rounded size), ``free_completed``
    (or, when a trace has none, ``free_requested``) frees it. Segment events are ignored:
    the allocators under test decide the segments. Time is counted as in
    :func:`blocks_from_events`.
    """
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        return ()
    entries = traces[device]
    free_action = "free_completed" if any(e.get("action") == "free_completed" for e in entries) else "free_requested"
    events: list[tuple[str, Any, int]] = []
    live: set[int] = set()
    for entry in entries:
        action, addr = entry.get("action"), entry.get("addr")
        if action == "alloc":
            events.append(("alloc", addr, int(entry.get("size", 0))))
            live.add(addr)
        elif action == free_action and addr in live:
            events.append(("free", addr, 0))
            live.discard(addr)
    return blocks_from_events(events)


def inference_trace(profile: Any) -> tuple[MemoryBlock, ...]:
    """The memory trace of one forward-only pass (inference) of a chain ``Profile``.

    The weights live for the whole pass; stage i's input (``input_bytes``) is allocated
    when the operation producing it starts (the pass's start for stage 0) and freed when
    F_i ends; F_i's workspace lives while F_i runs; the last output (``output_bytes``) is
    allocated when the last stage starts and freed at the end. Times are the cumulative
    forward times (papers/003's "inference" traces; training traces come from the
    simulator's runs).
    """
    stages = profile.stages
    starts = [0.0]
    for st in stages:
        starts.append(starts[-1] + st.fwd_time)
    end = starts[-1]
    blocks: list[tuple[str, int, float, float]] = [("weights", profile.weight_bytes, 0.0, end)]
    for i, st in enumerate(stages):
        born = starts[i - 1] if i else 0.0
        blocks.append((f"x{i}", st.input_bytes, born, starts[i + 1]))
        blocks.append((f"wF{i}", st.fwd_workspace, starts[i], starts[i + 1]))
    blocks.append(("output", profile.output_bytes, starts[len(stages) - 1], end))
    return tuple(
        MemoryBlock(id=k, name=name, size=int(size), alloc=float(a), free=float(f))
        for k, (name, size, a, f) in enumerate(blocks)
        if size > 0
    )


# --------------------------------------------------------------------------- live bytes


def _alive(t: IntTrace) -> IntTrace:
    """``t`` without the blocks whose lifetime is empty (``lower == upper``): they hold nothing."""
    keep = t.upper > t.lower
    return t if keep.all() else t.subset(np.flatnonzero(keep))


def live_bytes_profile(trace: Union[IntTrace, Sequence[MemoryBlock]]) -> tuple[np.ndarray, np.ndarray]:
    """``(times, live)``: the bytes alive just after the events at each distinct time.

    Frees at a time are applied before allocations at that time (half-open lifetimes);
    blocks with an empty lifetime hold nothing.
    """
    t = _alive(as_int_trace(trace))
    if not len(t):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    times = np.concatenate([t.upper, t.lower])
    delta = np.concatenate([-t.size, t.size])
    order = np.lexsort((delta, times))  # frees (negative) first at equal times
    times, delta = times[order], delta[order]
    live = np.cumsum(delta)
    last = np.r_[times[1:] != times[:-1], True]
    return times[last], live[last]


def max_live_bytes(trace: Union[IntTrace, Sequence[MemoryBlock]]) -> int:
    """The most bytes alive at once (half-open lifetimes; an empty integer lifetime holds nothing, a float
    block with ``alloc == free`` is alive for one event: module docstring, rule 3); 0 for no blocks."""
    t = _alive(as_int_trace(trace))
    if not len(t):
        return 0
    times = np.concatenate([t.upper, t.lower])
    delta = np.concatenate([-t.size, t.size])
    order = np.lexsort((delta, times))
    return int(max(0, np.cumsum(delta[order]).max()))


# --------------------------------------------------------------------------- CSV

_ALIASES = {"buffer": "id", "buffer_id": "id", "start": "lower", "begin": "lower"}
_KNOWN_COLUMNS = {"id", "lower", "upper", "size", "offset", "alignment", "gaps", "end", *_ALIASES}


def _read_rows(source: Union[str, Path, io.TextIOBase]) -> tuple[list[str], list[list[str]], str]:
    if isinstance(source, io.TextIOBase):
        text, where = source.read(), "<stream>"
    else:
        path = Path(source)
        try:
            text, where = path.read_text(encoding="utf-8"), str(path)
        except UnicodeDecodeError as exc:
            raise TraceError(f"{path}: not a text trace file (not UTF-8: {exc.reason} at byte {exc.start})") from None
    text = text.removeprefix("\ufeff")  # a byte-order mark, as spreadsheets write one
    rows = [row for row in csv.reader(io.StringIO(text)) if row and any(cell.strip() for cell in row)]
    if not rows:
        raise TraceError(f"{where}: empty trace file (expected a header id,lower,upper,size)")
    return [cell.strip() for cell in rows[0]], rows[1:], where


# Every number of a trace file, and the sum of its sizes, stays below this, so that max-live,
# offsets and arenas fit the int64 arithmetic of the allocators with room to spare.
MAX_TRACE_VALUE = 2**62


def _parse(
    source: Union[str, Path, io.TextIOBase], end_inclusive: bool = True
) -> tuple[IntTrace, list[int] | None]:
    first, rows, where = _read_rows(source)
    header = [cell.lower() for cell in first]
    if not set(header) & _KNOWN_COLUMNS:
        if header and header[0].startswith(("{", "[")):
            raise TraceError(f"{where}: a JSON file, not a trace (CSV id,lower,upper,size); a profile's trace is "
                             "written by membudget simulate PROFILE --planner P --budget B --trace trace.csv")
        if {"suite", "case_id", "status"} <= set(header):
            raise TraceError(f"{where}: a run's rows.csv, not a trace (CSV id,lower,upper,size): membudget publish "
                             "and compare read its folder; a case's trace is written by membudget simulate PROFILE "
                             "--planner P --budget B --trace trace.csv")
        if where.lower().endswith((".yaml", ".yml")) or first[0].startswith("#"):
            raise TraceError(f"{where}: a suite (YAML), not a trace (CSV id,lower,upper,size): membudget run {where} "
                             "runs it")
        raise TraceError(f"{where}:1: the first line must be the header id,lower,upper,size, got "
                         f"{','.join(first)!r}")
    inclusive_end = "end" in header and end_inclusive
    names = [("upper" if h == "end" else _ALIASES.get(h, h)) for h in header]
    if len(set(names)) != len(names):
        raise TraceError(f"{where}: duplicate column names in header {header}")
    missing = [c for c in ("id", "lower", "upper", "size") if c not in names]
    if missing:
        raise TraceError(f"{where}: missing column(s) {', '.join(missing)} (header id,lower,upper,size)")
    col = {name: i for i, name in enumerate(names)}
    if "gaps" in col:
        raise TraceError(f"{where}: buffers with gaps are not supported")
    ids: list[str] = []
    lower: list[int] = []
    upper: list[int] = []
    size: list[int] = []
    offsets: list[int] | None = [] if "offset" in col else None
    first_line: dict[str, int] = {}
    for lineno, row in enumerate(rows, start=2):
        if len(row) != len(names):
            raise TraceError(f"{where}:{lineno}: {len(row)} fields, header has {len(names)}")
        value: dict[str, int] = {}
        column = "lower"
        try:
            for column in ("lower", "upper", "size", *(c for c in ("alignment", "offset") if c in col)):
                value[column] = int(row[col[column]].strip())
        except ValueError:
            raise TraceError(f"{where}:{lineno}: {column} {row[col[column]].strip()!r} is not a whole number "
                             "(integers only: times and bytes, no decimals or exponents)") from None
        lo, up, sz = value["lower"], value["upper"], value["size"]
        if sz < 0:
            raise TraceError(f"{where}:{lineno}: block {row[col['id']].strip()!r}: size {sz} is negative (bytes, >= 0)")
        if value.get("alignment", 1) not in (0, 1):
            raise TraceError(f"{where}:{lineno}: alignment other than 1 is not supported")
        if offsets is not None:
            offsets.append(value["offset"])
        block_id = row[col["id"]].strip()
        if block_id in first_line:
            raise TraceError(f"{where}:{lineno}: duplicate id {block_id!r} (first on line {first_line[block_id]}): "
                             f"every block needs its own id")
        first_line[block_id] = lineno
        end = up + 1 if inclusive_end else up  # half-open
        if end < lo:
            raise TraceError(f"{where}:{lineno}: block {block_id!r} ends before it starts (lower {lo}, "
                             f"{'end' if inclusive_end else 'upper'} {up})")
        ids.append(block_id)
        lower.append(lo)
        upper.append(end)
        size.append(sz)
    for name, values in (("lower", lower), ("upper", upper), ("offset", offsets or [])):
        far = next((k for k, v in enumerate(values) if abs(v) > MAX_TRACE_VALUE), None)
        if far is not None:
            raise TraceError(f"{where}:{far + 2}: {name} {values[far]} is too large (at most {MAX_TRACE_VALUE})")
    total = sum(size)  # Python ints: no overflow; offsets and the arena stay below this
    if total > MAX_TRACE_VALUE:
        raise TraceError(f"{where}: the blocks' sizes add up to {total} bytes, more than {MAX_TRACE_VALUE} "
                         "(2**62): too large to place")
    try:
        trace = IntTrace(np.array(lower, np.int64), np.array(upper, np.int64), np.array(size, np.int64), tuple(ids))
    except TraceError as exc:
        raise TraceError(f"{where}: {exc}") from None
    return trace, offsets


def read_csv(source: Union[str, Path, io.TextIOBase], *, end_inclusive: bool = True) -> IntTrace:
    """Read a trace file (``id,lower,upper,size``, half-open lifetimes) into an :class:`IntTrace`.

    ``end_inclusive`` only matters for a legacy ``end`` column (module docstring).
    """
    return _parse(source, end_inclusive)[0]


def read_csv_offsets(
    source: Union[str, Path, io.TextIOBase], *, end_inclusive: bool = True
) -> tuple[IntTrace, list[int] | None]:
    """Read a trace file and its ``offset`` column (None when the file has none)."""
    return _parse(source, end_inclusive)


def write_csv(
    trace: Union[IntTrace, Sequence[MemoryBlock]],
    dest: Union[str, Path, io.TextIOBase],
    offsets: Sequence[int] | None = None,
) -> None:
    """Write ``trace`` as ``id,lower,upper,size`` (plus ``offset`` when ``offsets`` is given).

    ``MemoryBlock`` traces are converted first (:func:`to_int_trace`).
    """
    t = as_int_trace(trace)
    if offsets is not None and len(offsets) != len(t):
        raise TraceError(f"{len(offsets)} offsets for {len(t)} blocks")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["id", "lower", "upper", "size"] + (["offset"] if offsets is not None else []))
    for i, row in enumerate(t.rows()):
        writer.writerow(list(row) + ([int(offsets[i])] if offsets is not None else []))
    if isinstance(dest, io.TextIOBase):
        dest.write(buf.getvalue())
    else:
        Path(dest).write_text(buf.getvalue())
