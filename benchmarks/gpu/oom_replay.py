"""What the measured ``oom`` rows of a GPU run held, replayed on the simulator (docs/gpu.md, "What an
H200 showed (2026-11-29)").

    python benchmarks/gpu/oom_replay.py results/gpu-smoke/published-2

For every measured ``oom`` row, plans the case again on the run's saved profile (at the row's budget,
as the run's budget model planned it) and simulates the schedule twice: under its own (chain) budget,
which is where the simulator makes a prefetch wait, and with prefetches let in up to the row's
device budget less the profile's runtime bytes, which is where a prefetch went when the CUDA path
let one in whenever the allocator took it. Beside them, the bytes the device really had allocated
at the failure (the row's ``peak_bytes``, PyTorch's ``max_memory_allocated``). A row whose second
peak, plus the runtime, meets the allocated bytes ran out because its prefetches did not wait; one
far below them ran out for another reason (fragmentation, a workspace the model does not count).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from link_rate import planned_schedule  # noqa: E402  (its neighbour here: a script, not a package)

from harness.publish import device_budget_of
from harness.results import RunProfiles, load_rows, read_meta
from harness.same_schedule import own_runs
from harness.simulate.executor import simulate

PREDICTED = "simulate"
GIB = 2**30


def replay(run_dir: Path) -> pd.DataFrame:
    """One line per measured oom row: the budgets, both simulated peaks and the bytes allocated, in GiB."""
    rows = load_rows(run_dir)
    device_budget = device_budget_of(read_meta(run_dir))
    profiles = RunProfiles(run_dir)
    lines = []
    for _, r in own_runs(rows[(rows.executor != PREDICTED) & (rows.status == "oom")]).iterrows():
        profile = profiles.of(r)
        schedule = planned_schedule(r, profile, device_budget)
        own = simulate(schedule, profile, with_trace=False)
        cap = int(r.budget_bytes) - int(profile.runtime_bytes) if device_budget else int(r.budget_bytes)
        loose = simulate(replace(schedule, budget_bytes=cap), profile, with_trace=False)
        lines.append({"model": r.model, "planner": r.planner_label, "budget": r.budget_label,
                      "device budget": r.budget_bytes / GIB, "chain budget": schedule.budget_bytes / GIB,
                      "runtime": profile.runtime_bytes / GIB,
                      "peak waiting": own.peak_bytes / GIB, "peak let in": loose.peak_bytes / GIB,
                      "let in + runtime": (loose.peak_bytes + profile.runtime_bytes) / GIB,
                      "allocated at oom": float(r.peak_bytes) / GIB})
    return pd.DataFrame(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: oom_replay.py RUN_FOLDER", file=sys.stderr)
        return 2
    table = replay(Path(argv[0]))
    if table.empty:
        print("no measured oom row")
        return 0
    print("GiB; 'peak waiting': the schedule simulated under its own budget; 'peak let in': with its prefetches")
    print("let in up to the device budget less the runtime; 'allocated at oom': max_memory_allocated at the failure")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
