"""``membudget place TRACE.csv --allocator NAME [--json]``: place a trace file and report.

Reads a trace in the benchmark CSV format (``id,lower,upper,size``, half-open
lifetimes; see :mod:`harness.allocators.trace`), places it with a registered allocator,
validates the placement and prints the arena, the max-live bytes, their ratio and the
placement time; with ``--json`` the same content as one JSON object on stdout.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from harness.allocators.trace import as_int_trace, read_csv, to_memory_blocks, write_csv
from harness.allocators.validate import violations

__all__ = ["place_command", "place_trace_file"]


def place_trace_file(trace_csv: str | Path, allocator: str, *, registry: Any = None) -> dict[str, Any]:
    """Place the trace in ``trace_csv`` with the allocator registered as ``allocator``.

    Returns the report as a dict: ``trace, allocator, blocks, max_live_bytes, arena_bytes,
    fragmentation, optimal, place_time_s, valid, violations, notes, offsets``. The
    allocator gets the blocks with their integer times as floats (so the CSV's lifetimes
    are kept exactly), less the zero-length blocks (``lower == upper``), which occupy no
    time and get offset 0; ``place_time_s`` excludes a warm-up call on one block (imports,
    Numba compilation), as docs/architecture.md ("Planning kernels") asks of reported times.
    """
    if registry is None:
        from harness.plugins import registry as get_registry

        registry = get_registry()
    alloc = registry.allocator(allocator)
    trace = read_csv(trace_csv)
    timed = np.flatnonzero(trace.upper > trace.lower)  # zero-length blocks occupy no time: offset 0
    blocks = to_memory_blocks(trace.subset(timed))
    if blocks:  # warm up (imports, JIT compilation or its cache) outside the timing
        alloc.place(blocks[:1])
    started = time.perf_counter()
    placement = alloc.place(blocks)
    elapsed = time.perf_counter() - started
    problems = violations(as_int_trace(blocks), placement)  # judged on the times the allocator saw
    offsets = np.zeros(len(trace), np.int64)
    offsets[timed] = placement.offsets
    notes = [placement.notes] if placement.notes else []
    if len(timed) < len(trace):
        notes.append(f"{len(trace) - len(timed)} zero-length block(s) (lower == upper) occupy nothing: offset 0")
    return {
        "trace": str(trace_csv),
        "allocator": allocator,
        "blocks": len(trace),
        "max_live_bytes": placement.max_live_bytes,
        "arena_bytes": placement.arena_bytes,
        "fragmentation": placement.fragmentation,
        "optimal": placement.optimal,
        "place_time_s": elapsed,
        "valid": not problems,
        "violations": [v.message for v in problems[:20]],
        "notes": "; ".join(notes),
        "offsets": [int(x) for x in offsets],
    }


def place_command(
    trace_csv: str | Path,
    allocator: str,
    as_json: bool = False,
    *,
    output: str | Path | None = None,
    registry: Any = None,
    stream: TextIO | None = None,
) -> int:
    """Run ``membudget place``: print the report (text or JSON) and return the exit status.

    The status is 0 for a valid placement and 1 for an invalid one. ``output``, when given,
    receives the trace with an ``offset`` column (MiniMalloc's solution format).
    """
    out = stream or sys.stdout
    report = place_trace_file(trace_csv, allocator, registry=registry)
    if output is not None:
        write_csv(read_csv(trace_csv), output, offsets=report["offsets"])
    if as_json:
        out.write(json.dumps(report) + "\n")
    else:
        opt = {True: "yes", False: "no", None: "-"}[report["optimal"]]
        lines = [
            f"trace          {report['trace']} ({report['blocks']} blocks)",
            f"allocator      {report['allocator']}",
            f"max-live bytes {report['max_live_bytes']}",
            f"arena bytes    {report['arena_bytes']}",
            f"fragmentation  {report['fragmentation']:.4f}",
            f"optimal        {opt}",
            f"place time     {report['place_time_s']:.4f} s",
            f"valid          {'yes' if report['valid'] else 'NO'}",
        ]
        if report["notes"]:
            lines.append(f"notes          {report['notes']}")
        lines.extend(f"  violation: {msg}" for msg in report["violations"])
        out.write("\n".join(lines) + "\n")
    return 0 if report["valid"] else 1
