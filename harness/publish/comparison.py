"""``compare(a, b)``: the rows of two runs lined up by case id, and what changed."""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any

import pandas as pd

from harness.publish.cells import kind_of
from harness.publish.formats import fmt_bytes, fmt_ms, number
from harness.publish.runs import checked_run
from harness.results import ResultsError, RunFolder, find_runs


COMPARED = ("makespan_s", "ratio_to_lb", "peak_bytes", "moved_bytes", "arena_bytes")


def _close(a: Any, b: Any, rtol: float) -> bool:
    fa, fb = number(a), number(b)
    if fa is None or fb is None:
        return fa is None and fb is None
    return math.isclose(fa, fb, rel_tol=rtol, abs_tol=1e-12)


GATED = ("makespan_s", "peak_bytes", "moved_bytes")  # what --tolerance judges


def _beyond(a: Any, b: Any, tolerance: float) -> bool:
    """True when ``b`` differs from ``a`` by more than ``tolerance`` (relative), or only one is known."""
    fa, fb = number(a), number(b)
    if fa is None or fb is None:
        return (fa is None) != (fb is None)
    return abs(fb - fa) > tolerance * abs(fa) + 1e-12


def _one_run(path: str | Path) -> RunFolder:
    """The one run a compare argument names; a results root of several suites is refused."""
    runs = find_runs([path])
    if len(runs) > 1:
        raise ResultsError(f"{path}: holds the runs of {len(runs)} suites ({', '.join(r.suite for r in runs)}); "
                           "compare a suite folder or a run folder")
    return runs[0]


def _value(value: Any) -> float | int | None:
    """A cell of the typed rows (``harness.results.to_frame``) for the result: an int column's cell stays whole."""
    f = number(value)
    return int(value) if f is not None and isinstance(value, numbers.Integral) else f


def _unlike(meta_a: dict[str, Any], rows_a: pd.DataFrame, meta_b: dict[str, Any], rows_b: pd.DataFrame) -> list[str]:
    """What the two runs did not share, each a sentence: the suite, the device its budgets and
    analytic times are for, the profiler, measured or simulated times, and for measured times the
    CUDA device. One case id may then stand for different work: their differences are no regression."""
    def cuda(meta: dict[str, Any]) -> Any:
        return (meta.get("environment") or {}).get("cuda_device") or "none"

    said = (("suite", "A is a run of suite {a}, B of suite {b}"),
            ("device", "A is for the device {a}, B for {b} (the suites' device: budgets and analytic times)"),
            ("profiler", "A was profiled by {a}, B by {b}"))
    notes = [words.format(a=meta_a[key], b=meta_b[key]) for key, words in said
             if key in meta_a and key in meta_b and meta_a[key] != meta_b[key]]
    kind_a, kind_b = kind_of(rows_a), kind_of(rows_b)
    if kind_a != kind_b:
        notes.append(f"A's times are {kind_a}, B's {kind_b}")
    if "measured" in (kind_a, kind_b) and cuda(meta_a) != cuda(meta_b):
        notes.append(f"A ran on the CUDA device {cuda(meta_a)}, B on {cuda(meta_b)}")
    return notes


def _profiles_unlike(folder_a: Path, folder_b: Path) -> str | None:
    """A sentence when the two runs' saved profiles of a workload they share differ (each run of a suite
    whose profiler measures profiles anew: their simulated times follow), their notes aside (how it was
    measured, not what), else None."""
    from dataclasses import replace

    from harness.model import ModelError, Profile, load

    def read(path: Path) -> Profile | None:
        try:
            return replace(load(Profile, path), notes={})
        except (OSError, ModelError):
            return None

    shared = sorted({p.name for p in (folder_a / "profiles").glob("*.json")}
                    & {p.name for p in (folder_b / "profiles").glob("*.json")})
    differ = [name for name in shared
              if read(folder_a / "profiles" / name) != read(folder_b / "profiles" / name)]
    if not differ:
        return None
    named = ", ".join(name.removesuffix(".json") for name in differ[:3]) + (", ..." if len(differ) > 3 else "")
    return (f"A's and B's profiles differ for {len(differ)} of the {len(shared)} workloads they share ({named}): "
            "each run profiled anew, and its simulated times follow its profiles")


