"""The work behind ``membudget profile`` and ``membudget place``: what a command does
once ``harness.cli`` has read its arguments, for callers (tests, notebooks) that want
the result rather than the printout.

These functions look objects up in the registry (a profiler, a model factory, an
allocator), so they sit above it, with the runner and the CLI; the profilers and
allocators they call stay below it (docs/architecture.md, "The stack").

- ``default_input_size(model)``: the input size a model's factory suggests;
- ``profile_command(...)``: profile a workload and save the ``Profile``;
- ``place_trace_file(...)`` / ``place_command(...)``: place a trace CSV with an
  allocator and report (``membudget place TRACE.csv --allocator NAME [--json]``).

``membudget place`` reads a trace in the benchmark CSV format (``id,lower,upper,size``,
half-open lifetimes; see :mod:`harness.allocators.trace`), places it with a registered
allocator, validates the placement and prints the arena, the max-live bytes, their ratio
and the placement time; with ``--json`` the same content as one JSON object on stdout.
``--option KEY=VALUE`` (repeatable, values read as YAML like ``membudget plan --option``)
passes options to the allocator's ``place(trace, **options)``
(:mod:`harness.allocators.options`). When the allocator reports a lower bound
(``Placement.lower_bound_bytes``) the report gives it and the gap; ``optimal`` says
whether the arena is proved minimal.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence, TextIO

import numpy as np

from harness.allocators.options import check_allocator_options
from harness.allocators.trace import (IntTrace, as_int_trace, max_live_bytes, ranked_times, read_csv,
                                      to_memory_blocks, write_csv)
from harness.allocators.validate import placement_refusal, violations
from harness.errors import MembudgetError, ProfilingError, UnknownOption
from harness.jit_time import stopwatch
from harness.lazy import resolve
from harness.model import MemoryBlock, Placement, Profile, save
from harness.plugins import registry as get_registry
from harness.profilers.devices import DEFAULT_DEVICE
from harness.protocols import Workload

__all__ = ["DEFAULT_INPUT_SIZE", "default_input_size", "profile_command", "place_trace_file", "place_command"]

DEFAULT_INPUT_SIZE = (3, 224, 224)


def default_input_size(model: str, registry: Any = None) -> tuple[int, ...]:
    """The input size the model's factory suggests (``DEFAULT_INPUT_SIZE`` when it says nothing;
    ``()`` for a profile file, which carries its own). ``UnknownPlugin`` when no factory has
    the model."""
    if model.startswith("file:") or model.endswith(".json"):
        return ()
    factory = (get_registry() if registry is None else registry).model_factory(model)
    suggest = getattr(factory, "default_input_size", None)
    return tuple(suggest(model)) if callable(suggest) else DEFAULT_INPUT_SIZE


def profile_command(
    model: str,
    profiler: str = "analytic",
    device: str = DEFAULT_DEVICE,
    batch: int = 32,
    input_size: Sequence[int] | None = None,
    output: str | Path | None = None,
    dtype: str = "float32",
    **options: Any,
) -> Profile:
    """``membudget profile MODEL --profiler P --device D --batch N -o p.json``: profile and save.

    ``options`` configure the profiler (e.g. ``repeats=10`` or ``variant_batches=(8, 16)``
    for ``torch``); without them the registered instance is used. Returns the ``Profile``;
    with ``output`` it is also written there as JSON.
    """
    chosen = resolve(get_registry().profiler(profiler))
    if options:
        try:
            chosen = replace(chosen, **options)
        except TypeError as exc:
            raise ProfilingError(f"profiler {profiler!r} does not take these options: {exc}") from None
    size = tuple(input_size) if input_size else default_input_size(model)
    workload = Workload(model=model, batch_size=int(batch), input_size=size, device=device, dtype=dtype)
    try:
        profile = chosen.profile(workload)
    except ProfilingError as exc:
        own = default_input_size(model)
        if input_size and own and tuple(input_size) != own and "failed while running" in str(exc):
            raise ProfilingError(f"{exc} (the model's own input size is {'x'.join(map(str, own))}: is "
                                 "--input-size right for it?)") from None
        raise
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        save(profile, output)
    return profile


def place_trace_file(trace_csv: str | Path, allocator: str, *, registry: Any = None,
                     options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Place the trace in ``trace_csv`` with the allocator registered as ``allocator``.

    Returns the report as a dict: ``trace, allocator, options, blocks, max_live_bytes,
    arena_bytes, fragmentation, optimal, lower_bound_bytes, gap, place_time_s, valid,
    violations, notes, offsets, interrupted``. ``lower_bound_bytes`` is the larger of the
    allocator's proved bound and the max-live bytes (a bound on any arena); ``gap`` is
    ``(arena - lower bound) / arena``, how far from the optimum the arena is at most; an arena
    at its lower bound is proved ``optimal`` whatever the allocator says. ``options`` go to
    ``place`` (:func:`allocator_options`). The allocator gets the blocks with their integer
    times as floats (so the CSV's lifetimes are kept exactly; times beyond 2**53, which a float
    cannot hold, by their ranks: ``ranked_times``), less the zero-length blocks (``lower ==
    upper``), which occupy no time and get offset 0; ``place_time_s`` excludes a warm-up call on
    one block (imports, Numba compilation) and the time Numba spends compiling in the placement itself
    (``harness.jit_time``), as docs/architecture.md ("Planning kernels") asks of reported times.

    Interrupted (Ctrl-C, SIGTERM), an allocator may leave the best placement it had on the
    ``KeyboardInterrupt`` as its ``placement`` attribute (``harness.protocols.Allocator``); the
    exception then goes on with this report, ``interrupted`` true, as its ``report``.
    """
    alloc = (get_registry() if registry is None else registry).allocator(allocator)
    options = dict(options or {})
    if options:
        check_allocator_options(allocator, alloc, options)
    trace = read_csv(trace_csv)
    timed = np.flatnonzero(trace.upper > trace.lower)  # zero-length blocks occupy no time: offset 0
    occupied = trace.subset(timed)
    ranked = ranked_times(occupied)
    blocks = to_memory_blocks(occupied if ranked is None else ranked)
    try:
        # warm up (imports, Numba's kernels) outside the timing, on one block of the trace's (its time is
        # the report's only if it is interrupted); a kernel the one block does not reach is compiled in
        # the placement, and the stopwatch leaves it out
        with stopwatch() as watch:
            alloc.place(blocks[:1] or (MemoryBlock(id=0, name="warm-up", size=1, alloc=0.0, free=1.0),), **options)
        with stopwatch() as watch:
            placement = alloc.place(blocks, **options)
    except KeyboardInterrupt as exc:
        best = getattr(exc, "placement", None)
        if isinstance(best, Placement) and len(best.offsets) == len(blocks):
            exc.report = _placement_report(trace_csv, allocator, options, trace, timed, ranked, blocks, best,
                                           watch.seconds, interrupted=True)
        raise
    except BaseException as exc:  # the allocator's failure, sys.exit too: one line, not a traceback
        if options and isinstance(exc, (TypeError, ValueError)):
            raise UnknownOption(f"allocator {allocator!r} with options {options}: {exc}") from None
        from harness.case import classify  # re-raises an interrupt that a compiled kernel wrapped

        raise MembudgetError(f"allocator {allocator!r} failed: {classify(exc)[1]}") from None
    if not isinstance(placement, Placement) or len(placement.offsets) != len(blocks):
        refusal = placement_refusal(blocks, placement)  # a report needs one offset per block
        raise MembudgetError(f"allocator {allocator!r} {refusal}")
    return _placement_report(trace_csv, allocator, options, trace, timed, ranked, blocks, placement,
                             watch.seconds)


