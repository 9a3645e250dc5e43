"""The ``membudget`` command line (docs/cli.md).

Every command that prints a result takes ``--json`` and then prints the same content as
one JSON document on stdout. Errors a user can fix (an unknown plugin, a malformed suite
or profile, an infeasible budget) print one line to stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import json
import os
import math
import re
import shlex
import signal
import sys
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from harness.errors import InfeasibleBudget, InvalidSchedule, MembudgetError, UnknownPlugin, raised_at
from harness.model import OFFLOAD_STARTS, ModelError
from harness.options import check_planner_options
from harness.profilers.devices import DEFAULT_DEVICE

EXIT_USAGE = 2
EXIT_STDOUT_CLOSED = 128 + 13  # as a shell reports a process SIGPIPE killed


# --------------------------------------------------------------------------- helpers


_RESULT_STREAM: Any = None  # under --json, where the one JSON document goes (_json_stdout)


def _out(text: str = "") -> None:
    (_RESULT_STREAM or sys.stdout).write(text + "\n")


@contextmanager
def _json_stdout(enabled: bool) -> Iterator[None]:
    """Under ``--json`` stdout carries one JSON document and nothing else: whatever else would print there
    (a plugin's ``print``, a worker process's, a child a plugin starts) goes to stderr, down to the file
    descriptor that child processes inherit, while ``_out`` writes to the real stdout."""
    global _RESULT_STREAM
    if not enabled:
        yield
        return
    stdout, result, saved = sys.stdout, sys.stdout, None
    try:
        on_descriptor = stdout.fileno() == 1
    except (AttributeError, OSError, ValueError):  # a stream of its own (a test's capture)
        on_descriptor = False
    stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)  # what child processes inherit as their stdout
    except OSError:  # no descriptor 1 or 2 to speak of: Python's own streams only
        saved = None
    if saved is not None and on_descriptor:
        result = open(saved, "w", encoding="utf-8", closefd=False)
    _RESULT_STREAM, sys.stdout = result, sys.stderr
    try:
        yield
    finally:
        sys.stdout, _RESULT_STREAM = stdout, None
        result.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _console(**options: Any) -> Any:
    """A rich Console on stdout whose closed pipe reaches ``main`` as ``BrokenPipeError`` (rich's own
    answer is ``SystemExit(1)``: a negative verdict's status, with no word)."""
    from rich.console import Console

    class StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return StdoutConsole(**options)


def _json(data: Any) -> None:
    from harness.results import json_value

    _out(json.dumps(data, indent=1, default=json_value))


def _clean(value: Any) -> Any:
    """NaN and pandas' NA become None so that JSON stays valid."""
    if value is None:
        return None
    try:
        import pandas as pd

        if value is pd.NA:
            return None
    except ImportError:
        pass
    if isinstance(value, float) and math.isnan(value):
        return None
    return value.item() if hasattr(value, "item") else value


def _kv_lines(pairs: list[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        _out(f"{key:<{width}}  {value}")


def parse_budget(text: str, profile: Any = None) -> int:
    """Bytes (``4GiB``, ``1e9``) or, with a profile at hand, ``50%`` of the span min..peak, ``min``, ``peak``.

    Percentages outside 0%..100% are refused by the rule a suite's fractions follow
    (:func:`harness.units.check_fraction`); a negative byte count is refused too.
    """
    from harness.units import check_fraction, parse_bytes

    text = str(text).strip()
    word = text.lower()  # min and peak whatever their case, as units are (160mib)
    if text.endswith("%") or word in ("min", "peak"):
        if profile is None:
            raise MembudgetError(f"budget {text!r}: a fraction needs a profile; give bytes like 4GiB")
        from harness.bounds import min_memory, peak_memory

        lo, hi = min_memory(profile), peak_memory(profile)
        if word in ("min", "peak"):
            return lo if word == "min" else hi
        try:
            fraction = float(text[:-1]) / 100
        except ValueError:
            raise MembudgetError(f"budget {text!r}: write a percentage like 50%") from None
        try:
            check_fraction(fraction)
        except ValueError as exc:
            raise MembudgetError(f"budget {text!r}: {exc}") from None
        return int(lo + math.floor(fraction * (hi - lo)))
    if text.startswith("-"):
        raise MembudgetError(f"budget {text!r}: a budget must be positive (bytes like 4GiB, or 0%..100% of "
                             f"the span min..peak)")
    try:
        return parse_bytes(text)
    except ValueError as exc:
        hint = "" if "50%" in str(exc) else "; or a percentage of the span min..peak like 50%, or min, or peak"
        raise MembudgetError(f"budget: {exc}{hint}") from None


def _options(pairs: Sequence[str]) -> dict[str, Any]:
    import yaml

    from harness import yaml_numbers

    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise MembudgetError(f"--option {pair!r}: write KEY=VALUE, e.g. --option slots=500")
        if key.strip() in out:  # argparse keeps both: the last would win without a word
            raise MembudgetError(f"--option {key.strip()} is given twice: give each option once")
        try:
            out[key.strip()] = yaml_numbers.load(value)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "not valid YAML"
            raise MembudgetError(f"--option {pair!r}: the value is not valid YAML ({problem}); e.g. "
                                 "--option slots=500 or --option 'sizes=[1, 2]'") from None
    return out


def _output_file(path: str | None, flag: str, example: str = "out.json", inputs: Sequence[str] = ()) -> None:
    """Check an output file's path before any work, and create its missing folders. ``example``: a file
    name to suggest; ``inputs``: the command's input files, which the output must not overwrite."""
    if not path:
        return
    target = Path(path)
    if target.is_dir() or path.endswith(("/", os.sep)):
        what = "is a folder" if target.is_dir() else "names a folder"
        raise MembudgetError(f"{flag} {path}: {what}; give a file name, e.g. {target / example}")
    for source in inputs:
        if target.exists() and Path(source).exists() and target.resolve() == Path(source).resolve():
            other = target.parent / example if target.name != example else target.with_stem(f"{target.stem}-out")
            raise MembudgetError(f"{flag} {path}: is the input file, which the output would overwrite; give another "
                                 f"file, e.g. {other}")
    _output_folder(str(target.parent), flag, path)


def _output_folder(path: str, flag: str, shown: str | None = None, create: bool = True) -> None:
    """Create an output folder (and its parents) unless part of its path is a file; ``create=False``
    only checks, for a command that makes it once its input is known to be good."""
    folder = Path(path)
    for part in (folder, *folder.parents):
        if part.exists() and not part.is_dir():
            raise MembudgetError(f"{flag} {shown or path}: {part} is a file, not a folder")
    if create:
        folder.mkdir(parents=True, exist_ok=True)


def _load_profile(path: str):
    from harness.model import Profile, load

    if Path(path).is_dir():
        raise MembudgetError(f"{path} is a folder, not a profile file")
    if not Path(path).exists():
        if Path(path).suffix.lower() == ".json":  # a file's name: no model to suggest, so no plugin (and torch)
            # to load first: the answer comes at once
            raise MembudgetError(f"{path}: no such profile file (make one with: membudget profile MODEL ... -o {path})")
        from harness.plugins import close_names, registry

        models = [m for m, _ in registry().models()]
        if path in models:
            raise MembudgetError(f"{path} is a model, not a profile file: profile it first "
                                 f"(membudget profile {path} --batch B --device DEVICE -o profile.json) and pass "
                                 "the file")
        close = close_names(path, models, n=2)
        hint = f"; is it the model {' or '.join(close)}? profile it first (membudget profile MODEL ...)" if close else \
            f" (make one with: membudget profile MODEL ... -o {path})"
        raise MembudgetError(f"{path}: no such profile file{hint}")
    if Path(path).suffix.lower() == ".csv":  # a YAML suite is named by the profile loader
        what, reader = _what_file(path)
        raise MembudgetError(f"{path} is {what}, not a profile (a JSON file from membudget profile): {reader}")
    try:
        return load(Profile, path)
    except ModelError:
        if kind := _json_kind(path):
            raise MembudgetError(f"{path} is {kind}, not a profile (a JSON file from membudget profile)") from None
        raise


def _json_kind(path: str) -> str | None:
    """What the JSON files membudget writes that are not profiles are, by their keys."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    keys = set(data) if isinstance(data, dict) else set()
    if {"ops", "planner"} <= keys:
        return "a schedule (membudget plan -o writes one)"
    if "events" in keys:
        return "a timeline (membudget simulate --timeline writes one)"
    if {"suite", "run_id"} <= keys:
        return "a run's meta.json (membudget publish and compare read its folder)"
    return None



# --------------------------------------------------------------------------- list


def cmd_list(args: argparse.Namespace) -> int:
    """Everything registered (kind, name, plugin, version, description), and the analytic profiler's devices."""
    from harness.plugins import registry

    if args.kind == "model":  # the names a suite or `profile` takes, not the factories behind them
        entries = [{"kind": "model", "name": name, "factory": e.name, "plugin": e.plugin, "version": e.version,
                    "description": e.description} for name, e in registry().models()]
    else:  # model factories, not their names: listing torchvision's imports torch (seconds)
        entries = [
            {"kind": e.kind, "name": e.name, "plugin": e.plugin, "version": e.version, "description": e.description}
            for e in (registry().entries(args.kind) if args.kind != "device" else [])
        ]
    if args.kind in (None, "device"):
        entries += _device_entries()
    if args.json:
        _json(entries)
        return 0
    from rich.table import Table

    columns = ("kind", "name", "factory", "plugin", "version") if args.kind == "model" else \
        ("kind", "name", "plugin", "version", "description")  # a factory's description: membudget list
    table = Table(*columns, box=None, show_edge=False)
    for e in entries:
        table.add_row(*(e[c] for c in columns))
    _console(width=160, markup=False).print(table)  # markup off: names and labels hold [ ]
    return 0


def _device_entries() -> list[dict[str, str]]:
    """The device specs of the analytic profiler (``--device``), as ``list`` entries of kind ``device``."""
    from harness.plugins import registry
    from harness.profilers import devices

    analytic = next((e for e in registry().entries("profiler") if e.name == "analytic"), None)
    plugin, version = (analytic.plugin, analytic.version) if analytic else ("membudget", "")
    return [{"kind": "device", "name": d.name, "plugin": plugin, "version": version,
             "description": devices.summary(d)} for d in devices.SPECS]


# --------------------------------------------------------------------------- profile


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile a model into a profile JSON file."""
    input_size = _input_size(args.input_size)
    if args.dtype is not None:
        from harness.models.dtypes import unknown_dtype

        if problem := unknown_dtype(args.dtype):
            raise MembudgetError(f"--dtype: {problem}")
    _output_file(args.output, "-o", "profile.json", inputs=[args.model.removeprefix("file:")])
    if args.profiler == "file":
        given = [flag for flag, value in (("--device", args.device), ("--input-size", args.input_size),
                                          ("--dtype", args.dtype)) if value is not None]
        if given:
            raise MembudgetError(f"--profiler file rescales a profile to --batch only; {', '.join(given)} would be "
                                 "ignored: profile the model again for another device, input size or dtype")
    from harness.commands import profile_command

    given = {k: v for k, v in (("device", args.device), ("dtype", args.dtype)) if v is not None}  # else its defaults
    try:
        profile = profile_command(args.model, profiler=args.profiler, batch=args.batch, input_size=input_size,
                                  output=args.output, **given)
    except UnknownPlugin as exc:
        if exc.kind == "model" and exc.name == args.model and Path(args.model).is_file():
            what, reader = _what_file(args.model)
            raise MembudgetError(f"{args.model} is {what}, not a model name: {reader}") from None
        raise
    from harness.bounds import min_memory, peak_memory

    report = {"model": profile.model, "batch_size": profile.batch_size,
              "input_shape": "x".join(map(str, profile.input_shape)), "device": profile.device,
              "profiler": profile.profiler, "stages": profile.n_stages,
              # how the model was cut: a skip connection's whole span is one stage (docs/architecture.md)
              "stage_names": [stage.name for stage in profile.stages], "compute_time_s": profile.compute_time,
              "weight_bytes": profile.weight_bytes, "min_memory_bytes": min_memory(profile),
              "peak_memory_bytes": peak_memory(profile), "output": args.output}
    _json(report) if args.json else _print_report(report)
    return 0


def _what_file(path: str) -> tuple[str, str]:
    """What a file given in the wrong place is, and what reads it."""
    suffix = Path(path).suffix.lower()
    if suffix in (".yaml", ".yml"):
        return "a suite", f"membudget run {path} runs it"
    if suffix == ".csv":
        return "a memory trace or a run's rows", f"membudget place {path} --allocator A places a trace"
    return "a file", (f"a profile is planned as it is (membudget plan {path} --planner P --budget B) or rescaled "
                      "to --batch with --profiler file")


def _input_size(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        size = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise MembudgetError(f"--input-size {text!r}: write the input's shape without the batch, like 3,224,224 "
                             "(an image) or 1024 (a sequence of token ids)") from None
    if any(d < 1 for d in size):
        raise MembudgetError(f"--input-size {text!r}: every dimension must be at least 1")
    return size


# --------------------------------------------------------------------------- plan / simulate


def _planner_words(args: argparse.Namespace) -> str:
    """``planner dynprog (options ['slots=5'])`` as an error names it; without options, the name alone."""
    return f"planner {args.planner}" + (f" (options {args.option})" if args.option else "")


def _plan(args: argparse.Namespace):
    from harness.bounds import min_memory, peak_memory
    from harness.case import plan_case, saved_data_fields
    from harness.plugins import registry

    profile = _load_profile(args.profile)
    budget = parse_budget(args.budget, profile)
    planner = registry().planner(args.planner)
    options = _options(args.option)
    check_planner_options(args.planner, planner, options)
    from harness.jit_time import stopwatch

    try:
        with stopwatch() as watch:  # what Numba spent compiling: a first use is otherwise a silent wait (QA)
            planned = plan_case(planner, profile, budget, options, device_budget=args.budget_model == "device")
    except InfeasibleBudget as exc:  # named: a plugin's bare message ("cannot") does not say whose it is
        need = exc.needed_bytes
        percent = f"; did you mean {args.budget.strip()}%?" if re.fullmatch(r"\d{1,3}", args.budget.strip()) else ""
        refusal = InfeasibleBudget(f"planner {args.planner} cannot plan for {budget} bytes: {exc}"
                                   + (f" (it needs at least {need} bytes)" if need and str(need) not in str(exc) else "")
                                   + percent, need)
        refusal.budget_bytes = budget  # for --json (_refused_json)
        raise refusal from None
    except InvalidSchedule:  # the command's verdict (exit 1), with every violation
        raise
    except MemoryError:  # e.g. --option slots=1000000000: a table too large for this machine
        from harness.options import planner_options

        hint = " (a smaller table, e.g. fewer slots, may fit)" if "slots" in (planner_options(planner) or ()) else ""
        raise MembudgetError(f"{_planner_words(args)}: out of memory while "
                             f"planning{hint}") from None
    except (ValueError, TypeError) as exc:  # a bad option value, or the planner's own slip
        # the planner need not be named twice
        said = str(exc).removeprefix(f"{args.planner}: ").removeprefix(f"planner {args.planner} ")
        raise MembudgetError(f"{_planner_words(args)}: {said}{raised_at(exc)}") from None
    except BaseException as exc:  # the planner's failure (sys.exit, asyncio.CancelledError): one line, not a
        from harness.case import classify  # traceback; classify re-raises an interrupt

        raise MembudgetError(f"{_planner_words(args)} failed: "
                             f"{classify(exc)[1]}") from None
    if watch.jit_seconds >= 1.0:
        print(f"membudget: note: {watch.jit_seconds:.1f} s of this went to compiling {args.planner}'s Numba kernels "
              "(their first use with this Numba cache; later runs load them, and plan_time_s leaves them out)",
              file=sys.stderr, flush=True)
    schedule, plan_time = planned.schedule, planned.plan_time_s
    summary = {
        "model": profile.model, "batch_size": profile.batch_size, "planner": args.planner,
        "budget_bytes": budget, "min_memory_bytes": min_memory(profile), "peak_memory_bytes": peak_memory(profile),
        "stages": profile.n_stages, "offloaded_stages": list(schedule.offloaded_stages),
        "recomputed_stages": list(schedule.recomputed_stages),
        # what it does with the saved data: the rows' columns (docs/results.md), one rule
        **{k: v for k, v in saved_data_fields(schedule, profile).items() if k != "weight_bytes"},
        "transfers": len(schedule.transfers), "synchronised_transfers": sum(
            1 for t in schedule.transfers if t.wait_op is not None),
        "sub_batches": schedule.sub_batches,
        "non_default_algorithms": sum(1 for a in schedule.algorithms if a >= 0),
        "plan_time_s": plan_time, "notes": schedule.notes,
    }
    if args.budget_model == "device":  # the chain budget the planner got, and the reservation's parts
        summary.update(budget_model="device", **planned.fields)
    if 0 < profile.device_memory < budget:  # a budget is what a card holds: this one holds less
        from harness.units import format_bytes

        summary["warning"] = (f"the budget ({format_bytes(budget)}) is above the memory of the profile's device, "
                              f"{profile.device} ({format_bytes(profile.device_memory)}): no such card can train it")
    return profile, budget, planned, summary


def _validation(schedule, profile, budget) -> dict[str, Any]:
    from harness.validate import validate

    problems = validate(schedule, profile, budget)
    return {"valid": not problems, "violations": [str(p) for p in problems]}


def _print_report(report: dict[str, Any]) -> None:
    from harness.units import format_bytes

    pairs = []
    for key, value in report.items():
        if key == "violations":
            continue
        if key.endswith("_bytes") and isinstance(value, int):
            value = f"{value} ({format_bytes(value)})"
        elif key.endswith("_s") and isinstance(value, float):
            value = f"{value:.6g} s"
        elif isinstance(value, float):
            value = f"{value:.6g}"
        elif isinstance(value, list) and key.endswith("_stages"):  # the stages' indices, not a count (rows.csv's)
            value = "[" + ", ".join(str(v) for v in value) + "]"
        elif isinstance(value, list):
            value = ", ".join(str(v) for v in value) or "-"
        pairs.append((key, value))
    _kv_lines(pairs)
    for message in report.get("violations", []):
        _out(f"  violation: {message}")


def _refused_json(args: argparse.Namespace, exc: InfeasibleBudget) -> None:
    """With --json, a refused budget is also a JSON object on stdout, its need a number (QA: a script scanning
    budgets had to read it out of the error line); the exit status stays 2."""
    if args.json:
        _json({"planner": args.planner, "status": "infeasible", "budget_bytes": getattr(exc, "budget_bytes", None),
               "budget_model": args.budget_model, "needed_bytes": exc.needed_bytes, "message": str(exc)})


def _invalid(args: argparse.Namespace, exc: InvalidSchedule) -> int:
    """The verdict on a schedule whose structure no memory rule or executor can read: exit 1."""
    report = {"planner": args.planner, "valid": False, "violations": [str(v) for v in exc.violations]}
    _json(report) if args.json else _print_report(report)
    return 1


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan for a budget; print the schedule summary and the validator's verdict."""
    _output_file(args.output, "-o", "schedule.json", inputs=[args.profile])
    try:
        profile, budget, planned, report = _plan(args)
    except InvalidSchedule as exc:
        return _invalid(args, exc)
    except InfeasibleBudget as exc:
        _refused_json(args, exc)
        raise
    schedule = planned.schedule
    report.update(_validation(schedule, profile, planned.planning_budget))
    if args.output:
        from harness.model import save

        save(schedule, args.output)
        report["output"] = args.output
    _json(report) if args.json else _print_report(report)
    return 0 if report["valid"] else 1


def cmd_simulate(args: argparse.Namespace) -> int:
    """Plan, then run the schedule with an executor (the simulator by default) and report."""
    from harness.case import execute_plan
    from harness.plugins import registry
    from harness.protocols import Workload

    _output_file(args.timeline, "--timeline", "timeline.json", inputs=[args.profile])
    _output_file(args.trace, "--trace", "trace.csv", inputs=[args.profile])
    try:
        profile, budget, planned, report = _plan(args)
    except InvalidSchedule as exc:
        return _invalid(args, exc)
    except InfeasibleBudget as exc:
        _refused_json(args, exc)
        raise
    executor = registry().executor(args.executor)
    if args.offload_start is not None:
        if args.executor != "simulate":
            raise MembudgetError(f"--offload-start is the simulate executor's rule, not {args.executor}'s")
        from harness.simulate.executor import Simulator

        executor = Simulator(offload_start=args.offload_start)
    workload = Workload.of(profile, profile.device)
    if args.executor.startswith("torch") and not args.json:  # QA: minutes of silence on a CPU, the reason at the end
        print(f"membudget: note: executor {args.executor} trains {profile.model} at batch {profile.batch_size} for "
              "real (warm-up and timed iterations): minutes on a CPU for a large model", file=sys.stderr, flush=True)
    outcome = execute_plan(planned, profile, budget, executor, workload)  # judged as a suite's row is
    fields, run = outcome.fields, outcome.run
    if run is None:  # the executor failed: say why, as the runner's row would
        raise MembudgetError(f"executor {args.executor}: {fields.get('message')}")
    report.update(executor=args.executor, status=fields["status"], message=fields["message"],
                  ideal_s=profile.compute_time)
    if "valid" in fields:  # the validator's verdict on a schedule that ran, or on one the budget refused
        report["valid"] = fields["valid"]
    report.update({k: fields.get(k) for k in (
        "makespan_s", "lower_bound_s", "ratio_to_lb", "budget_lower_bound_s", "ratio_to_budget_lb", "slowdown",
        "throughput", "idle_s", "peak_bytes", "moved_bytes", "reserved_predicted_bytes")})
    # a measuring executor's own columns (grad_error, predicted_s, prediction_error, the spread...) as the
    # row has them; the metrics without a column of their own in --json
    report.update({k: fields[k] for k in run.metrics if k in fields and k not in report})
    if args.json and fields.get("metrics"):
        report["metrics"] = fields["metrics"]
    if args.timeline and run.feasible:
        Path(args.timeline).write_text(json.dumps(
            {"case_id": f"{profile.model}/{args.planner}/{budget}", "planner": args.planner, "model": profile.model,
             "budget_bytes": budget, "makespan_s": run.makespan,
             "events": [[e.label, e.stream, e.start, e.end] for e in run.timeline]}))
        report["timeline"] = args.timeline
    if args.trace and run.feasible:
        from harness.allocators.trace import to_int_trace, write_csv

        write_csv(to_int_trace(run.trace), args.trace)
        report["trace"] = args.trace
    reserved = fields.get("reserved_predicted_bytes")
    if run.feasible and reserved is not None and reserved > budget:  # the † of a suite's page, said here
        from harness.units import format_bytes

        report["reservation_note"] = (
            f"the budget counts the chain model's bytes; for this schedule's memory trace the caching allocator "
            f"model (uncapped) predicts {format_bytes(reserved)} reserved, above {format_bytes(budget)}: a CUDA "
            "process held to the budget may run out of memory (--budget-model device, or a suite's budget_model: "
            "device, plans within what the GPU gives; docs/cli.md, 'What a budget means')")
    report = {k: _clean(v) for k, v in report.items()}
    _json(report) if args.json else _print_report(report)
    return 0 if run.feasible and fields.get("valid") is not False else 1


# --------------------------------------------------------------------------- place


def cmd_place(args: argparse.Namespace) -> int:
    """Place a memory trace with an allocator."""
    from harness.commands import place_command

    _output_file(args.output, "-o", "placed.csv", inputs=[args.trace])
    return int(place_command(args.trace, args.allocator, args.json, output=args.output,
                             options=_options(args.option), stream=_RESULT_STREAM) or 0)


# --------------------------------------------------------------------------- run


RUN_TABLE = (("model", "model"), ("batch", "batch_size"), ("planner", "planner_label"), ("budget", "budget_label"),
             ("status", "status"), ("time ms", "makespan_s"), ("x ideal", "slowdown"),
             ("budget LB ms", "budget_lower_bound_s"), ("x budget LB", "ratio_to_budget_lb"), ("x own LB", "ratio_to_lb"),
             ("peak", "peak_bytes"), ("moved", "moved_bytes"), ("plan ms", "plan_time_s"))
UNIT_KEY = ["model", "batch_size", "input_size", "planner_label", "budget_label", "executor", "repeat", "seed"]


def _cell(col: str, value: Any) -> str:
    from harness.units import format_bytes

    value = _clean(value)
    if value is None or value == "":
        return "-"
    if col.endswith("_s"):
        return f"{value * 1e3:.2f}"
    if col.endswith("_bytes"):
        return format_bytes(value)
    if col in ("ratio_to_lb", "ratio_to_budget_lb", "slowdown"):
        return f"{value:.3f}"
    return str(value)


def _allocators_and_lines(frame) -> tuple[list[str], Any]:
    """The allocators a run placed with, and the rows that make the run table's lines (the first allocator's)."""
    allocators = [a for a in dict.fromkeys(frame["allocator"]) if a]
    return allocators, frame[frame["allocator"] == allocators[0]] if allocators else frame


def run_table(frame) -> Any:
    """A rich table of a run's rows: one line per planned case, one arena column per allocator."""
    from rich.markup import escape
    from rich.table import Column, Table

    from harness.publish.formats import below_the_weights

    allocators, lines = _allocators_and_lines(frame)
    arenas = {a: {tuple(r[k] for k in UNIT_KEY): r for r in frame[frame["allocator"] == a].to_dict("records")}
              for a in allocators}
    columns = list(RUN_TABLE)
    # a key that varies gets a column, else the rows of two cases look like duplicates
    columns[4:4] = [(title, col) for title, col in (("input", "input_size"), ("executor", "executor"),
                                                    ("seed", "seed"), ("repeat", "repeat"))
                    if col in frame and frame[col].nunique() > 1]
    status = [col for _, col in columns].index("status")
    # every text is escaped: a label such as dynprog[slots=500] is text, not rich markup
    # fold, never cut: a label cut to "torch-checkpoint[ever…" names no case (QA)
    table = Table(*[Column(t, overflow="fold") for t, _ in columns],
                  *[Column(escape(f"arena {a}"), overflow="fold") for a in allocators], box=None, show_edge=False)
    budget = [col for _, col in columns].index("budget_label")
    bound = [col for _, col in columns].index("budget_lower_bound_s")
    for row in lines.to_dict("records"):
        cells = [escape(_cell(col, row.get(col))) for _, col in columns]  # a run from before a column existed lacks it
        if _clean(row.get("budget_bytes")) is not None and not cells[budget].upper().endswith("IB"):
            # f0.25 says no size of its own, and 24GB (decimal) is easily read as 24 GiB (QA)
            cells[budget] += f" ({_cell('budget_bytes', row['budget_bytes'])})"
        if below_the_weights(row.get("budget_bytes"), row.get("weight_bytes")):
            cells[bound] = "-"  # no schedule runs below the weights: a finite bound would read as reachable
        if row["status"] != "ok":
            cells[status] = f"[red]{cells[status]}[/red]"
        # what a schedule the validator refused held before it stopped is no measure of it (an allocator's
        # refusal, also an error, came after the schedule ran in full)
        if _clean(row.get("valid")) is False:
            for title, col in columns:
                if col in ("peak_bytes", "moved_bytes"):
                    cells[columns.index((title, col))] = "-"
        key = tuple(row[k] for k in UNIT_KEY)
        for a in allocators:
            placed = arenas[a].get(key)
            if placed is None:
                cells.append("-")
            elif placed["status"] != "ok" and row["status"] == "ok":
                cells.append(f"[red]{placed['status']}[/red]")
            else:
                cells.append(_cell("arena_bytes", placed["arena_bytes"]) + _arena_mark(placed))
        table.add_row(*cells)
    return table


def _arena_mark(placed: dict[str, Any]) -> str:
    """What an arena above its budget means (QA: 26.30 GiB beside a 24 GiB budget read as a contradiction
    of the page's "fits"): the caching model's arena is an uncapped process's reserve, and a process capped
    at the budget may still be served (``arena_fits_budget``); a mark says which, nothing when it is within."""
    fits = _clean(placed.get("arena_fits_budget"))
    budget, arena = _clean(placed.get("budget_bytes")), _clean(placed.get("arena_bytes"))
    if fits is None or budget is None or arena is None:
        return ""
    if fits in (False, "false"):
        return " [red](over)[/red]"
    return " (fits capped)" if arena > budget else ""


def failure_lines(frame, width: int = 400) -> list[str]:
    """One line per case that did not run (oom, error, invalid...): its id and why, shortened past
    ``width`` characters (a CUDA out-of-memory's advice on the allocator; rows.csv keeps it whole).

    Infeasible budgets are left out: the table says them and their reason is always the
    same kind ("needs at least N bytes").
    """
    failed = frame[~frame["status"].isin(["ok", "infeasible"])]
    lines = []
    for _, row in failed.drop_duplicates("case_id").iterrows():
        message = " ".join(str(_clean(row.get("message")) or "").split())
        if len(message) > width:
            message = message[: width - 3] + "..."
        lines.append(f"{row['status']}: {row['case_id']}: {message or '(no message)'}")
    return lines


def cmd_run(args: argparse.Namespace) -> int:
    """Run a suite and print its table."""
    from harness.runner import run_suite
    from harness.suite import load_suite

    _output_folder(args.output, "-o", create=False)  # the run makes it, once the suite is known to be good
    suite = load_suite(args.suite)
    for note in suite.skipped:
        print(f"membudget: note: {note}", file=sys.stderr)
    told: list[str] = []  # the notes known before the cases run, said then (a long run's end is far away)

    def tell(note: str) -> None:
        told.append(note)
        print(f"membudget: note: {note}", file=sys.stderr)

    outcome = run_suite(suite, args.output, run_id=args.run_id, resume=args.resume, backend=args.backend,
                        jobs=args.jobs, progress=not args.no_progress and not args.json, overwrite=args.overwrite,
                        case_timeout=args.case_timeout, retry=args.retry, on_note=tell)
    args.finished_run_dir = outcome.run_dir  # what an interrupt while the rows print says was kept
    order = {c.case_id: k for k, c in enumerate(suite.cases())}
    frame = outcome.rows.sort_values("case_id", key=lambda ids: ids.map(order).fillna(len(order)), kind="stable")
    counts = frame["status"].value_counts().to_dict()
    above = _above_device(frame, outcome.run_dir)
    if args.json:
        _json({"suite": suite.name, "run_dir": str(outcome.run_dir), "ran": outcome.ran,
               "already_done": outcome.skipped, "notes": [*outcome.notes, *above],
               "status_counts": {k: int(v) for k, v in counts.items()},
               "rows": [{k: _clean(v) for k, v in row.items()} for row in frame.to_dict("records")]})
        return _run_status(counts, where="in the JSON rows and in rows.csv")
    console = _console(width=230)  # the budget column gives each fraction its bytes
    console.print(run_table(frame))
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    allocators, lines = _allocators_and_lines(frame)
    per_line = f", {len(lines)} lines of {len(allocators)} allocators each" if len(allocators) > 1 else ""
    console.print(f"{len(frame)} rows{per_line} ({summary}); ran {outcome.ran} now, {outcome.skipped} already done")
    for line in failure_lines(frame):
        console.print(line, markup=False, highlight=False, soft_wrap=True)  # one line each, even in a file
    for note in [*outcome.notes, *above]:
        if note not in told:
            console.print(f"note: {note}", markup=False, highlight=False)
    console.print(f"rows: {outcome.run_dir / 'rows.csv'}")
    return _run_status(counts)


def _above_device(frame, run_dir: Path) -> list[str]:
    """Per model, the budgets of the run above its profile's device memory (``plan`` warns of one)."""
    from harness.publish.cells import model_groups
    from harness.publish.sentences import above_device_note
    from harness.results import RunProfiles

    profiles = RunProfiles(run_dir)
    notes = [(group.title, above_device_note(group.rows, profiles.of(group.rows.iloc[0])))
             for group in model_groups(frame, profiles)]
    return [f"{title}: {note[0].lower()}{note[1:]}" for title, note in notes if note]


def _run_status(counts: dict[str, int], where: str = "above and in rows.csv") -> int:
    """1 when a case of the run is an ``error`` (the harness could not run it: a bad option value, a
    bug), so that a script or CI notices; ``infeasible`` and ``oom`` are results, not errors."""
    if counts.get("error"):
        print(f"membudget: {counts['error']} case(s) failed with an error (their messages are {where})",
              file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------- publish / compare


def cmd_publish(args: argparse.Namespace) -> int:
    """Turn result folders into Markdown and HTML pages with tables and plots."""
    from harness.publish import publish, site_suites

    _output_folder(args.output, "-o", create=False)  # publish makes it once the runs are known to be good
    earlier = site_suites(args.output)
    written = publish(args.results, args.output)
    kept = [folder for folder in earlier if Path(args.output, folder, "index.html") not in written]
    if args.json:
        _json({"output": args.output, "files": [str(p) for p in written], "kept_in_index": kept})
    else:
        for path in written:
            _out(str(path))
        if kept:
            print(f"the index also lists {len(kept)} suite{'s' if len(kept) > 1 else ''} published into "
                  f"{args.output} before: {', '.join(kept)}", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Per-case differences between two runs; exit 1 when any differs beyond ``--tolerance``."""
    from harness.publish import compare, compare_table

    result = compare(args.a, args.b, rtol=args.rtol, tolerance=args.tolerance)
    if not result["summary"]["common"] and result["only_in_a"] and result["only_in_b"]:
        raise MembudgetError(f"{result['a']} and {result['b']} share no case: compare two runs of one suite")
    status = 1 if result["beyond_tolerance"] else 0
    if args.json:
        _json(result)
        return status
    console = _console(width=200, markup=False)  # case ids hold labels such as dynprog[slots=500]
    console.print(f"A: {result['a']}\nB: {result['b']}")
    for note in result["unlike"]:
        console.print(f"note: {note}; a difference below may come from that, not from a change of code",
                      highlight=False)
    table = compare_table(result, show_all=args.all)
    if table.row_count:  # no header over nothing
        console.print(table)
    s = result["summary"]
    console.print(f"{s['common']} cases in both: {s['same']} same, {s['changed']} changed "
                  f"({s['status_changed']} changed status); {len(result['only_in_a'])} only in A, "
                  f"{len(result['only_in_b'])} only in B")
    n = len(result["beyond_tolerance"])
    tolerance = f"{result['tolerance'] * 100:g}%" if args.tolerance is not None else f"--rtol {args.rtol:g}"
    verdict = (f"{n} {'case differs' if n == 1 else 'cases differ'} beyond the tolerance ({tolerance}): "
               "a changed status, makespan, peak or moved bytes, or a case in one run only"
               if n else f"no case differs beyond the tolerance ({tolerance})")
    console.print(verdict, markup=False, highlight=False)
    return status


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``membudget``."""
    parser = _Parser(
        prog="membudget", description="Benchmark GPU memory management strategies for DNN training.")
    from harness import __version__

    parser.add_argument("--version", action="version", version=f"membudget {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, func, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(func=func)
        return p

    p = command("list", cmd_list, "list every registered profiler, planner, executor, allocator and model, "
                                  "and the analytic profiler's device specs")
    p.add_argument("--kind", choices=("profiler", "planner", "executor", "allocator", "model", "device"))
    p.add_argument("--json", action="store_true", help="print JSON")

    p = command("profile", cmd_profile, "profile a model into a profile JSON file")
    p.add_argument("model", help="registered model name, e.g. torchvision:resnet50")
    p.add_argument("--profiler", default="analytic")
    p.add_argument("--device", help=f"device spec (analytic; default {DEFAULT_DEVICE}; membudget list --kind device), "
                                    "a JSON file describing a card (docs/cli.md, 'A device of your own'), or a torch "
                                    "device (cpu, cuda)")
    p.add_argument("--batch", type=_positive_int, required=True)
    p.add_argument("--input-size", help="one input's shape: C,H,W (3,224,224), or a sequence length (1024) for a "
                                        "model fed token ids; default: the model's")
    p.add_argument("--dtype", help="float32 (default), bfloat16, float16")
    p.add_argument("-o", "--output", required=True, help="profile JSON to write")
    p.add_argument("--json", action="store_true", help="print JSON")

    for name, func, help_ in (
        ("plan", cmd_plan, "plan for a budget: schedule summary and validation"),
        ("simulate", cmd_simulate, "plan and execute (simulate by default): makespan, bounds, memory"),
    ):
        p = command(name, func, help_)
        p.add_argument("profile", help="profile JSON (from membudget profile)")
        p.add_argument("--planner", required=True, action=_Once)
        p.add_argument("--budget", required=True, action=_Once,
                       help="bytes (4GiB, 512MiB), or 50%% of min..peak, min, peak")
        p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="planner option")
        p.add_argument("--budget-model", choices=("chain", "device"), default="chain", action=_Once,
                       help="what --budget counts: the chain model's bytes (default), or what the process may "
                            "reserve on the GPU, the runtime bytes and the caching allocator's fragmentation set "
                            "aside (a suite's budget_model: device; docs/cli.md, 'What a budget means')")
        p.add_argument("--json", action="store_true", help="print JSON")
        if name == "plan":
            p.add_argument("-o", "--output", help="write the schedule JSON here")
        else:
            p.add_argument("--executor", default="simulate", action=_Once)
            p.add_argument("--offload-start", choices=OFFLOAD_STARTS,
                           help="the simulator's rule for when an offload may start: with its forward "
                                "(papers/004's) or once it has ended (the torch executor's); default: the "
                                "schedule's (docs/gpu.md, 'When an offload starts')")
            p.add_argument("--timeline", help="write the run's timeline JSON here")
            p.add_argument("--trace", help="write the memory trace CSV (id,lower,upper,size) here")

    p = command("place", cmd_place, "place a memory trace (CSV id,lower,upper,size) with an allocator")
    p.add_argument("trace")
    p.add_argument("--allocator", required=True, action=_Once)
    p.add_argument("-o", "--output", help="write the trace with an offset column here")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="allocator option, e.g. time_limit=5")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = command("run", cmd_run, "run a suite; rows go to RESULTS_DIR/<suite>/<run-id>/")
    p.add_argument("suite", help="suite YAML, e.g. suites/quick.yaml")
    p.add_argument("-o", "--output", default="results", metavar="RESULTS_DIR")
    p.add_argument("--resume", action="store_true", help="continue the latest (or --run-id) run: skip finished cases")
    p.add_argument("--retry", action="append", default=[], metavar="STATUS",
                   help="with --resume: run again the cases whose rows are STATUS (error, oom or infeasible; "
                        "repeat for several)")
    p.add_argument("--run-id", help="name of the run folder (default: the start time)")
    p.add_argument("--overwrite", action="store_true", help="replace the run folder --run-id if it exists")
    p.add_argument("--backend", choices=("local", "ray"), default="local")
    p.add_argument("--jobs", type=_positive_int, default=1, help="parallel workers (local: process pool; ray: CPUs)")
    p.add_argument("--case-timeout", type=_positive_seconds, metavar="SECONDS",
                   help="stop a case that runs longer (an error row; the other cases run); default: the "
                        "suite's case_timeout_s, else no limit")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = command("publish", cmd_publish, "Markdown and HTML pages (tables, plots) from result folders")
    p.add_argument("results", nargs="+", help="run folders, suite folders (latest run) or results roots")
    p.add_argument("-o", "--output", required=True, metavar="DIR")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = command("compare", cmd_compare, "per-case differences between two runs")
    p.add_argument("a", help="run folder A (or suite folder: its latest run)")
    p.add_argument("b", help="run folder B")
    p.add_argument("--rtol", type=_non_negative_float, default=1e-6, help="relative tolerance for 'same'")
    p.add_argument("--tolerance", type=_percentage, metavar="PCT",
                   help="exit 1 when a case's status changes, it is in one run only, or its makespan, peak or "
                        "moved bytes change by more than PCT%% (e.g. 5%%; default: --rtol)")
    p.add_argument("--all", action="store_true", help="show unchanged cases too")
    p.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0  # refused below, with the same words
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _float_where(text: str, ok: Callable[[float], bool], words: str) -> float:
    """``text`` as a float that ``ok`` accepts; else argparse's error: "must be {words}, got '...'"."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan  # refused below, with the same words
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {words}, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    return _float_where(text, lambda v: v >= 0, "a number >= 0")


def _positive_seconds(text: str) -> float:
    return _float_where(text, lambda v: 0 < v < math.inf, "a number of seconds > 0")


def _percentage(text: str) -> float:
    """``5%`` or ``5`` -> 0.05."""
    try:
        value = float(text.strip().removesuffix("%")) / 100
    except ValueError:
        value = float("nan")
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"a percentage >= 0 like 5%, got {text!r}")
    return value


# options whose value may start with "-" (refused with a reason, not a usage error)
_TAKES_NEGATIVE = ("--budget", "--tolerance")


class _Once(argparse.Action):
    """An option that takes one value: given twice, it is an error (argparse keeps the last one silently, so
    ``--planner greedy --planner dynprog`` planned with dynprog alone; QA)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = f"_{self.dest}_given"
        if getattr(namespace, given, False):
            parser.error(f"{option_string} given twice ({getattr(namespace, self.dest)} and {values}): one "
                         "value per command")
        setattr(namespace, given, True)
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors also name the misspelt options of the command line being read
    (``--planners greedy`` is reported as a missing ``--planner`` otherwise)."""

    argv: list[str] = []  # the command line being parsed: ``_parse`` sets it on this parse's parsers

    def near_option(self, option: str) -> str | None:
        """This parser's option that ``option`` is a slip for (None: none is close, or it is one of them)."""
        known = [o for o in self._option_string_actions if o.startswith("--")]
        if option in self._option_string_actions or any(o.startswith(option) for o in known):
            return None  # an option of this parser, or an abbreviation argparse takes for one
        near = difflib.get_close_matches(option, known, n=1, cutoff=0.7)
        return near[0] if near else None

    def error(self, message: str):  # type: ignore[override]
        tokens = dict.fromkeys(a.split("=", 1)[0] for a in self.argv if a.startswith("--") and a != "--")
        slips = [f"{token}: did you mean {near}?" for token in tokens if (near := self.near_option(token))]
        if slips and "unrecognized arguments" not in message:
            message = f"{message} ({'; '.join(slips)})"
        super().error(message)


def _parse(parser: _Parser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args``, except that an argument the command does not take is reported with the
    command's usage (argparse gives the top-level one) and, where another command takes that option,
    names it: ``membudget plan torchvision:resnet50 --batch 8`` says ``--batch`` is ``profile``'s."""
    commands = _commands(parser)
    for p in (parser, *commands.values()):
        p.argv = argv
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    if argv.index(args.command) > argv.index(extra[0]):  # before the command: the top level's
        theirs = [a for a in extra if a.split("=", 1)[0] in commands[args.command]._option_string_actions]
        hint = f" (options go after the command: membudget {args.command} ... {' '.join(theirs)})" if theirs else ""
        parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    separator = extra.index("--") if "--" in extra else len(extra)  # after "--" nothing is an option
    options = dict.fromkeys(a.split("=", 1)[0] for a in extra[:separator] if a.startswith("--"))
    by_owners: dict[tuple[str, ...], list[str]] = {}  # the commands that take an option -> those options
    for option in options:
        owners = tuple(name for name, command in commands.items()
                       if name != args.command and option in command._option_string_actions)
        if owners:
            by_owners.setdefault(owners, []).append(option)
    owned = [f"{', '.join(opts)}: {'an option' if len(opts) == 1 else 'options'} of "
             f"{' and '.join(f'membudget {name}' for name in owners)}" for owners, opts in by_owners.items()]
    for option in options:
        near = commands[args.command].near_option(option)
        if near and not any(option in opts for opts in by_owners.values()):
            owned.append(f"{option}: did you mean {near}?")
    hint = f" ({'; '.join(owned)})" if owned else ""
    if args.command == "list" and extra[0] in ("profiler", "planner", "executor", "allocator", "model", "device"):
        hint = f" (write --kind {extra[0]})"
    commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's own parser, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _attach_negative_values(argv: list[str]) -> list[str]:
    """``--budget -1GiB`` -> ``--budget=-1GiB``: argparse would read ``-1GiB`` as an option."""
    out: list[str] = []
    k = 0
    while k < len(argv):
        if argv[k] in _TAKES_NEGATIVE and k + 1 < len(argv) and re.match(r"-[0-9.]", argv[k + 1]):
            out.append(f"{argv[k]}={argv[k + 1]}")
            k += 2
            continue
        out.append(argv[k])
        k += 1
    return out


def _user_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [MembudgetError, ModelError, OSError]
    from harness.results import ResultsError

    errors.append(ResultsError)
    try:
        from harness.allocators.trace import TraceError

        errors.append(TraceError)
    except ImportError:
        pass
    return tuple(errors)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``membudget`` console script; returns the exit status."""
    args = _parse(build_parser(), _attach_negative_values(sys.argv[1:] if argv is None else list(argv)))
    _plugin_warnings_in_one_line()
    previous = _stop_on_sigterm()
    try:
        with _json_stdout(bool(getattr(args, "json", False))):
            status = args.func(args)
        sys.stdout.flush()  # a reader gone is found here, not by the interpreter's exit (which says 1 or 120)
        return status
    except KeyboardInterrupt as exc:
        # the flag too: compiled code (Numba) can re-raise the handler's Terminated as another exception
        terminated = isinstance(exc, Terminated) or Terminated.received
        how = "terminated" if terminated else "interrupted"
        print(f"membudget: {how}{_what_an_interrupted_run_left(args, exc)}", file=sys.stderr)
        return 143 if terminated else 130
    except BrokenPipeError as exc:
        if not _stdout_gone():
            print(f"membudget: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        # the reader of stdout went away (`membudget list | head -3`): end as quietly as a process that
        # SIGPIPE kills, with its status, not a negative verdict's 1 or an error's 2
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the interpreter's last flush would complain too
        return EXIT_STDOUT_CLOSED
    except _user_errors() as exc:
        message = str(exc) if not isinstance(exc, OSError) or not exc.filename else f"{exc.filename}: {exc.strerror}"
        print(f"membudget: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if argv is None:  # the console script: what is left is the interpreter's teardown (seconds once torch is
            # loaded), after everything was written and said; a signal then made a finished run's status 130
            for number in (signal.SIGINT, signal.SIGTERM):
                signal.signal(number, signal.SIG_IGN)


def _stdout_gone() -> bool:
    """True when nobody reads the process's stdout any more (a pipe whose reader closed it)."""
    import select

    try:
        poller = select.poll()
        poller.register(1, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows): assume it was stdout
        return True


def _what_an_interrupted_run_left(args: argparse.Namespace, exc: KeyboardInterrupt) -> str:
    """What an interrupt leaves: for ``run``, the run folder and its finished cases for ``--resume``, or that
    none was started; for ``place``, the best placement found so far, when the allocator left one."""
    if args.command == "place":
        if getattr(exc, "report", None) is None:
            return f"; {args.allocator} left no placement"
        written = args.output and getattr(exc, "written", True)
        return "; the best placement found so far is above" + (f" and in {args.output}" if written else "")
    if args.command != "run":
        return ""
    # set by run_suite once the folder holds meta.json, and by cmd_run once run_suite has returned
    run_dir = getattr(exc, "run_dir", None) or getattr(args, "finished_run_dir", None)
    if run_dir is None:  # still loading the suite, or choosing the folder: a folder to resume is as it was
        return "; the run had not begun: nothing was written"
    from harness.results import ResultsError, finished_case_ids, read_meta

    # absolute paths: the command works pasted in another folder
    again = (f"membudget run {shlex.quote(str(Path(args.suite).absolute()))} "
             f"-o {shlex.quote(str(Path(args.output).absolute()))} --run-id {run_dir.name} --resume")
    for flag, value, default in (("--backend", args.backend, "local"), ("--jobs", args.jobs, 1),
                                 ("--case-timeout", args.case_timeout, None)):
        if value != default:  # how it ran: the cases still to run run the same way
            again += f" {flag} {value:g}" if isinstance(value, float) else f" {flag} {value}"
    try:
        finished = len(finished_case_ids(run_dir))
        complete = read_meta(run_dir).get("status") == "complete"
    except (OSError, ResultsError):  # the interrupt's message is no place for a second error
        return f"; finished cases are saved in {run_dir} (resume: {again})"
    cases = f"{finished} finished case{'s' if finished != 1 else ''}"
    if complete:  # the signal came after the last case: only the printing was cut
        return f"; the run had finished: all {cases} saved in {run_dir}"
    return f"; {cases} saved in {run_dir} (resume: {again})"


def _plugin_warnings_in_one_line() -> None:
    """A plugin problem the registry worked around reads ``membudget: warning: ...``, not a source line."""
    from harness.errors import PluginWarning

    original = warnings.formatwarning
    if getattr(original, "membudget", False):
        return

    def one_line(message: Any, category: type, filename: str, lineno: int, line: str | None = None) -> str:
        if issubclass(category, PluginWarning):
            return f"membudget: warning: {message}\n"
        return original(message, category, filename, lineno, line)

    one_line.membudget = True  # type: ignore[attr-defined]
    warnings.formatwarning = one_line


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``kill``, a batch scheduler), stopping the command as Ctrl-C does."""

    received = False  # set by the handler: whether this process was sent SIGTERM


def _stop_on_sigterm() -> Any:
    """Make SIGTERM stop the command like Ctrl-C, so a run's meta.json says interrupted; return the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None
    Terminated.received = False

    def stop(signum: int, frame: Any) -> None:
        Terminated.received = True
        raise Terminated()

    return signal.signal(signal.SIGTERM, stop)


if __name__ == "__main__":
    sys.exit(main())
