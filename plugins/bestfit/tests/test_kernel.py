"""The Numba kernel and the plain-Python reference of best-fit make the same choices."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.allocators.trace import IntTrace, max_live_bytes, to_int_trace
from harness.allocators.validate import violations
from harness.testing_allocators import dnn_inference_trace, dnn_training_trace, memory_traces
from membudget_bestfit import bestfit_kernel, bestfit_offsets, bestfit_reference
from membudget_bestfit._kernels import active_blocks, canonical_times, paper_priority


def both(lower, upper, size):
    lo, up, sz = (np.asarray(a, dtype=np.int64) for a in (lower, upper, size))
    return bestfit_kernel(lo, up, sz), bestfit_reference(lo, up, sz)


def test_walkthrough_like_figure_1():
    """Longest lifetime first; ties by size; the lowest, then leftmost, offset line.

    A [0,10) 2 goes first at 0; B and C both live 3, B is larger: B on the line at 2;
    the lines are now [0,2)@2, [2,5)@5, [5,10)@2: the leftmost lowest takes D, then
    [5,10)@2 takes C.
    """
    k, r = both([0, 2, 6, 0], [10, 5, 9, 2], [2, 3, 1, 1])
    assert k.tolist() == r.tolist() == [0, 2, 2, 2]


def test_lift_up_merges_with_both_equal_neighbours():
    """The line [4,6)@1 holds no block: it is lifted to 3 and merged with both neighbours."""
    k, r = both([0, 0, 6, 3], [10, 4, 10, 7], [1, 2, 2, 1])
    assert k.tolist() == r.tolist() == [0, 1, 1, 3]


def test_lift_up_to_the_lower_neighbour_only():
    """A [0,10) goes first; C [5,10) and E [2,7) both live 5, C is larger: C @1.

    [0,5)@1 takes B [0,3); the lines are [0,3)@3, [3,5)@1, [5,10)@5. [3,5)@1 holds no
    block: lifted to the lower neighbour (3, the left one) and merged with it only;
    [0,5)@3 holds none either: lifted to 5 and merged with [5,10)@5, where E goes.
    """
    k, r = both([0, 0, 5, 2], [10, 3, 10, 7], [1, 2, 4, 1])
    assert k.tolist() == r.tolist() == [0, 1, 1, 5]


def test_longest_lifetime_wins_over_size():
    """[0,4)@1 can take B [0,2) or D [1,4): D lives longer and goes first."""
    k, r = both([0, 0, 4, 1], [8, 2, 8, 4], [1, 2, 4, 1])
    assert k.tolist() == r.tolist() == [0, 2, 1, 1]


def test_blocks_that_occupy_nothing_get_offset_zero():
    k, r = both([0, 1, 2], [4, 1, 3], [5, 7, 0])
    assert k.tolist() == r.tolist() == [0, 0, 0]
    assert bestfit_kernel(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)).size == 0


def random_traces(count, seed):
    """Seeded random traces of several shapes: short and long lifetimes, equal lowers, big sizes."""
    rng = np.random.default_rng(seed)
    for k in range(count):
        n = int(rng.integers(0, 120))
        shape = k % 4
        if shape == 0:  # many equal times
            lo = rng.integers(0, 10, n)
            up = lo + rng.integers(0, 6, n)
        elif shape == 1:  # long and short lifetimes mixed
            lo = rng.integers(0, 4 * n + 1, n)
            up = lo + rng.geometric(0.05, n)
        elif shape == 2:  # nested, stack-like
            lo = np.sort(rng.integers(0, 2 * n + 1, n))
            up = 4 * n + 2 - lo + rng.integers(0, 3, n)
        else:  # byte sizes of tensors
            lo = rng.integers(0, 50, n)
            up = lo + rng.integers(1, 50, n)
        size = rng.integers(0, 1 << rng.integers(1, 30), n)
        yield IntTrace(lo, up, size)


def test_kernel_equals_reference_on_300_seeded_random_traces():
    count = 0
    for t in random_traces(300, seed=11):
        k, r = both(t.lower, t.upper, t.size)
        assert k.tolist() == r.tolist(), t.rows()
        assert not violations(t, k.tolist())
        count += 1
    assert count == 300


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memory_traces(max_blocks=60))
def test_kernel_equals_reference_on_hypothesis_traces(blocks):
    t = to_int_trace(blocks)
    k, r = both(t.lower, t.upper, t.size)
    assert k.tolist() == r.tolist()


@pytest.mark.parametrize("seed", range(3))
def test_kernel_equals_reference_on_dnn_like_traces(seed):
    for blocks in (dnn_training_trace(seed, layers=40), dnn_inference_trace(seed, layers=40)):
        t = to_int_trace(blocks)
        k, r = both(t.lower, t.upper, t.size)
        assert k.tolist() == r.tolist()


def test_bestfit_offsets_picks_the_implementation():
    t = next(random_traces(1, seed=5))
    assert bestfit_offsets(t.lower, t.upper, t.size, kernel="python").tolist() == bestfit_offsets(
        t.lower, t.upper, t.size
    ).tolist()
    with pytest.raises(ValueError):
        bestfit_offsets(t.lower, t.upper, t.size, kernel="fortran")


# --------------------------------------------------------------------------- canonical times


def test_canonical_times_merge_runs_of_allocations_and_of_frees():
    """A,C,E allocated at one instant and ordered by trace position: best-fit (the paper's
    single pass) lifts a line over nothing (arena 12) unless the order, which changes no
    overlap, is taken away (11).

    Float trace: A 3 [0,1), B 1 [1,3), C 5 [0,3), D 3 [2,3), E 3 [0,2); max-live 11.
    """
    lower, upper, size = [1, 5, 2, 7, 3], [4, 8, 9, 10, 6], [3, 1, 5, 3, 3]  # to_int_trace's times
    lo, up = canonical_times(lower, upper, size)
    assert lo.tolist() == [0, 1, 0, 2, 0] and up.tolist() == [1, 3, 3, 3, 2]
    raw = bestfit_offsets(lower, upper, size, canonical=False, paper_only=True)
    assert int((raw + size).max()) == 12
    for kernel in ("numba", "python"):
        off = bestfit_offsets(lower, upper, size, kernel=kernel, paper_only=True)
        assert int((off + size).max()) == 11 == max_live_bytes(IntTrace(lower, upper, size))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memory_traces(max_blocks=40))
def test_canonical_times_keep_every_overlap(blocks):
    t = to_int_trace(blocks)
    lo, up = canonical_times(t.lower, t.upper, t.size)
    active = (t.size > 0) & (t.upper > t.lower)
    assert (up[active] > lo[active]).all()
    before = (t.lower[:, None] < t.upper[None, :]) & (t.lower[None, :] < t.upper[:, None])
    after = (lo[:, None] < up[None, :]) & (lo[None, :] < up[:, None])
    both_active = active[:, None] & active[None, :]
    assert (before == after)[both_active].all()
    k = bestfit_offsets(t.lower, t.upper, t.size)
    assert k.tolist() == bestfit_offsets(t.lower, t.upper, t.size, kernel="python").tolist()
    assert not violations(t, k.tolist())


# --------------------------------------------------------------------------- other orders of preference


@st.composite
def trace_and_priority(draw):
    """A random trace and a random order of its active blocks (the extension's priorities)."""
    blocks = draw(memory_traces(max_blocks=30))
    t = to_int_trace(blocks)
    lo, up = canonical_times(t.lower, t.upper, t.size)
    active = [int(i) for i in active_blocks(lo, up, t.size)]
    return lo, up, t.size, draw(st.permutations(active))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=trace_and_priority())
