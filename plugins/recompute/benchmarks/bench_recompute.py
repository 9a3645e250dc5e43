"""RECOMPUTE planning time: the whole planner and the DP table on a heterogeneous 150-stage chain.

Target (issue #17): a 150-stage chain at S = 500 planned in under 0.1 s after compilation
(tables from harness.memory, the relaxed and the rounded-up DP, the exact candidates, the
exact search where the DP is not proven optimal, the schedule checked in the simulator). Run with ``tox -e bench`` or
``pytest plugins/recompute/benchmarks/bench_recompute.py -o python_files=bench_*.py``; no
timed asserts (read the median).
"""

from __future__ import annotations

import random

import pytest

from harness.bounds import peak_memory
from harness.model import Profile, Stage
from membudget_recompute import Recompute, discretise, segment_tables, solve
from membudget_recompute._kernels import warm_up
from membudget_recompute.planner import leanest


def heterogeneous_chain(n: int, seed: int = 17) -> Profile:
    """Blocks of three stages (a large conv, a norm saving its input, a cheap activation) whose sizes
    fall with depth and whose forward times are not proportional to their sizes."""
    rng = random.Random(seed)
    stages = []
    for i in range(n):
        scale = 1 - 0.7 * i / n
        kind = ("conv", "norm", "act")[i % 3]
        size = int(rng.uniform(2e7, 1e8) * scale)
        fwd = rng.uniform(1e-4, 3e-3) * (3 if kind == "conv" else 0.3)
        saved = {"conv": size, "norm": 2 * size, "act": size // 2}[kind]
        stages.append(Stage(f"{kind}{i}", kind, fwd, 2 * fwd, size, saved, size,
                            int(rng.uniform(0, 4e7)) if kind == "conv" else 0,
                            int(rng.uniform(0, 4e7)) if kind == "conv" else 0))
    return Profile("heterogeneous", 32, (3, 224, 224), "synthetic", 16 * 2**30, 12e9, 12e9,
                   100_000_000, 400_000, tuple(stages))


def span_budget(profile: Profile, where: float) -> int:
    """The budget ``where`` of the way from the leanest schedule's peak to keep-all's."""
    lo, hi = leanest(segment_tables(profile))[1], peak_memory(profile)
    return int(lo + (hi - lo) * where)


@pytest.fixture(scope="module", autouse=True)
def compiled():
    warm_up()  # compile (or load the cache) outside every measurement


@pytest.mark.parametrize("where", [0.1, 0.4, 0.7])
def test_whole_planner_150_stages_500_slots(benchmark, where: float) -> None:
    """The headline case: ``Recompute().plan`` end to end, simulator check included."""
    profile = heterogeneous_chain(150)
    budget = span_budget(profile, where)
    schedule = benchmark.pedantic(Recompute().plan, args=(profile, budget), rounds=20, iterations=1)
    benchmark.extra_info["recomputed_stages"] = len(schedule.recomputed_stages)


@pytest.mark.parametrize("where", [0.1, 0.4, 0.7])
def test_slot_dp_alone_150_stages_500_slots(benchmark, where: float) -> None:
    """The same without the exact search (``front_limit=0``): what the search costs on top."""
    profile = heterogeneous_chain(150)
    budget = span_budget(profile, where)
    benchmark.pedantic(Recompute().plan, args=(profile, budget), kwargs={"front_limit": 0}, rounds=20, iterations=1)


@pytest.mark.parametrize("engine", ["kernel", "reference"])
def test_table_50_stages_500_slots(benchmark, engine: str) -> None:
    """The DP table alone, kernel against the plain-Python reference (50 stages: the reference is slow)."""
    profile = heterogeneous_chain(50)
    disc = discretise(segment_tables(profile), span_budget(profile, 0.4), 500)
    benchmark.pedantic(solve, args=(disc, engine), rounds=10 if engine == "kernel" else 2, iterations=1)


@pytest.mark.parametrize("slots", [250, 500, 1000, 2000])
def test_table_150_stages_scaling_with_slots(benchmark, slots: int) -> None:
    """The DP table is O(L^2 S)."""
    profile = heterogeneous_chain(150)
    disc = discretise(segment_tables(profile), span_budget(profile, 0.4), slots)
    benchmark.pedantic(solve, args=(disc,), rounds=5, iterations=1)
