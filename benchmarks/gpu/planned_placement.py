"""Planned placement on a real GPU (issue #18): arena against the caching allocator's reserve.

    python benchmarks/gpu/planned_placement.py OUT [--model torchvision:resnet50] [--batch 32]

For keep-all and two offloading schedules (greedy and dynprog at half-way between the
minimum memory and the peak), runs the ``torch-planned`` executor (its own process per run,
then the caching allocator's run of the same schedule) and writes ``OUT/rows.csv`` (one row
per schedule: the planned metrics beside the caching ones) and ``OUT/summary.json``; prints
arena vs caching reserved per schedule.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path


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
    from harness.bounds import min_memory, peak_memory
    from harness.errors import InfeasibleBudget, MembudgetError
    from harness.executors.planned import TorchPlannedExecutor
    from harness.plugins import registry
    from harness.profilers.measured import TorchProfiler
    from harness.protocols import Workload

    workload = Workload(args.model, args.batch, (3, 224, 224), "cuda")
    profile = TorchProfiler(warmup=1, repeats=3, algorithms=False).profile(workload)
    lo, hi = min_memory(profile), peak_memory(profile)
    half = int(lo + 0.5 * (hi - lo))
    rows = []
    for planner, budget in (("keep-all", hi), ("greedy", half), ("dynprog", half)):
        try:
            schedule = registry().planner(planner).plan(profile, budget)
        except MembudgetError as exc:  # a planner that refuses (or reports an error) is a row, not a lost run
            status = "infeasible" if isinstance(exc, InfeasibleBudget) else "error"
            rows.append({"planner": planner, "budget_bytes": budget, "status": status, "message": str(exc)})
            write(args, rows)
            continue
        run = TorchPlannedExecutor(allocator=args.allocator, warmup=3, iterations=5).run(schedule, profile, workload)
        row = {"planner": planner, "budget_bytes": budget, "status": run.status, "message": run.message,
               "time_s": run.makespan, **run.metrics}
        rows.append(row)
        m = run.metrics
        if run.status == "ok":
            print(f"{planner:9s} arena {m.get('arena_bytes', 0) / 2**30:6.2f} GiB  planned reserved "
                  f"{m.get('planned_reserved_bytes', 0) / 2**30:6.2f} GiB  caching reserved "
                  f"{m.get('caching_reserved_bytes', 0) / 2**30:6.2f} GiB  departures {m.get('departures')}  "
                  f"grad_error_vs_caching {m.get('grad_error_vs_caching', float('nan')):.1e}  "
                  f"time {run.makespan:.4f} s (caching {m.get('caching_time_median_s', float('nan')):.4f} s)",
                  flush=True)
        else:
            print(f"{planner:9s} {run.status}: {run.message}", flush=True)
        write(args, rows)  # after every run: a call cut short keeps what finished
    return 0 if all(r["status"] == "ok" for r in rows if r["planner"] == "keep-all") else 1


def write(args: argparse.Namespace, rows: list[dict]) -> None:
    """``OUT/rows.csv`` and ``OUT/summary.json`` of the rows so far."""
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("planner", "budget_bytes", "status"), k))
    with open(args.out / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    summary = {"model": args.model, "batch": args.batch, "allocator": args.allocator,
               "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
