"""Fig. 8 of papers/000 on the measured H100 profiles: moDNN (eq. 3) vs vDNN+ vs vDNN.

    python plugins/modnn/benchmarks/fig8_measured.py [profile.json ...]

Budgets are fractions of [M_min (eq. 2), keep-all peak]; 0.05, 0.17, 0.40 and 0.63 are where
the paper's 2, 4, 8 and 12 GB fall on its VGG-16 (batch 256, K40m) set-up. Every pass gets
the main profile's host link (``Profile.at_batch``). Makespans are simulated.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.bounds import peak_memory
from harness.errors import InfeasibleBudget
from harness.model import Profile, load
from harness.simulate.executor import simulate
from harness.validate import validate
from membudget_modnn import MoDNN, VDNNPlus, m_min
from membudget_modnn.planner import best_static_vdnn

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = [ROOT / "results/profiles/vgg16-b256-h100-scaling.json",
           ROOT / "results/profiles/vgg19-b256-h100-scaling.json",
           ROOT / "results/profiles/resnet34-b128-h100-scaling.json",
           ROOT / "results/profiles/resnet34-b256-h100-scaling.json"]
FRACTIONS = (0.0, 0.05, 0.17, 0.25, 0.40, 0.50, 0.63, 0.85)
GiB = 2**30


def cell(schedule, profile, check: bool = False) -> str:
    if schedule is None:
        return "infeasible"
    run = simulate(schedule, profile, with_trace=False)
    if not run.feasible:
        return f"stuck ({run.message})"
    flags = " fallback" if schedule.options.get("fallback") else ""
    flags += " keep-all" if schedule.options.get("keep_all_passes") else ""
    if check and validate(schedule, profile):
        flags += " INVALID"
    sub = schedule.options.get("sub_batch", profile.batch_size)
    return f"{run.makespan * 1e3:8.1f} ms ({sub}x{schedule.sub_batches}){flags}"


def main(paths: list[str]) -> None:
    for path in paths or DEFAULT:
        p = load(Profile, path)
        low, high = m_min(p), peak_memory(p)
        print(f"\n{p.model} batch {p.batch_size} on {p.device}: M_min {low / GiB:.2f} GiB, keep-all peak "
              f"{high / GiB:.2f} GiB, ideal (compute only) {p.compute_time * 1e3:.1f} ms")
        print("| fraction | budget GiB | moDNN (eq. 3) | vDNN+ | vDNN |")
        print("| --- | --- | --- | --- | --- |")
        for f in FRACTIONS:
            budget = int(low + f * (high - low))
            cells = []
            for plan in (lambda: MoDNN().plan(p, budget), lambda: VDNNPlus().plan(p, budget),
                         lambda: best_static_vdnn(p, budget)):
                try:
                    schedule = plan()
                except InfeasibleBudget:
                    schedule = None
                cells.append(cell(schedule, p, check=not cells))
            print(f"| {f:.2f} | {budget / GiB:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