def compare(a: str | Path, b: str | Path, rtol: float = 1e-6, tolerance: float | None = None) -> dict[str, Any]:
    """Per-case differences of two runs (matched by case id): status, times, memory.

    A case is ``changed`` when its status or any of ``COMPARED`` differs by more than
    ``rtol``. It is ``beyond_tolerance`` when its status changed, or its makespan, peak or
    moved bytes changed by more than ``tolerance`` (relative, either way; default
    ``rtol``); a case in one run only is beyond any tolerance. ``beyond_tolerance`` lists
    those case ids (``membudget compare`` exits 1 when it is not empty). ``unlike`` says, a
    sentence each, what the runs do not share (suite, device, profiler, kind of times, CUDA device; where
    they share all those, saved profiles that differ, their notes aside).
    """
    tolerance = rtol if tolerance is None else tolerance
    run_a, run_b = _one_run(a), _one_run(b)
    (meta_a, fa), (meta_b, fb) = checked_run(run_a), checked_run(run_b)
    fa, fb = fa.set_index("case_id"), fb.set_index("case_id")
    common = [c for c in fa.index if c in fb.index]
    cases, same, status_changed, beyond = [], 0, 0, []
    for case_id in common:
        ra, rb = fa.loc[case_id], fb.loc[case_id]
        entry: dict[str, Any] = {"case_id": case_id, "status_a": ra["status"], "status_b": rb["status"]}
        changed = ra["status"] != rb["status"]
        status_changed += changed
        for col in (*COMPARED, "plan_time_s"):
            entry[f"{col}_a"], entry[f"{col}_b"] = _value(ra[col]), _value(rb[col])
            if col in COMPARED and not _close(ra[col], rb[col], rtol):
                changed = True
        ma, mb = number(ra["makespan_s"]), number(rb["makespan_s"])
        entry["makespan_change"] = (mb / ma - 1) if ma and mb is not None else None
        entry["changed"] = bool(changed)
        entry["beyond_tolerance"] = bool(ra["status"] != rb["status"]
                                         or any(_beyond(ra[col], rb[col], tolerance) for col in GATED))
        same += not changed
        beyond += [case_id] if entry["beyond_tolerance"] else []
        cases.append(entry)
    only_in_a = [c for c in fa.index if c not in fb.index]
    only_in_b = [c for c in fb.index if c not in fa.index]
    unlike = _unlike(meta_a, fa, meta_b, fb)
    profiles = None if unlike else _profiles_unlike(Path(run_a.path), Path(run_b.path))  # else implied
    unlike += [profiles] if profiles else []
    return {
        "a": str(run_a.path), "b": str(run_b.path),
        "unlike": unlike,
        "summary": {"common": len(common), "same": same, "changed": len(common) - same,
                    "status_changed": int(status_changed)},
        "cases": cases,
        "only_in_a": only_in_a,
        "only_in_b": only_in_b,
        "tolerance": tolerance,
        "beyond_tolerance": beyond + only_in_a + only_in_b,
    }


def compare_table(result: dict[str, Any], show_all: bool = False):
    """A rich table of a comparison (changed cases only unless ``show_all``)."""
    from rich.table import Table

    table = Table("case", "status A", "status B", "makespan A ms", "makespan B ms", "change", "peak A", "peak B",
                  "moved A", "moved B", box=None, show_edge=False)
    for c in result["cases"]:
        if not (show_all or c["changed"]):
            continue
        change = "-" if c["makespan_change"] is None else f"{c['makespan_change'] * 100:+.2f}%"
        table.add_row(c["case_id"], c["status_a"], c["status_b"], fmt_ms(c["makespan_s_a"]), fmt_ms(c["makespan_s_b"]),
                      change, fmt_bytes(c["peak_bytes_a"]), fmt_bytes(c["peak_bytes_b"]),
                      fmt_bytes(c["moved_bytes_a"]), fmt_bytes(c["moved_bytes_b"]))
    for case_id in result["only_in_a"]:
        table.add_row(case_id, "(only in A)", "", "", "", "", "", "", "", "")
    for case_id in result["only_in_b"]:
        table.add_row(case_id, "", "(only in B)", "", "", "", "", "", "", "")
    return table
