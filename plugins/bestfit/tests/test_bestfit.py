"""bestfit: conformance, against the CP-SAT optimum, against the caching model and max-live."""

from __future__ import annotations

import numpy as np
import pytest

from harness.allocators.caching import CachingAllocator
from harness.allocators.trace import IntTrace, to_int_trace
from harness.testing import registered_by_entry_point
from harness.testing_allocators import AllocatorConformance, dnn_inference_trace, dnn_training_trace
from membudget_bestfit import BestFit


class TestBestFitConformance(AllocatorConformance):
    allocator = BestFit()
    max_examples = 100


class TestBestFitReferenceConformance(AllocatorConformance):
    allocator = BestFit(kernel="python")
    max_examples = 40


class TestBestFitPaperOnlyConformance(AllocatorConformance):
    allocator = BestFit(paper_only=True)
    max_examples = 40


def test_registered_by_its_entry_point():
    """The distribution names its module in the ``membudget`` group; the hook registers ``bestfit``."""
    assert isinstance(registered_by_entry_point("bestfit", "membudget-bestfit", "allocator"), BestFit)


def test_rejects_unknown_kernel():
    with pytest.raises(ValueError):
        BestFit(kernel="cuda")


# --------------------------------------------------------------------------- vs the optimum


def small_random_instances(count=200, seed=2024):
    """``count`` random traces of 3-12 blocks, sizes 1-16, lifetimes 1-n long in a 2n horizon."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(3, 13))
        lo = rng.integers(0, 2 * n, n)
        yield IntTrace(lo, lo + rng.integers(1, n + 1, n), rng.integers(1, 17, n))


def small_dnn_instances():
    """30 DNN-like traces: training and inference, 2-4 layers, seeds 0-4 (7-27 blocks)."""
    for layers in (2, 3, 4):
        for seed in range(5):
            yield to_int_trace(dnn_training_trace(seed, layers=layers))
            yield to_int_trace(dnn_inference_trace(seed, layers=layers))


def compare_with_optimum(instances):
    """(instances, equal, worst ratio, mean ratio) of best-fit's arena over the proved optimum."""
    pytest.importorskip("ortools")
    from harness.allocators.exact import solve_exact

    ratios = []
    for t in instances:
        opt = solve_exact(t, time_limit_s=60)
        assert opt.optimal, "CP-SAT should settle these small instances"
        arena = BestFit().place(t).arena_bytes
        assert arena >= opt.arena_bytes  # nothing beats the optimum
        ratios.append(arena / opt.arena_bytes)
    ratios = np.array(ratios)
    return len(ratios), int((ratios == 1.0).sum()), float(ratios.max()), float(ratios.mean())


def test_bestfit_vs_optimum_on_200_small_random_instances():
    """Measured: best-fit (default rounds) equals the optimum on all 200. The paper's single
    pass: 198 of 200 (99%), worst 1.281, mean 1.002 (on the times as given, without
    ``canonical_times``: 188 of 200, worst 4/3, mean 1.007).

    Best-fit is a heuristic; the rounds stop at max-live or after 32 tries, so optimality
    here is measured, not guaranteed: the test allows a few misses (>= 195) and no worse
    ratio than the paper's pass reached.
    """
    n, equal, worst, mean = compare_with_optimum(small_random_instances())
    assert n == 200
    assert equal >= 195, f"best-fit optimal on only {equal}/200"
    assert worst <= 4 / 3 + 1e-12 and mean <= 1.01


def test_bestfit_vs_optimum_on_30_small_dnn_like_traces():
    """Measured: optimal on all 30 (the paper's single pass: 29 of 30, the other 2.3% above,
    where the optimum is max-live; on the times as given: 28 of 30, 2.3% and 2.8% above).
    """
    n, equal, worst, mean = compare_with_optimum(small_dnn_instances())
    assert n == 30
    assert equal >= 29 and worst <= 1.03


# --------------------------------------------------------------------------- DNN-like traces


SEEDS = range(30)


def dnn_cases():
    """180 traces: training and inference, 20/40/80 layers, seeds 0-29."""
    for make in (dnn_training_trace, dnn_inference_trace):
        for layers in (20, 40, 80):
            for seed in SEEDS:
                yield make.__name__, layers, seed, make(seed, layers=layers)


@pytest.fixture(scope="module")
def dnn_results():
    """(kind, layers, seed) -> (best-fit fragmentation, best-fit arena, caching arena)."""
    best, caching, paper = BestFit(), CachingAllocator(), BestFit(paper_only=True)
    out = {}
    for kind, layers, seed, trace in dnn_cases():
        b = best.place(trace)
        out[kind, layers, seed] = (b.fragmentation, b.arena_bytes, caching.place(trace).arena_bytes,
                                   paper.place(trace).arena_bytes)
    return out


def test_bestfit_never_needs_more_than_the_caching_model(dnn_results):
    """On all 180 DNN-like traces (measured: the caching model needs 1.5%-52% more than max-live)."""
    worse = [key for key, (_, best, caching, _) in dnn_results.items() if best > caching]
    assert not worse


def test_bestfit_within_2pct_of_max_live(dnn_results):
    """Inference traces and training traces of 40 and 80 layers: all within 2% of max-live.

    Measured: inference always exactly at max-live; training at most 0.10% (40 layers)
    and 0.09% (80 layers) above it (the paper's single pass: 0.32% and 0.12%).
    """
    over = {key: frag for key, (frag, _, _, _) in dnn_results.items()
            if (key[0] == "dnn_inference_trace" or key[1] >= 40) and frag > 1.02}
    assert not over


