"""Planning time of the vDNN, vDNN++ and capacity planners (pytest-benchmark).

Each plan is a handful of simulated trials (vdnn-dyn / vdnnpp-dyn: up to a few per CONV
layer in the greedy pass; vdnn-chain: two candidates per threshold, each over the prefetch
windows; capacity: one trial per prefix length at most). Chains: the VGG-16(42) shape on
the GTX 970 (36 stages) and ResNet-101 with one stage per block (38 stages, V100), at a
budget a quarter of the way from the minimum to the peak. Target: under 0.5 s per plan.
The simulator kernel is compiled before anything is timed.

    python -m pytest plugins/vdnn/benchmarks/bench_vdnn.py -o python_files=bench_*.py
    tox -e bench
"""

from __future__ import annotations

import pytest

from harness.bounds import min_memory, peak_memory
from harness.plugins import registry
from membudget_vdnn import shapes

CHAINS = {"vgg16(42)": shapes.vgg16(42), "resnet101(4,1000px)": shapes.resnet(101, 4, 1000)}
PLANNERS = ["vdnn-all", "vdnn-dyn", "vdnn-chain", "vdnnpp-all", "vdnnpp-dyn", "capacity"]


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """Run every planner once so that the Numba simulator is compiled (or loaded from its cache)."""
    for profile in CHAINS.values():
        for name in PLANNERS:
            _plan(name, profile)


def _plan(name: str, profile):
    planner = registry().planner(name)
    lo, hi = min_memory(profile, memory_optimal=True), peak_memory(profile)
    budget = lo + (hi - lo) // 4
    options = {"always": True} if name in ("vdnn-all", "vdnnpp-all") else {}
    try:
        return planner.plan(profile, budget, **options)
    except Exception as exc:  # an infeasible budget is still a timed planning run
        return exc


@pytest.mark.parametrize("chain", list(CHAINS))
@pytest.mark.parametrize("name", PLANNERS)
def test_plan_time(benchmark, name: str, chain: str) -> None:
    if name not in registry().names("planner"):
        pytest.skip(f"{name} is not installed")
    benchmark(_plan, name, CHAINS[chain])