def test_kernel_and_reference_agree_on_any_order_of_preference(case):
    """Any order of preference (not only the paper's): the same offsets, a valid placement."""
    lo, up, sz, priority = case
    k = bestfit_kernel(lo, up, sz, np.asarray(priority, dtype=np.int64))
    r = bestfit_reference(lo, up, sz, priority)
    assert k.tolist() == r.tolist()
    assert not violations(IntTrace(lo, up, sz), k)


def test_paper_priority_is_the_default_order():
    """Passing :func:`paper_priority` explicitly changes nothing, on a DNN-like trace too."""
    t = to_int_trace(dnn_training_trace(3, layers=12))
    lo, up = canonical_times(t.lower, t.upper, t.size)
    prio = paper_priority(lo, up, t.size)
    assert np.array_equal(bestfit_kernel(lo, up, t.size, prio), bestfit_kernel(lo, up, t.size))
    assert np.array_equal(bestfit_reference(lo, up, t.size, prio), bestfit_reference(lo, up, t.size))


def test_an_order_of_preference_changes_which_block_a_line_takes():
    """[0,4) can take B [0,2) or D [1,4): the paper takes D (longer); preferring B takes B."""
    lo, up, sz = (np.asarray(a, dtype=np.int64) for a in ([0, 0, 4, 1], [8, 2, 8, 4], [1, 2, 4, 1]))
    assert bestfit_kernel(lo, up, sz).tolist() == [0, 2, 1, 1]
    prefer_b = np.asarray([0, 1, 2, 3], dtype=np.int64)
    assert bestfit_kernel(lo, up, sz, prefer_b).tolist() == bestfit_reference(lo, up, sz, prefer_b).tolist()
    assert bestfit_kernel(lo, up, sz, prefer_b)[1] == 1 and bestfit_kernel(lo, up, sz, prefer_b)[3] == 3


def test_a_priority_must_hold_every_active_block_once():
    lo, up, sz = (np.asarray(a, dtype=np.int64) for a in ([0, 1, 2], [4, 3, 3], [5, 7, 0]))
    with pytest.raises(ValueError):
        bestfit_kernel(lo, up, sz, np.asarray([0], dtype=np.int64))
    with pytest.raises(ValueError):
        bestfit_reference(lo, up, sz, [0, 0])
