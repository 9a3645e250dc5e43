"""The host-link rate each measured row behaved as if it had (docs/gpu.md, "Where the measured time goes").

    python benchmarks/gpu/link_rate.py results/gpu-smoke/published

For every measured ``ok`` row that moved data, plans the case again on the run's saved
profile (at the row's budget, as the run's budget model planned it) and finds, by bisection, the link rate (both ways) at which
the simulator's time equals the measured one: a row whose gap to its prediction is the
link's alone gives the rate the copies really had. A row whose plan today predicts another
time than the run recorded (``predicted_s``: the planner changed since), or that moved
other bytes than its schedule moves (PyTorch's ``save_on_cpu`` hooks copy every saved tensor),
is listed but not solved. Prints a table and the median implied rate over the solved rows.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from harness.case import plan_case
from harness.model import DEVICE_OFFLOAD_START, OFFLOAD_STARTS, Profile, Schedule
from harness.plugins import registry
from harness.publish import device_budget_of
from harness.results import RunProfiles, load_rows, read_meta
from harness.same_schedule import own_runs
from harness.simulate.executor import makespan, simulate

PREDICTED = "simulate"


def time_at(schedule, profile: Profile, rate: float, offload_start: str | None = None) -> float:
    """The simulated iteration time of ``schedule`` with the link at ``rate`` bytes/s each way (offloads
    starting by ``offload_start``; None: the schedule's rule)."""
    return makespan(schedule, replace(profile, d2h_bandwidth=rate, h2d_bandwidth=rate),
                    offload_start=offload_start) or math.inf


def rule_times(schedule, profile: Profile) -> dict[str, float]:
    """The simulated iteration time of ``schedule`` under each offload rule (NaN where it cannot run),
    the device's first."""
    rules = sorted(OFFLOAD_STARTS, key=lambda rule: rule != DEVICE_OFFLOAD_START)
    return {rule: makespan(schedule, profile, offload_start=rule) or math.nan for rule in rules}


def recorded_rule(times: dict[str, float], predicted_s: float) -> str | None:
    """Of ``rule_times``, the offload rule that gives the prediction the run recorded (the torch
    executor's own since 2026-11-30, papers/004's before; the device's when both do), or None when
    neither does (the planner changed since)."""
    return next((rule for rule, time in times.items() if math.isclose(time, predicted_s, rel_tol=1e-3)), None)


def implied_rate(schedule, profile: Profile, measured: float, offload_start: str | None = None) -> float | None:
    """The link rate at which the simulated time (offloads starting by ``offload_start``, None: the
    schedule's rule) is ``measured``, or None when no rate between
    1 MB/s and 10 TB/s gives it (the gap is not the link's). The search starts at the profile's
    rate and halves it, or raises it by a quarter at a time, to bracket the time (the time
    falls as the rate grows), then bisects geometrically to a twentieth of a percent. Above
    some rate a schedule can stop being valid (the simulator runs it no more): the search up
    stops there, with no rate, rather than step over the valid ones."""
    lo = hi = profile.d2h_bandwidth
    while time_at(schedule, profile, lo, offload_start) < measured:  # slower than predicted: a slower link
        lo /= 2
        if lo < 1e6:
            return None
    while time_at(schedule, profile, hi, offload_start) > measured:  # faster than predicted: a faster link
        hi *= 1.25
        if hi > 1e13 or math.isinf(time_at(schedule, profile, hi, offload_start)):
            return None  # past the rates at which the schedule stays valid
    if lo == hi:
        return lo
    while hi / lo > 1.0005:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if time_at(schedule, profile, mid, offload_start) > measured else (lo, mid)
    return math.sqrt(lo * hi)


def rows_with_rates(run_dir: Path) -> pd.DataFrame:
    """One line per measured ok row that moved data: measured, recorded and replanned predictions
    (under the offload rule that gives the recorded one: ``rule``, empty when none does, the plan
    having changed), the implied rate in GB/s (empty when the plan changed or the gap is not the
    link's)."""
    rows = load_rows(run_dir)
    device_budget = device_budget_of(read_meta(run_dir))
    measured = own_runs(rows[(rows.executor != PREDICTED) & (rows.status == "ok") & (rows.moved_bytes > 0)])
    profiles = RunProfiles(run_dir)
    lines = []
    for _, r in measured.iterrows():
        profile = profiles.of(r)
        schedule = planned_schedule(r, profile, device_budget)
        rule = recorded_rule(rule_times(schedule, profile), r.predicted_s)
        predicted = simulate(schedule, profile, offload_start=rule, with_trace=False)
        replanned = predicted.makespan if predicted.feasible else None
        # the row moved what the schedule moves (PyTorch's save_on_cpu hooks, say, move more)
        moves = math.isclose(predicted.moved_bytes, r.moved_bytes, rel_tol=0.01)
        rate = implied_rate(schedule, profile, r.makespan_s, rule) if rule is not None and moves else None
        lines.append({"model": r.model, "planner": r.planner, "budget": r.budget_label, "rule": rule or "",
                      "measured ms": r.makespan_s * 1e3, "predicted ms": r.predicted_s * 1e3,
                      "replanned ms": (replanned or math.nan) * 1e3, "moved GB": r.moved_bytes / 1e9,
                      "schedule moves GB": predicted.moved_bytes / 1e9,
                      "profile GB/s": profile.d2h_bandwidth / 1e9,
                      "implied GB/s": rate / 1e9 if rate else math.nan})
    return pd.DataFrame(lines)


def planned_schedule(row: pd.Series, profile: Profile, device_budget: bool) -> Schedule:
    """The schedule the run planned for ``row``: its planner and options, on the run's profile, at its
    budget under the run's budget model (a planner that changed since may give another). Under a
    device budget, at the chain budget the run's search settled on (``planning_budget_bytes``), so
    that a change of the device budget model since does not plan the row otherwise."""
    planner, options = registry().planner(row.planner), row_options(row)
    chain_budget = pd.to_numeric(row.get("planning_budget_bytes"), errors="coerce")
    if device_budget and pd.notna(chain_budget):
        schedule = plan_case(planner, profile, int(chain_budget), options).schedule
        return replace(schedule, device_budget_bytes=int(row.budget_bytes))
    return plan_case(planner, profile, int(row.budget_bytes), options, device_budget=device_budget).schedule


def row_options(row: pd.Series) -> dict:
    import json

    text = row.get("planner_options")
    return json.loads(text) if isinstance(text, str) and text.strip() else {}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: link_rate.py RUN_FOLDER", file=sys.stderr)
        return 2
    table = rows_with_rates(Path(argv[0]))
    if table.empty:
        print("no measured ok row moved data")
        return 1
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    solved = table["implied GB/s"].dropna()
    if len(solved):
        print(f"median implied link rate over {len(solved)} rows: {statistics.median(solved):.1f} GB/s "
              f"(profile: {table['profile GB/s'].iloc[0]:.1f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
