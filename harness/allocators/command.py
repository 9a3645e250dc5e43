"""``membudget place TRACE.csv --allocator NAME [--json]``: place a trace file and report.

Reads a trace in the benchmark CSV format (``id,lower,upper,size``, half-open
lifetimes; see :mod:`harness.allocators.trace`), places it with a registered allocator,
validates the placement and prints the arena, the max-live bytes, their ratio and the
placement time; with ``--json`` the same content as one JSON object on stdout.

``--option KEY=VALUE`` (repeatable, values read as YAML like ``membudget plan --option``)
passes options to the allocator's ``place(trace, **options)``. An allocator takes the
options its ``place`` names as keyword parameters, or those listed in an ``options``
attribute when ``place`` takes ``**options``; any other name is an error that lists them.
When the allocator reports a lower bound (``Placement.lower_bound_bytes``) the report
gives it and the gap; ``optimal`` says whether the arena is proved minimal.
"""

from __future__ import annotations

import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from harness.allocators.trace import as_int_trace, read_csv, to_memory_blocks, write_csv
from harness.allocators.validate import violations
from harness.errors import UnknownOption

__all__ = ["place_command", "place_trace_file", "allocator_options", "check_allocator_options"]


def allocator_options(alloc: Any) -> tuple[str, ...]:
    """The option names ``alloc.place`` takes besides the trace (``()``: none)."""
    params = list(inspect.signature(alloc.place).parameters.values())[1:]
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if any(p.kind == p.VAR_KEYWORD for p in params):
        named += list(getattr(alloc, "options", ()) or ())
    return tuple(dict.fromkeys(named))


def check_allocator_options(name: str, alloc: Any, options: dict[str, Any]) -> None:
    """``UnknownOption`` naming what ``alloc.place`` takes when ``options`` has a name it does not."""
    known = allocator_options(alloc)
    unknown = sorted(set(options) - set(known))
    if unknown:
        takes = f"its options: {', '.join(known)}" if known else "it takes no options"
        raise UnknownOption(f"allocator {name!r} has no option {', '.join(map(repr, unknown))}; {takes}")


def place_trace_file(trace_csv: str | Path, allocator: str, *, registry: Any = None,
                     options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Place the trace in ``trace_csv`` with the allocator registered as ``allocator``.

    Returns the report as a dict: ``trace, allocator, options, blocks, max_live_bytes,
    arena_bytes, fragmentation, optimal, lower_bound_bytes, gap, place_time_s, valid,
    violations, notes, offsets`` (``lower_bound_bytes``/``gap``: None when the allocator
    reports no bound). ``options`` go to ``place`` (:func:`allocator_options`). The
    allocator gets the blocks with their integer times as floats (so the CSV's lifetimes
    are kept exactly), less the zero-length blocks (``lower == upper``), which occupy no
    time and get offset 0; ``place_time_s`` excludes a warm-up call on one block (imports,
    Numba compilation), as docs/architecture.md ("Planning kernels") asks of reported times.
    """
    if registry is None:
        from harness.plugins import registry as get_registry

        registry = get_registry()
    alloc = registry.allocator(allocator)
    options = dict(options or {})
    if options:
        check_allocator_options(allocator, alloc, options)
    trace = read_csv(trace_csv)
    timed = np.flatnonzero(trace.upper > trace.lower)  # zero-length blocks occupy no time: offset 0
    blocks = to_memory_blocks(trace.subset(timed))
    try:
        if blocks:  # warm up (imports, JIT compilation or its cache) outside the timing
            alloc.place(blocks[:1], **options)
        started = time.perf_counter()
        placement = alloc.place(blocks, **options)
    except (TypeError, ValueError) as exc:
        if not options:
            raise
        raise UnknownOption(f"allocator {allocator!r} with options {options}: {exc}") from None
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
        "lower_bound_bytes": getattr(placement, "lower_bound_bytes", None),
        "gap": getattr(placement, "gap", None),
        "options": options,
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
    options: dict[str, Any] | None = None,
) -> int:
    """Run ``membudget place``: print the report (text or JSON) and return the exit status.

    The status is 0 for a valid placement and 1 for an invalid one. ``output``, when given,
    receives the trace with an ``offset`` column (MiniMalloc's solution format).
    """
    out = stream or sys.stdout
    report = place_trace_file(trace_csv, allocator, registry=registry, options=options)
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
        ]
        if report["lower_bound_bytes"] is not None:
            lines.append(f"lower bound    {report['lower_bound_bytes']} (gap {100 * report['gap']:.3f}%)")
        lines += [
            f"place time     {report['place_time_s']:.4f} s",
            f"valid          {'yes' if report['valid'] else 'NO'}",
        ]
        if report["notes"]:
            lines.append(f"notes          {report['notes']}")
        lines.extend(f"  violation: {msg}" for msg in report["violations"])
        out.write("\n".join(lines) + "\n")
    return 0 if report["valid"] else 1
