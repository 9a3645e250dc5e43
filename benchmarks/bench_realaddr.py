"""The planned path's allocator calls: what one training iteration's requests cost the host.

On CUDA every device allocation and free of a planned iteration is a call from C into the
``RealAddressAllocator`` through the pluggable allocator's ctypes callbacks
(``harness.executors._cuda_pluggable``). On the H200 (2026-11-29) the planned ResNet-50
iteration at batch 32 took 84.0 ms against the caching allocator's 54.9 ms (docs/gpu.md), some
2,400 calls an iteration. This benchmark replays a recorded H100 training iteration
(``results/traces/h100/trace-resnet50-b32-training.csv``: 673 allocations, 673 frees) through
the callbacks' C function pointers, as torch calls them, once the plan is made: the median time
of an iteration's calls and of one call are printed and stored in ``extra_info``. Run with
``tox -e bench`` (or ``pytest benchmarks/bench_realaddr.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.allocators.realaddr import FakeMemory, RealAddressAllocator, trace_events
from harness.allocators.trace import read_csv
from harness.executors._cuda_pluggable import ALLOC_FN, FREE_FN, PluggableAllocator

TRACE = Path(__file__).resolve().parents[1] / "results" / "traces" / "h100" / "trace-resnet50-b32-training.csv"


@pytest.fixture(scope="module")
def events() -> list[tuple[str, int, int]]:
    return trace_events(read_csv(TRACE))


@pytest.fixture(scope="module")
def planned_iteration(events):
    bestfit = pytest.importorskip("membudget_bestfit")
    real = RealAddressAllocator(bestfit.BestFit(), FakeMemory())
    # no CUDA runtime: with no side stream registered the callbacks never synchronise it, and a request
    # the allocator failed (served by the runtime instead) would be missing from the planned count below
    hook = PluggableAllocator(real, runtime=None)
    c_alloc, c_free = ALLOC_FN(hook.alloc_ptr), FREE_FN(hook.free_ptr)
    runs = [0]

    def iteration() -> None:
        runs[0] += 1
        live: dict[int, tuple[int, int]] = {}
        real.begin_iteration()
        for kind, key, size in events:
            if kind == "alloc":
                live[key] = (c_alloc(size, 0, None), size)
            else:
                ptr, size = live.pop(key)
                c_free(ptr, size, 0, None)
        real.end_iteration()
        for ptr, size in live.values():
            c_free(ptr, size, 0, None)

    iteration()  # the profiling iteration: the plan is made at its end
    return iteration, real, len(events), runs


def test_planned_iteration_calls(benchmark, planned_iteration) -> None:
    iteration, real, calls, runs = planned_iteration
    planned_before, runs_before = real.session.stats.planned, runs[0]
    benchmark.pedantic(iteration, rounds=30, iterations=1, warmup_rounds=2)
    assert real.stats.departures == 0 and not real.stats.errors
    # every allocation of every timed iteration at its planned offset
    assert real.session.stats.planned - planned_before == (runs[0] - runs_before) * calls // 2
    _report(benchmark, calls, "planned")


def test_the_same_calls_into_callbacks_that_do_nothing(benchmark, events) -> None:
    """The floor under the figure above: the replay loop and ctypes' crossings alone (each call goes
    from Python into C and back into Python here, where torch's call only crosses once)."""
    c_alloc = ALLOC_FN(lambda size, device, stream: 1 << 40)
    c_free = FREE_FN(lambda ptr, size, device, stream: None)

    def iteration() -> None:
        for kind, _, size in events:
            if kind == "alloc":
                c_alloc(size, 0, None)
            else:
                c_free(1 << 40, size, 0, None)

    benchmark.pedantic(iteration, rounds=30, iterations=1, warmup_rounds=2)
    _report(benchmark, len(events), "no-op")


def _report(benchmark, calls: int, what: str) -> None:
    median = benchmark.stats.stats.median
    benchmark.extra_info["calls"] = calls
    benchmark.extra_info["us_per_call"] = median / calls * 1e6
    print(f"\n{what}: {calls} allocator calls an iteration, {median * 1e3:.2f} ms, {median / calls * 1e6:.2f} us a call")
