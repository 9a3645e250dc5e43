"""What a GPU slice showed, against issue #16's and #17's done-when lines (docs/gpu.md).

    python benchmarks/gpu/summary.py results/gpu-smoke/published-3 [OUT_FOLDER]

reads a run folder's rows and prints, and writes under OUT_FOLDER as ``summary.md`` and
``summary.json``:

- the checks: zero ``oom`` among the cases the harness planned (a torch row the planner
  refused is ``infeasible``, not a failure of the budget), every ``ok`` row's
  ``max_memory_reserved`` within its budget (and reported: the CPU reports none), the median |prediction_error| at most 10% and
  the largest at most 25%, and the largest gradient error;
- the measured throughput of every planner at each budget against keep-all's, per model group
  and measured executor, each cell summarised as the published pages summarise it
  (``harness.publish.summarise``): keep-all's fastest ``ok`` cell (the suite runs it at an
  unconstrained budget) over the planner's. Where no keep-all row ran, the
  simulator's ideal iteration (``ideal_s``) stands in, and the table says so;
- where the measured time went that the simulator did not see, per planner and budget: the
  measured timeline against the simulated one of the same case (``harness.time_gap``), as
  shares of the predicted time (compute per operation kind, the compute stream's idle time,
  the spread between the median and the recorded iteration), the copies' extra time, and their
  median speed against the model's link (``copy speed``: near 1, the link ran as profiled).

It runs on the CPU too (tests/test_gpu_summary.py runs it on a CPU suite), so a GPU slice
never finds it broken.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from harness.publish import Doc, ExecutorTable, budget_order, executors, grid, model_groups
from harness.same_schedule import own_runs

MEDIAN_ERROR, MAX_ERROR = 0.10, 0.25  # issue #16: |prediction_error| median and largest
PREDICTED = "simulate"  # every other executor's rows are measured on the device


@dataclass(frozen=True)
class Checks:
    """Issue #16's done-when figures over the measured rows of one run."""

    status: dict[str, int]
    oom_among_planned: int
    errors: int  # measured rows that failed for another reason than memory
    over_budget: int  # ok rows whose max_memory_reserved exceeds budget_bytes
    reserved_known: int  # ok rows that report max_memory_reserved (the CPU does not)
    error_median: float
    error_max: float
    grad_error_max: float
    taken: int = 0  # device rows that took an earlier run of their schedule (same_schedule: reuse): not counted

    @property
    def passed(self) -> dict[str, bool]:
        """Each check by name: True when it holds (a check with no rows to judge does not hold)."""
        measured = sum(self.status.values())
        planned = measured - self.status.get("infeasible", 0)
        return {
            "zero oom among planned cases": self.oom_among_planned == 0 and planned > 0,
            "no errors": self.errors == 0 and measured > 0,
            "reserved within the budget": (self.over_budget == 0 and self.reserved_known > 0
                                           and self.reserved_known == self.status.get("ok", 0)),
            f"median |prediction_error| <= {MEDIAN_ERROR:.0%}": self.error_median <= MEDIAN_ERROR,
            f"largest |prediction_error| <= {MAX_ERROR:.0%}": self.error_max <= MAX_ERROR,
        }


