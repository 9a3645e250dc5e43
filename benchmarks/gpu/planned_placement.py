"""Planned placement on a real GPU (issue #18): arena against the caching allocator's reserve.

    python benchmarks/gpu/planned_placement.py OUT [--model torchvision:resnet50] [--batch 32]

For keep-all and two offloading schedules (greedy and dynprog at half-way between the
minimum memory and the peak), runs the ``torch-planned`` executor (its own process per run,
then the caching allocator's run of the same schedule) and writes ``OUT/rows.csv`` (one row
per schedule: the planned metrics beside the caching ones) and ``OUT/summary.json``
(``complete`` once every schedule has its row); prints arena vs caching reserved per schedule,
and what ``harness.executors.planned.planned_run_problems`` finds wrong with an ``ok`` run (the
GPU test's assertions: gradients equal to the caching run's, no departure; ``problems``, "none").
Both files are written after every run, atomically. Run again on the same OUT, it keeps the
rows that finished (ok, oom, infeasible) and runs only the others: an ``error`` row runs
again once (``attempts``), then counts as finished, so that a schedule that fails every time
cannot hold up the GPU session's later jobs.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from harness.files import write_text_atomic


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="torchvision:resnet50")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--allocator", default="bestfit")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("planned_placement: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    args.device_name, args.torch_version = torch.cuda.get_device_name(), torch.__version__
    from harness.bounds import min_memory, peak_memory
    from harness.errors import InfeasibleBudget, MembudgetError
    from harness.executors.planned import TorchPlannedExecutor, planned_run_problems
    from harness.plugins import registry
    from harness.profilers.measured import TorchProfiler
    from harness.protocols import Workload

    rows, todo, attempts = resume(args)
    if not todo:
        print(f"planned_placement: every schedule has its row in {args.out}")
        write(args, rows)
        return verdict(rows)
    workload = Workload(args.model, args.batch, (3, 224, 224), "cuda")
    profile = TorchProfiler(warmup=1, repeats=3, algorithms=False).profile(workload)
    lo, hi = min_memory(profile), peak_memory(profile)
    half = int(lo + 0.5 * (hi - lo))
    for planner in todo:
        budget = hi if planner == "keep-all" else half
        attempt = attempts.get(planner, 0) + 1
        try:
            schedule = registry().planner(planner).plan(profile, budget)
        except MembudgetError as exc:  # a planner that refuses (or reports an error) is a row, not a lost run
            status = "infeasible" if isinstance(exc, InfeasibleBudget) else "error"
            rows.append({"planner": planner, "budget_bytes": budget, "status": status, "message": str(exc),
                         "attempts": attempt})
            write(args, rows)
            continue
        run = TorchPlannedExecutor(allocator=args.allocator, warmup=3, iterations=5).run(schedule, profile, workload)
        row = {"planner": planner, "budget_bytes": budget, "status": run.status, "message": run.message,
               "time_s": run.makespan, "attempts": attempt, **run.metrics}
        m = run.metrics
        if run.status == "ok":  # what tests/test_torch_executor_gpu.py asserts of a planned run
            row["problems"] = "; ".join(planned_run_problems(m)) or "none"
        rows.append(row)
        if run.status == "ok":
            print(f"{planner:9s} arena {m.get('arena_bytes', 0) / 2**30:6.2f} GiB  planned reserved "
                  f"{m.get('planned_reserved_bytes', 0) / 2**30:6.2f} GiB  caching reserved "
                  f"{m.get('caching_reserved_bytes', 0) / 2**30:6.2f} GiB  departures {m.get('departures')}  "
                  f"grad_error_vs_caching {m.get('grad_error_vs_caching', float('nan')):.1e}  "
                  f"time {run.makespan:.4f} s (caching {m.get('caching_time_median_s', float('nan')):.4f} s)  "
                  f"problems: {row['problems']}", flush=True)
        else:
            print(f"{planner:9s} {run.status}: {run.message}", flush=True)
        write(args, rows)  # after every run: a call cut short keeps what finished
    return verdict(rows)


PLANNERS = ("keep-all", "greedy", "dynprog")  # keep-all at the peak, the others half-way to it
FINISHED = ("ok", "oom", "infeasible")  # a row kept by a second call; an error runs again
TRIES = 2  # an error row after this many attempts is kept as it is


def finished(row: dict) -> bool:
    """A row a later call keeps: a result, or an error that already had its second chance."""
    return row.get("status") in FINISHED or int(row.get("attempts") or 1) >= TRIES


def verdict(rows: list[dict]) -> int:
    """The exit status: 0 when keep-all ran (the planned path works at all), else 1."""
    return 0 if any(r["planner"] == "keep-all" and r["status"] == "ok" for r in rows) else 1


def resume(args: argparse.Namespace) -> tuple[list[dict], list[str], dict[str, int]]:
    """The rows an earlier call finished in ``args.out`` (kept), the schedules still to run, and
    how many times each of those already ran."""
    earlier = earlier_rows(args)
    rows = [r for r in earlier if finished(r)]
    todo = [p for p in PLANNERS if p not in {r["planner"] for r in rows}]
    return rows, todo, {r["planner"]: int(r.get("attempts") or 1) for r in earlier if not finished(r)}


def earlier_rows(args: argparse.Namespace) -> list[dict]:
    """The rows an earlier call wrote to ``OUT/summary.json`` for the same model, batch and allocator.
    Exits when they were measured on another GPU (its ``device``): sessions are lent an H100 or an
    H200 by chance, and one summary holds one GPU's rows."""
    path = args.out / "summary.json"
    if not path.exists():
        return []
    try:
        earlier = json.loads(path.read_text())
    except json.JSONDecodeError:  # written atomically since, but an older torn file must not stop the job
        return []
    if (earlier.get("model"), earlier.get("batch"), earlier.get("allocator")) != (args.model, args.batch,
                                                                                  args.allocator):
        return []
    if earlier.get("device") != args.device_name:
        raise SystemExit(f"planned_placement: {path} holds rows measured on the GPU {earlier.get('device')!r}, "
                         f"this machine's is {args.device_name!r}: resume it on that GPU, or give another folder")
    return list(earlier.get("rows", []))


def write(args: argparse.Namespace, rows: list[dict]) -> None:
    """``OUT/rows.csv`` and ``OUT/summary.json`` of the rows so far."""
    rows = sorted(rows, key=lambda r: PLANNERS.index(r["planner"]))
    args.out.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("planner", "budget_bytes", "status"), k))
    table = io.StringIO()
    w = csv.DictWriter(table, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(args.out / "rows.csv", table.getvalue())
    summary = {"model": args.model, "batch": args.batch, "allocator": args.allocator,
               "device": args.device_name, "torch": args.torch_version,
               "complete": {r["planner"] for r in rows if finished(r)} == set(PLANNERS), "rows": rows}
    write_text_atomic(args.out / "summary.json", json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
