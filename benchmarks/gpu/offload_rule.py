"""Which of the simulator's offload rules predicts a measured run better (docs/gpu.md, "When an
offload starts").

    python benchmarks/gpu/offload_rule.py results/gpu-smoke/published-3

The simulator can start an offload when its forward starts (``forward-start``: papers/004's rule,
under which the planners plan) or only once the forward has ended (``forward-end``: what the torch
executor does, since a stage's saved data here is mostly what its forward produces; its own
predictions use it since 2026-11-30, ``harness.model.DEVICE_OFFLOAD_START``). For every measured
``ok`` row (each run once), this plans the case again as the run planned it, on the run's saved
profile, simulates the schedule under both rules and gives the ``prediction_error`` (measured /
predicted - 1) each would have had. A row that moved no data predicts the same under both and is
not planned again. A row whose re-planned time under neither rule is the one the run recorded
(the planner changed since) is listed and left out of the totals. Prints the rows that moved
data, then the median and largest |prediction_error| over all ok rows under each rule, against
issue #16's targets.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from link_rate import planned_schedule, recorded_rule, rule_times  # noqa: E402  (its neighbours here: scripts, not a package)
from summary import MAX_ERROR, MEDIAN_ERROR, measured  # noqa: E402

from harness.model import OFFLOAD_STARTS
from harness.publish import device_budget_of
from harness.results import RunProfiles, load_rows, read_meta


def predictions(run_dir: Path) -> pd.DataFrame:
    """One line per measured ok row: the measured and recorded times, each rule's predicted time and
    error, and whether the row counts (``same plan``: its re-planned time under one of the rules is
    the recorded one)."""
    rows = load_rows(run_dir)
    device_budget = device_budget_of(read_meta(run_dir))
    profiles = RunProfiles(run_dir)
    lines = []
    for _, r in measured(rows[rows.status == "ok"]).iterrows():
        times, same = dict.fromkeys(OFFLOAD_STARTS, float(r.predicted_s)), True
        if float(r.moved_bytes) > 0:
            profile = profiles.of(r)
            schedule = planned_schedule(r, profile, device_budget)
            times = rule_times(schedule, profile)
            same = recorded_rule(times, r.predicted_s) is not None
        line = {"model": r.model, "planner": r.planner, "budget": r.budget_label, "moved GB": r.moved_bytes / 1e9,
                "measured ms": r.makespan_s * 1e3, "recorded ms": r.predicted_s * 1e3, "same plan": same}
        for rule in OFFLOAD_STARTS:
            line[f"{rule} ms"] = times[rule] * 1e3
            line[f"{rule} error"] = r.makespan_s / times[rule] - 1
        lines.append(line)
    return pd.DataFrame(lines)


def totals(table: pd.DataFrame) -> pd.DataFrame:
    """Per rule, over the rows with the same plan: how many, the median and largest |error|, and
    whether both meet issue #16's targets."""
    same = table[table["same plan"]]
    lines = []
    for rule in OFFLOAD_STARTS:
        error = same[f"{rule} error"].abs()
        lines.append({"rule": rule, "rows": int(error.notna().sum()), "median |error|": error.median(),
                      "largest |error|": error.max(),
                      "meets #16": bool(error.median() <= MEDIAN_ERROR and error.max() <= MAX_ERROR)})
    return pd.DataFrame(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: offload_rule.py RUN_FOLDER", file=sys.stderr)
        return 2
    table = predictions(Path(argv[0]))
    if table.empty:
        print("no measured ok row")
        return 1
    moved = table[table["moved GB"] > 0]
    print(moved.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    left_out = int((~table["same plan"]).sum())
    print(f"\n{len(table)} measured ok rows, {len(moved)} of them moved data; {left_out} left out "
          f"(planned otherwise today). Targets: median |error| <= {MEDIAN_ERROR:.0%}, largest <= {MAX_ERROR:.0%}")
    print(totals(table).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