def measured(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows the device ran (every executor but the simulator), each run once: a row that took an
    earlier run of its schedule (``same_schedule: reuse``) is that run's, already counted."""
    return own_runs(rows[rows["executor"] != PREDICTED])


def checks(rows: pd.DataFrame) -> Checks:
    """The done-when figures of ``rows`` (a run's rows, every executor)."""
    real = measured(rows)
    ok = real[real["status"] == "ok"]
    prediction = pd.to_numeric(ok["prediction_error"], errors="coerce").abs().dropna()
    grads = pd.to_numeric(ok["grad_error"], errors="coerce").dropna()
    reserved = pd.to_numeric(ok["max_memory_reserved"], errors="coerce")
    budget = pd.to_numeric(ok["budget_bytes"], errors="coerce")
    return Checks(
        status={str(k): int(v) for k, v in real["status"].value_counts().items()},
        oom_among_planned=int((real["status"] == "oom").sum()),
        errors=int((real["status"] == "error").sum()),
        over_budget=int((reserved > budget).sum()),
        reserved_known=int(reserved.notna().sum()),
        error_median=float(prediction.median()) if len(prediction) else math.nan,
        error_max=float(prediction.max()) if len(prediction) else math.nan,
        grad_error_max=float(grads.max()) if len(grads) else math.nan,
        taken=int((rows["executor"] != PREDICTED).sum()) - len(real),
    )


def _measured_tables(rows: pd.DataFrame, statistic: str) -> list[ExecutorTable]:
    """One table per model group and measured executor, each strategy and budget summarised the
    way the published pages summarise it (``harness.publish.summarise``, the run's ``statistic``)."""
    return [ExecutorTable.of(group, executor, statistic) for group in model_groups(rows)
            for executor in executors(group.rows) if executor != PREDICTED]


def throughput_against_keep_all(rows: pd.DataFrame, statistic: str = "trimmed-mean"
                                ) -> dict[str, tuple[str, pd.DataFrame]]:
    """Per model group and measured executor: (what the denominator is, planner x budget table of
    keep-all's time over the planner's; a cell is the status where it did not run). The
    denominator is keep-all's fastest ``ok`` cell, else the simulated ideal iteration."""
    out: dict[str, tuple[str, pd.DataFrame]] = {}
    for table in _measured_tables(rows, statistic):
        keep_all = [c.time_s for (planner, _), c in table.cells.items() if planner == "keep-all" and c.ok]
        ideal = pd.to_numeric(table.rows["ideal_s"], errors="coerce").dropna()
        if keep_all:
            reference = min(keep_all)
            basis = f"keep-all measured, {reference * 1e3:.2f} ms"
        elif len(ideal):
            reference = float(ideal.iloc[0])
            basis = f"no keep-all run: the simulated ideal iteration, {reference * 1e3:.2f} ms"
        else:  # no profile (profiling failed): nothing ran, every cell is a status
            reference = math.nan
            basis = "no keep-all run and no profile: no reference"
        lines, _ = grid(table, lambda planner, budget, cell: f"{reference / cell.time_s:.2f}")
        out[table.title] = (basis, pd.DataFrame([line[1:] for line in lines], index=[line[0] for line in lines],
                                                columns=budget_order(table.rows)))
    return out
def time_gaps(rows: pd.DataFrame, run_dir: Path) -> dict[str, pd.DataFrame]:
    """Per model group: one line per measured ``ok`` row whose timeline and its simulated twin's
    were saved, the measured - predicted time split by ``harness.time_gap`` (shares of the predicted).
    ``executor's rule`` is the share of that gap the row's own prediction (``predicted_s``) accounts
    for already: the torch executor predicts under its own offload rule (offloads after their forward,
    since 2026-11-30), the ``simulate`` twin under the schedule's (the same under a device budget, as
    in the GPU suites; papers/004's otherwise)."""
    from harness.time_gap import time_gap

    out: dict[str, pd.DataFrame] = {}
    for group in model_groups(rows[rows["timeline"].fillna("") != ""]):
        at = group.rows
        twins = {(r["planner_label"], r["budget_label"]): r for _, r in at[at["executor"] == PREDICTED].iterrows()}
        lines = []
        for _, row in measured(at)[measured(at)["status"] == "ok"].iterrows():
            twin = twins.get((row["planner_label"], row["budget_label"]))
            if twin is None:
                continue
            try:
                events = [json.loads((run_dir / r["timeline"]).read_text())["events"] for r in (row, twin)]
            except (OSError, ValueError, KeyError):  # a timeline missing or torn: no line, not a lost summary
                continue
            gap = time_gap(*events, float(row["makespan_s"]), float(twin["makespan_s"]))
            line = {"planner": row["planner_label"], "budget": row["budget_label"],
                    "measured ms": f"{gap.measured_s * 1e3:.2f}", "predicted ms": f"{gap.predicted_s * 1e3:.2f}"}
            line.update({k: f"{v:+.1%}" for k, v in gap.shares().items()})
            line["copies"] = f"{gap.copy_s / gap.predicted_s:+.1%}" if gap.predicted_s > 0 else ""
            line["copy speed"] = f"{gap.copy_speed:.2f}" if not math.isnan(gap.copy_speed) else ""
            own = pd.to_numeric(row.get("predicted_s"), errors="coerce")
            line["executor's rule"] = (f"{own / gap.predicted_s - 1:+.1%}" if gap.predicted_s > 0 and pd.notna(own)
                                       else "")
            line["largest op gaps"] = ", ".join(f"{label} {d * 1e3:+.2f} ms" for label, d in gap.largest_ops[:3])
            lines.append(line)
        if lines:
            out[group.title] = pd.DataFrame(lines).fillna("")
    return out


def report(rows: pd.DataFrame, run_dir: Path | None = None, statistic: str = "trimmed-mean") -> tuple[str, dict]:
    """The summary as text (markdown) and as a JSON-ready dict; the time gaps need the run folder
    (``run_dir``), where the timelines are; repeats are summarised by the run's ``statistic``."""
    found = checks(rows)
    doc = Doc(f"GPU slice summary: {run_dir}" if run_dir is not None else "GPU slice summary")
    doc.para("\n".join([
        f"measured rows by status: {found.status}"
        + (f" ({found.taken} more took an earlier run of their schedule: same_schedule: reuse)" if found.taken else ""),
        f"oom among the cases the harness planned: {found.oom_among_planned}",
        f"ok rows reserving more than their budget: {found.over_budget}",
        f"|prediction_error| over the ok rows: median {found.error_median:.3f}, largest {found.error_max:.3f}",
        f"largest gradient error against the unmodified model: {found.grad_error_max:.2e}"]))
    doc.para("\n".join(f"- {'PASS' if held else 'FAIL'}: {name}" for name, held in found.passed.items()))
    tables = throughput_against_keep_all(rows, statistic)
    for title, (basis, frame) in tables.items():
        doc.heading(f"{title}: throughput against keep-all ({basis})", level=3)
        doc.table(["planner", *frame.columns], [[name, *line] for name, line in zip(frame.index, frame.values)])
    gaps = time_gaps(rows, run_dir) if run_dir is not None else {}
    for title, frame in gaps.items():
        doc.heading(f"{title}: measured - predicted time, as shares of the predicted (timeline vs timeline)", level=3)
        doc.table(list(frame.columns), frame.values.tolist())
    data = {"checks": asdict(found), "passed": found.passed,
            "throughput_against_keep_all": {m: {"basis": b, "table": f.to_dict(orient="index")}
                                            for m, (b, f) in tables.items()},
            "time_gaps": {m: f.to_dict(orient="records") for m, f in gaps.items()}}
    return "\n".join(doc.md), data


def main(argv: list[str]) -> int:
    """``summary.py RUN_FOLDER [OUT_FOLDER]``: print the summary and write it under OUT_FOLDER."""
    from harness.publish import statistic_of
    from harness.results import load_rows, read_meta

    if not argv or len(argv) > 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    text, data = report(load_rows(argv[0]), Path(argv[0]), statistic_of(read_meta(argv[0])))
    print(text, end="")
    if len(argv) == 2:
        out = Path(argv[1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.md").write_text(text)
        (out / "summary.json").write_text(json.dumps(data, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