def test_bestfit_on_short_training_traces_measured(dnn_results):
    """20-layer training traces: measured 29 of 30 within 2%; seed 2 is 2.3% above (the
    paper's single pass: 28 of 30, seeds 2 and 28 at 3.2% and 3.4%).

    Best-fit's skyline leaves a hole when a forward-pass block lifts an offset line that
    the backward pass's blocks then sit on; in a short network that hole is a larger share
    of the total. The test records the measured rate instead of claiming 2% everywhere.
    """
    frags = np.array([dnn_results["dnn_training_trace", 20, s][0] for s in SEEDS])
    assert (frags <= 1.02).sum() >= 29
    assert frags.max() <= 1.03


# --------------------------------------------------------------------------- the extension


def test_rounds_never_worse_than_the_papers_pass(dnn_results):
    """The squeaky-wheel rounds keep the smallest arena; round 1 is the paper's pass."""
    worse = [key for key, (_, best, _, paper) in dnn_results.items() if best > paper]
    assert not worse


def test_one_round_is_the_papers_pass():
    t = to_int_trace(dnn_training_trace(2, layers=20))
    assert np.array_equal(BestFit(rounds=1).offsets(t), BestFit(paper_only=True).offsets(t))


def test_rounds_close_the_gap_the_papers_pass_leaves():
    """20-layer training trace, seed 2: the paper's pass leaves a hole (arena above
    max-live); the rounds place it lower. Numba kernel and Python reference agree."""
    t = to_int_trace(dnn_training_trace(2, layers=20))
    paper = BestFit(paper_only=True).place(t).arena_bytes
    rounds = BestFit().offsets(t)
    assert paper > t.max_live_bytes
    assert int((rounds + t.size).max()) < paper
    assert np.array_equal(rounds, BestFit(kernel="python").offsets(t))


def test_rounds_stop_at_max_live():
    """A trace the paper's pass already places at max-live takes one round."""
    from membudget_bestfit import squeaky_wheel

    t = to_int_trace(dnn_inference_trace(0, layers=10))
    off, done, timed_out = squeaky_wheel(t.lower, t.upper, t.size, lower_bound=t.max_live_bytes)
    assert done == 1 and not timed_out and int((off + t.size).max()) == t.max_live_bytes


def test_rejects_no_rounds():
    with pytest.raises(ValueError):
        BestFit(rounds=0)


def _a_trace_that_takes_rounds() -> IntTrace:
    """Random lifetimes: the paper's pass leaves it above max-live and the rounds go on (all 32)."""
    rng = np.random.default_rng(0)
    lower = rng.integers(0, 600, 300)
    return IntTrace(lower, lower + rng.integers(1, 301, 300), rng.integers(1, 17, 300))


def test_a_time_limit_ends_the_rounds_after_the_first():
    """QA: on 100,000 random blocks the 32 rounds took 25 s, and ``minisearch``'s time limit did
    not bound them. A time limit of 0 leaves the paper's pass alone, and says so."""
    t = _a_trace_that_takes_rounds()
    unbounded = BestFit().rounds_run(t)
    assert unbounded.done > 1 and not unbounded.timed_out
    cut = BestFit(time_limit=0).rounds_run(t)
    assert cut.done == 1 and cut.timed_out
    assert np.array_equal(cut.offsets, BestFit(paper_only=True).offsets(t))
    assert "1 round(s), ended by the time limit" in BestFit().place(t, time_limit=0).notes
    assert f"{unbounded.done} round(s)" in BestFit().place(t).notes
    assert BestFit().rounds_run(t, rounds=2).done == 2


def test_options_are_checked():
    with pytest.raises(ValueError, match="time_limit must be a number of seconds >= 0"):
        BestFit(time_limit=-1)
    with pytest.raises(ValueError, match="rounds must be an integer of at least 1, got 'many'"):
        BestFit().place(_a_trace_that_takes_rounds(), rounds="many")
    with pytest.raises(TypeError, match="bestfit has no option 'node_limit'; its options: time_limit, rounds"):
        BestFit().place(_a_trace_that_takes_rounds(), node_limit=5)
    assert BestFit().rounds_run(_a_trace_that_takes_rounds(), rounds=3.0).done <= 3


def test_an_interrupt_after_the_first_round_leaves_the_best_placement(monkeypatch):
    """Ctrl-C during the rounds: the interrupt carries the best placement of the rounds done."""
    from harness.allocators.validate import violations
    from membudget_bestfit import improve

    t = _a_trace_that_takes_rounds()
    calls = []

    kernel = improve.bestfit_kernel

    def second_round_interrupted(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return kernel(*args)

    monkeypatch.setattr(improve, "bestfit_kernel", second_round_interrupted)
    with pytest.raises(KeyboardInterrupt) as caught:
        BestFit().place(t)
    best = caught.value.placement
    assert np.array_equal(best.offsets, BestFit(paper_only=True).offsets(t)) and not violations(t, best)
    assert best.notes.endswith("1 round(s)") and len(calls) == 2


def test_compiling_the_kernel_is_not_counted_in_the_time_limit(monkeypatch):
    """Review: with an empty Numba cache the kernel's compilation (about 10 s) used up the time limit, so
    only the first round ran. The clock starts once the kernel is compiled (a slow compile stands in)."""
    import time

    import membudget_bestfit

    real = membudget_bestfit.compile_kernels
    monkeypatch.setattr(membudget_bestfit, "compile_kernels", lambda: (time.sleep(0.5), real()))
    run = BestFit(time_limit=0.3).rounds_run(_a_trace_that_takes_rounds())
    assert run.done > 1
