"""One schedule, run once: a suite's ``same_schedule: reuse`` (docs/cli.md, "Suites").

Planners often return one and the same schedule at a budget (vDNN's variants where all of them
offload every layer): the same operations, copies, algorithms, sub-batches, copy layout and
chain budget, ``Schedule.fingerprint``. Run again on a GPU, such a schedule costs device time to measure noise
alone. Under ``reuse``, a case whose schedule ran already, on the same workload, profiler,
executor, budgets, repeat and seed (``key``), takes that run's row figures instead of running:
its own columns (the case, its planner, its planning time) stay its own, its message names
the case whose run it took, its ``run_time_s`` is empty (``took_earlier_run``) and its ``timeline``
is that run's file. The runs a resumed run folder holds count too; ``error`` rows do not (a fault
of that moment), nor rows of an allocator (a placement is per allocator).

A case takes only the runs finished when its unit was made: with ``--jobs 1`` and no case time
limit, every run before it; in a worker pool, those finished when its unit was sent; on Ray, those
the run folder held when the run started.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from harness.results import row_cells

# what makes two rows' runs one and the same: the schedule (its fingerprint), what it ran on, the budgets
# it was planned and capped for (a device budget's chain budget too), and the repeat and seed of the grid
KEY_COLUMNS = ("model", "batch_size", "input_size", "dtype", "device", "profiler", "executor", "budget_bytes",
               "planning_budget_bytes", "repeat", "seed", "schedule_fingerprint")
# the columns that are a case's own, not its run's: a row that takes an earlier run keeps its own
CASE_COLUMNS = ("suite", "case_id", "planner", "planner_label", "planner_options", "budget_label",
                "budget_fraction", "allocator", "run_id", "finished_at", "plan_time_s", "run_time_s")
REUSED_STATUSES = ("ok", "oom", "infeasible")  # what a schedule's run says of it; an error is that moment's


def took_earlier_run(row: Mapping[str, Any]) -> bool:
    """True for a row that took an earlier run's figures instead of running: a schedule's row (it has a
    fingerprint) whose executor did not run (no ``run_time_s``, which a run always sets) and that is no
    ``error``. ``row``: its cells, or a typed row (``harness.results.load_rows``)."""
    return (_given(row.get("schedule_fingerprint")) and not _given(row.get("run_time_s"))
            and row.get("status") in REUSED_STATUSES)


def own_runs(rows: Any) -> Any:
    """A frame of rows (``harness.results.load_rows``) without those that took an earlier run: each run once."""
    return rows[~rows.apply(took_earlier_run, axis=1)] if len(rows) else rows


def _given(value: Any) -> bool:
    return not (value is None or value == "" or (isinstance(value, float) and math.isnan(value)))


def key(cells: Mapping[str, str]) -> tuple[str, ...]:
    """The key of a row given as its cells (``row_cells``): rows with one key ran one schedule alike."""
    return tuple(cells.get(c, "") for c in KEY_COLUMNS)


@dataclass
class EarlierRuns:
    """The rows of the runs done so far, by ``key``: the first row of each key (the one that ran)."""

    rows: dict[tuple[str, ...], dict[str, str]] = field(default_factory=dict)

    def add(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Keep the rows that record a run of their own (an ``ok``, ``oom`` or ``infeasible`` row of no
        allocator, with a fingerprint and a ``run_time_s``: a row that took another's has none), unless
        one with the same key is kept already."""
        for row in rows:
            cells = row_cells(row)
            if (cells["status"] in REUSED_STATUSES and not cells["allocator"] and cells["schedule_fingerprint"]
                    and cells["run_time_s"]):
                self.rows.setdefault(key(cells), cells)

    def taken_by(self, row: Mapping[str, Any], planned: Any, want_timeline: bool) -> dict[str, Any] | None:
        """The row figures for ``row``'s case (its identity columns; ``planned``, ``harness.case.Planned``,
        its schedule) from the earlier run of the same schedule, or None when none ran."""
        fingerprint = planned.schedule.fingerprint()
        earlier = self.rows.get(key(row_cells({**row, **planned.fields, "schedule_fingerprint": fingerprint})))
        if earlier is None:
            return None
        if want_timeline and not earlier["timeline"]:
            return None  # the case asks for a timeline that run did not save: it runs, and saves its own
        fields: dict[str, Any] = {c: v for c, v in earlier.items() if c not in CASE_COLUMNS and v != ""}
        if not want_timeline:
            fields.pop("timeline", None)
        note = (f"the same schedule as {earlier['planner_label']}'s (fingerprint {fingerprint}; case "
                f"{earlier['case_id']}): that run's figures, not run again")
        fields["message"] = f"{earlier['message']} ({note})" if earlier["message"] else note
        fields["plan_time_s"] = planned.plan_time_s
        return fields
