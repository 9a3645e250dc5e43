"""A run folder as publish and compare read it: its ``meta.json`` and rows, read once and checked, and
what its suite's spec says about how to read them."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from harness.results import ROWS_CSV, ResultsError, RunFolder, check_results_table, load_rows, read_meta


def suite_name(run: RunFolder, meta: Mapping[str, Any], frame: pd.DataFrame) -> str:
    """The suite a run's page is named after: meta.json's, else its rows' (one suite), else the folder's."""
    return meta.get("suite") or (str(frame["suite"].iloc[0]) if len(frame) else "") or run.suite


def checked_run(run: RunFolder) -> tuple[dict[str, Any], pd.DataFrame]:
    """A run's ``meta.json`` and rows, read once; refuse, naming the folder, what would make a page or a
    comparison mislead: not a results table, no rows, rows of several suites (or of another suite than
    ``meta.json``'s), a case with two rows (a page would count it twice)."""
    check_results_table(run.path)
    meta = read_meta(run.path)
    rows = load_rows(run.path)
    suites = sorted(set(rows["suite"]))
    if not suites:
        raise ResultsError(f"{run.path}: rows.csv has no rows yet: nothing to publish or compare")
    if len(suites) > 1 or suites[0] != meta.get("suite", suites[0]):
        whose = f", and meta.json is suite {meta['suite']}'s" if "suite" in meta else ""
        raise ResultsError(f"{run.path}: rows.csv holds rows of the suites {', '.join(suites)}{whose}: a run "
                           "folder holds one suite's rows")
    twice = rows["case_id"][rows["case_id"].duplicated()]
    if not twice.empty:
        raise ResultsError(f"{run.path / ROWS_CSV}: the case {twice.iloc[0]!r} has more than one row; "
                           "a run has one row per case")
    return meta, rows


def statistic_of(meta: Mapping[str, Any]) -> str:
    """How a run's suite summarises its repeats (``statistic``; ``meta.json``'s spec)."""
    return meta.get("spec", {}).get("statistic", "trimmed-mean")


def device_budget_of(meta: Mapping[str, Any]) -> bool:
    """Whether a run's budgets are device bytes (``budget_model: device``; ``meta.json``'s spec)."""
    return meta.get("spec", {}).get("budget_model") == "device"