def _placement_report(trace_csv: str | Path, allocator: str, options: dict[str, Any], trace: IntTrace,
                      timed: np.ndarray, ranked: IntTrace | None, blocks: Sequence[MemoryBlock],
                      placement: Placement, elapsed: float, interrupted: bool = False) -> dict[str, Any]:
    """``place_trace_file``'s report of ``placement``, judged by the core: its validity, its arena against
    the max-live bytes and the allocator's bound."""
    placed = as_int_trace(blocks)  # the times the allocator saw
    problems = violations(placed, placement)
    offsets = np.zeros(len(trace), np.int64)
    offsets[timed] = placement.offsets
    live = max_live_bytes(placed)
    arena = placement.arena_bytes
    # an allocator that proved its arena optimal without giving its bound proved the arena the bound
    bound = max(live, placement.lower_bound_bytes or 0, arena if placement.optimal and not problems else 0)
    # proved by the allocator, or by the arena at a lower bound; else what the allocator says (None: nothing)
    optimal = False if problems else True if placement.optimal or arena <= bound else placement.optimal
    notes = [f"interrupted after {elapsed:.2f} s: the best placement found so far"] if interrupted else []
    notes += [placement.notes] if placement.notes else []
    if optimal and not placement.optimal:
        notes.append("proved optimal by its arena, the lower bound")
    if len(timed) < len(trace):
        notes.append(f"{len(trace) - len(timed)} zero-length block(s) (lower == upper) occupy nothing: offset 0")
    if ranked is not None:
        notes.append("times beyond 2**53 were placed by their ranks (the same overlaps; a float cannot hold them)")
    return {
        "trace": str(trace_csv),
        "allocator": allocator,
        "blocks": len(trace),
        "max_live_bytes": live,
        "arena_bytes": arena,
        "fragmentation": arena / live if live else 1.0,
        "optimal": optimal,
        "lower_bound_bytes": bound,
        "gap": 0.0 if optimal or not arena else (arena - bound) / arena if not problems else None,
        "options": options,
        "place_time_s": elapsed,
        "valid": not problems,
        "violations": [v.message for v in problems[:20]],
        "notes": "; ".join(notes),
        "offsets": [int(x) for x in offsets],
        "interrupted": interrupted,
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
    receives the trace with an ``offset`` column (MiniMalloc's solution format). Interrupted, it
    prints and writes the best placement the allocator left (``place_trace_file``), if any, and
    the interrupt goes on.
    """
    out = stream or sys.stdout
    interrupt = None
    try:
        report = place_trace_file(trace_csv, allocator, registry=registry, options=options)
    except KeyboardInterrupt as exc:  # the best placement found so far, when the allocator left one
        report, interrupt = getattr(exc, "report", None), exc
        if report is None:
            raise
    _print_placement_report(report, as_json, out)
    if output is not None:
        try:
            write_csv(read_csv(trace_csv), output, offsets=report["offsets"])
        except OSError as why:
            if interrupt is None:
                raise
            interrupt.written = False  # the interrupt goes on, not this error
            print(f"membudget: the best placement could not be written to {output}: {why}", file=sys.stderr)
    if interrupt is not None:
        raise interrupt
    return 0 if report["valid"] else 1


def _print_placement_report(report: dict[str, Any], as_json: bool, out: TextIO) -> None:
    """Print ``report``, as text or as JSON."""
    if as_json:
        out.write(json.dumps(report) + "\n")
    else:
        opt = {True: "yes", False: "no", None: "-"}[report["optimal"]]
        lines = [
            f"trace          {report['trace']} ({report['blocks']} block{'' if report['blocks'] == 1 else 's'})",
            f"allocator      {report['allocator']}",
            f"max-live bytes {report['max_live_bytes']}",
            f"arena bytes    {report['arena_bytes']}",
            f"fragmentation  {report['fragmentation']:.4f}",
            f"optimal        {opt}",
        ]
        gap = "no gap: the placement is invalid" if report["gap"] is None else f"gap {100 * report['gap']:.3f}% of the arena"
        lines.append(f"lower bound    {report['lower_bound_bytes']} ({gap})")
        lines += [
            f"place time     {report['place_time_s']:.4f} s",
            f"valid          {'yes' if report['valid'] else 'NO'}",
        ]
        if report["notes"]:
            lines.append(f"notes          {report['notes']}")
        lines.extend(f"  violation: {msg}" for msg in report["violations"])
        out.write("\n".join(lines) + "\n")
