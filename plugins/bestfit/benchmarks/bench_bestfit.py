"""Speed of best-fit: the Numba kernel against the plain-Python reference (pytest-benchmark).

Traces of about 1,000 / 10,000 / 50,000 blocks, of two kinds: DNN-like training
iterations (``harness.testing_allocators.dnn_training_trace``, long nested lifetimes) and
random lifetimes. The kernel is compiled (and cached) before timing. The target is
10,000 blocks in under 1 s; the reference, quadratic in pure Python, runs at 1,000 and
10,000 blocks only (at 50,000 it takes many minutes; set ``MEMBUDGET_BENCH_REFERENCE_50K=1``
to time it anyway).

    python -m pytest plugins/bestfit/benchmarks/bench_bestfit.py
    tox -e bench
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from harness.allocators.trace import IntTrace, to_int_trace
from harness.testing_allocators import dnn_training_trace
from membudget_bestfit import bestfit_kernel, bestfit_reference

SIZES = [1_000, 10_000, 50_000]
BLOCKS_PER_LAYER = 6.33  # of dnn_training_trace


def make_trace(kind: str, n: int) -> IntTrace:
    """A trace of about ``n`` blocks (exactly ``n`` for ``random``)."""
    if kind == "dnn":
        return to_int_trace(dnn_training_trace(0, layers=max(2, round(n / BLOCKS_PER_LAYER))))
    rng = np.random.default_rng(n)
    lower = rng.integers(0, 2 * n, n)
    return IntTrace(lower, lower + rng.geometric(1 / 50, n), rng.integers(1, 1 << 24, n))


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """Compile (or load from the cache) before anything is timed."""
    one = np.ones(1, dtype=np.int64)
    bestfit_kernel(one * 0, one, one)


@pytest.mark.parametrize("kind", ["dnn", "random"])
@pytest.mark.parametrize("n", SIZES)
def test_bench_kernel(benchmark, kind, n):
    """The Numba kernel (compiled beforehand)."""
    t = make_trace(kind, n)
    benchmark.group = f"bestfit {kind} {n}"
    benchmark.extra_info.update(blocks=len(t), max_live_bytes=t.max_live_bytes)
    offsets = benchmark(bestfit_kernel, t.lower, t.upper, t.size)
    benchmark.extra_info["arena_over_max_live"] = float((offsets + t.size).max() / t.max_live_bytes)


@pytest.mark.parametrize("kind", ["dnn", "random"])
@pytest.mark.parametrize("n", SIZES)
def test_bench_reference(benchmark, kind, n):
    """The plain-Python reference, once per size above 1,000 blocks; it must agree with the kernel."""
    if n > 10_000 and not os.environ.get("MEMBUDGET_BENCH_REFERENCE_50K"):
        pytest.skip("the reference takes many minutes at 50,000 blocks (MEMBUDGET_BENCH_REFERENCE_50K=1 runs it)")
    t = make_trace(kind, n)
    benchmark.group = f"bestfit {kind} {n}"
    benchmark.extra_info.update(blocks=len(t))
    offsets = benchmark.pedantic(bestfit_reference, args=(t.lower, t.upper, t.size), rounds=1 if n > 1_000 else 3)
    assert np.array_equal(offsets, bestfit_kernel(t.lower, t.upper, t.size))


@pytest.mark.parametrize("kind", ["dnn", "random"])
@pytest.mark.parametrize("n", SIZES)
def test_bench_allocator_rounds(benchmark, kind, n):
    """What ``bestfit`` runs by default: canonical times and the squeaky-wheel rounds
    (``membudget_bestfit.improve``, at most 32 passes of the kernel)."""
    from membudget_bestfit import BestFit

    t = make_trace(kind, n)
    benchmark.group = f"bestfit {kind} {n}"
    offsets = benchmark.pedantic(BestFit().offsets, args=(t,), rounds=3)
    benchmark.extra_info["arena_over_max_live"] = float((offsets + t.size).max() / t.max_live_bytes)
