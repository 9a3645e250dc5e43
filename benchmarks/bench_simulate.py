"""Simulator speed: simulated operations per second on a 1,000-stage chain, kernel vs reference.

Target (issue 2): the kernel at least 1e6 operations/s and at least 30x the reference.
Run with ``tox -e bench`` (or ``pytest benchmarks/bench_simulate.py``); the operation rate
is printed and stored in the benchmark's ``extra_info``.
"""

from __future__ import annotations

import random

import pytest

from harness.bounds import min_memory, peak_memory
from harness.schedules import ordered_schedule
from harness.simulate._kernels import simulate_kernel
from harness.simulate.lowering import lower
from harness.simulate.reference import simulate_reference
from tests.test_simulate import random_chain


@pytest.fixture(scope="module")
def lowered_chain():
    profile = random_chain(random.Random(42), 1000)
    budget = (min_memory(profile) + peak_memory(profile)) // 2
    schedule = ordered_schedule(profile, budget, set(range(0, 1000, 2)), planner="bench", prefetch_window=1)
    low = lower(schedule, profile)
    simulate_kernel(low)  # compile outside the measurement
    return low


@pytest.mark.parametrize("engine", ["kernel", "reference"])
def test_simulator_speed(benchmark, lowered_chain, engine) -> None:
    run = simulate_kernel if engine == "kernel" else simulate_reference
    rounds = 50 if engine == "kernel" else 1
    timing = benchmark.pedantic(run, args=(lowered_chain,), rounds=rounds, iterations=1)
    assert timing.status == 0
    operations = lowered_chain.n_ops + len(lowered_chain.tr_dur)
    rate = operations / benchmark.stats.stats.median
    benchmark.extra_info["operations"] = operations
    benchmark.extra_info["operations_per_s"] = rate
    print(f"\n{engine}: {operations} operations, {rate:,.0f} simulated operations/s")
