"""The exact solver (papers/003 eq. 1-6 by CP-SAT), and papers/001 section 6.1's sequence."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from harness.allocators._common import make_placement
from harness.allocators.first_fit import Cnmem, FirstFit
from harness.allocators.trace import IntTrace, as_int_trace, max_live_bytes
from harness.allocators.validate import violations
from harness.testing_allocators import paper001_sequence

pytest.importorskip("ortools")

from harness.allocators.exact import ExactAllocator, solve_exact  # noqa: E402

MiB = 1 << 20


def brute_force_optimum(t: IntTrace) -> int:
    """The smallest arena over every order of stacking blocks greedily (exact for tiny traces).

    Any optimal placement can be compacted so that each block rests on 0 or on a block
    below it; placing blocks in increasing order of offset, each at the lowest address
    free over its lifetime, reproduces it. So the minimum over all orders is the optimum.
    """
    n = len(t)
    best = None
    for order in itertools.permutations(range(n)):
        off = [0] * n
        for k, i in enumerate(order):
            x = 0
            placed = [j for j in order[:k] if t.lower[j] < t.upper[i] and t.lower[i] < t.upper[j]]
            moved = True
            while moved:
                moved = False
                for j in placed:
                    if x < off[j] + t.size[j] and off[j] < x + t.size[i]:
                        x = off[j] + int(t.size[j])
                        moved = True
            off[i] = x
        arena = max(off[i] + int(t.size[i]) for i in range(n))
        best = arena if best is None else min(best, arena)
    return best


def test_optimum_on_minimalloc_example():
    t = IntTrace(np.array([0, 3, 0, 9, 0]), np.array([3, 9, 9, 21, 21]), np.array([4, 4, 4, 4, 4]))
    res = solve_exact(t)
    assert res.optimal and res.arena_bytes == 12 and res.lower_bound_bytes == 12 and res.gap == 0
    assert not violations(t, list(res.offsets))


def test_optimum_matches_brute_force_on_tiny_traces():
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(1, 6))
        lo = rng.integers(0, 6, n)
        t = IntTrace(lo, lo + rng.integers(1, 5, n), rng.integers(1, 7, n))
        res = solve_exact(t)
        assert res.optimal
        assert res.arena_bytes == brute_force_optimum(t)


def test_pool_feasibility_and_gcd_scaling():
    t = IntTrace(np.array([0, 0, 1]), np.array([2, 1, 2]), np.array([3 * MiB, 2 * MiB, 2 * MiB]))
    assert solve_exact(t).arena_bytes == 5 * MiB
    assert solve_exact(t, pool_bytes=5 * MiB).status == "optimal"
    res = solve_exact(t, pool_bytes=5 * MiB - 1)
    assert res.status == "infeasible" and res.offsets is None and res.scale == MiB


def test_exact_allocator_placement_and_notes():
    t = IntTrace(np.array([0, 3, 0, 9, 0]), np.array([3, 9, 9, 21, 21]), np.array([4, 4, 4, 4, 4]))
    p = ExactAllocator().place(t)
    assert p.optimal is True and p.arena_bytes == 12 and p.notes.startswith("optimal")


def test_the_notes_report_the_time_limit_of_the_call():
    """``place(time_limit=...)`` (``membudget place --option time_limit=...``) overrides the
    allocator's own limit, and an answer not proved optimal says which limit it had."""
    rng = np.random.default_rng(3)
    lower = rng.integers(0, 200, 150)
    t = IntTrace(lower, lower + rng.integers(1, 60, 150), rng.integers(1000, 64000, 150))
    p = ExactAllocator(time_limit_s=10.0).place(t, time_limit=0.01)
    assert p.notes.startswith("optimal") if p.optimal else (p.notes.startswith("best found in ")
                                                            and "(time limit 0.01 s)" in p.notes)


def _interrupt_after(seconds: float):
    """A timer that raises KeyboardInterrupt in the main thread, as Ctrl-C does (with Python's own SIGINT
    handler: interrupt_main does nothing where an earlier test's library set another); its ``cancel``
    puts the old handler back."""
    import _thread
    import signal
    import threading

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.start()
    stop = timer.cancel

    def cancel():
        stop()
        signal.signal(signal.SIGINT, previous)

    timer.cancel = cancel
    return timer


def test_an_interrupt_stops_the_search_at_once_and_leaves_the_best_placement():
    """QA: Ctrl-C and SIGTERM waited for CP-SAT's time limit (60 s), then lost its answer. The solve now
    runs in a thread, so the interrupt reaches the main one, stops the search, and goes on with the best
    placement found on the exception (``placement``) for ``membudget place`` to print."""
    rng = np.random.default_rng(3)
    lower = rng.integers(0, 200, 400)  # CP-SAT proves nothing about it in 8 s
    t = IntTrace(lower, lower + rng.integers(1, 60, 400), rng.integers(1000, 64000, 400))
    # compiled and imported first, so that the interrupt lands in the search (a cold Numba cache took over 1 s)
    ExactAllocator().place(IntTrace(lower[:5], lower[:5] + 1, np.ones(5, np.int64)))
    timer = _interrupt_after(1.0)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            ExactAllocator().place(t, time_limit=60)
    finally:
        timer.cancel()
    # a solve in the main thread would have run its 60 s and met the interrupt after it, with nothing attached
    best = caught.value.placement
    assert len(best.offsets) == len(t) and not violations(t, best)
    assert best.arena_bytes >= max_live_bytes(t) and best.optimal is False


def test_a_model_cp_sat_refuses_says_so_and_keeps_the_heuristics_placement():
    """QA: two blocks of about 2**61 bytes: CP-SAT refuses the model (its arithmetic would overflow);
    the notes said 'best found in 10 s' after 2 ms."""
    t = IntTrace(np.array([0, 1]), np.array([5, 3]), np.array([2**61 - 1, 2**61 + 1]))
    p = ExactAllocator().place(t)
    assert "MODEL_INVALID" in p.notes and not violations(t, p) and p.arena_bytes == 2**62


def test_a_named_allocators_placement_seeds_the_search():
    """``hint=bestfit``: with no time to search, the answer is best-fit's placement where the built-in
    heuristic's (greedy-by-size or first-fit) is larger; never worse than best-fit's, and valid."""
    from harness.allocators.exact import _heuristic
    from harness.plugins import registry

    rng = np.random.default_rng(0)
    lower = rng.integers(0, 200, 150)
    t = IntTrace(lower, lower + rng.integers(1, 60, 150), rng.integers(1000, 64000, 150))
    bestfit = registry().allocator("bestfit").place(t).arena_bytes
    heuristic = int((_heuristic(t) + t.size).max())
    assert bestfit < heuristic  # the instance shows the difference
    exact = registry().allocator("exact")  # the built-ins hand it the registry's lookup
    unhinted = exact.place(t, time_limit=0)
    hinted = exact.place(t, time_limit=0, hint="bestfit")
    assert unhinted.arena_bytes == heuristic
    assert hinted.arena_bytes == bestfit and "hint: bestfit" in hinted.notes
    assert not violations(t, list(hinted.offsets))
    with pytest.raises(ValueError, match="another registered allocator"):
        exact.place(t, hint="exact")
    with pytest.raises(ValueError, match="hint: unknown allocator 'nope'"):
        exact.place(t, hint="nope")
    with pytest.raises(ValueError, match="without a way to find other allocators"):
        ExactAllocator().place(t, hint="bestfit")


class _StackOneApart:
    """An allocator written to the protocol (it iterates ``MemoryBlock``s): every block on the previous
    one, one byte apart, so no offset after the first is a multiple of the sizes' gcd."""

    name = "stack"

    def place(self, trace):
        offsets, top = [], 0
        for block in trace:
            offsets.append(top)
            top += block.size + 1
        return make_placement(self.name, as_int_trace(trace), offsets)


def test_a_hint_from_a_protocol_allocator_is_taken_and_named_with_its_arena():
    """The named allocator gets the blocks the protocol promises (it iterates them; an ``IntTrace`` made it
    fail), the answer is valid and no larger than its placement or the heuristic's, and the notes give
    the named allocator's arena."""
    from harness.allocators.exact import _heuristic

    t = IntTrace(np.array([0, 0, 0, 2, 2]), np.array([2, 2, 2, 4, 4]), np.array([4, 8, 12, 8, 4]) * MiB)
    hinted = ExactAllocator(find_allocator=lambda name: _StackOneApart()).place(t, time_limit=0, hint="stack")
    assert hinted.arena_bytes <= min(36 * MiB + 4, int((_heuristic(t) + t.size).max()))
    assert not violations(t, list(hinted.offsets))
    assert f"hint: stack ({36 * MiB + 4} bytes)" in hinted.notes


def test_a_hint_off_the_sizes_gcd_is_compacted_onto_it_not_dropped():
    """CP-SAT works in units of the sizes' gcd (1000 here). Best-fit's placement shifted by 500 bytes is off
    it; compacted, it is aligned and 500 bytes smaller, and with no time to search it is the answer (it
    used to be returned as it was, unaligned)."""
    from harness.allocators.exact import _heuristic
    from harness.plugins import registry

    rng = np.random.default_rng(0)
    lower = rng.integers(0, 200, 150)
    t = IntTrace(lower, lower + rng.integers(1, 60, 150), rng.integers(1, 64, 150) * 1000)
    shifted = np.asarray(registry().allocator("bestfit").place(t).offsets) + 500
    res = solve_exact(t, time_limit_s=0, hint=list(shifted))
    assert res.arena_bytes <= int((shifted + t.size).max()) - 500 < int((_heuristic(t) + t.size).max())
    assert all(o % 1000 == 0 for o in res.offsets) and not violations(t, list(res.offsets))


def test_compacting_a_placement_keeps_it_valid_aligned_and_no_larger():
    from harness.allocators.exact import _compacted

    rng = np.random.default_rng(5)
    for _ in range(50):
        n = int(rng.integers(1, 30))
        lower = rng.integers(0, 40, n)
        t = IntTrace(lower, lower + rng.integers(1, 15, n), rng.integers(1, 9, n) * 3)
        stacked = np.concatenate([[0], np.cumsum(t.size[:-1] + 1)])  # valid, one byte apart
        compact = _compacted(t, stacked, list(range(n)))
        assert not violations(t, [int(o) for o in compact])
        assert all(int(o) % 3 == 0 for o in compact)
        assert (compact + t.size).max() <= (stacked + t.size).max()


# --------------------------------------------------------------------------- papers/001 section 6.1


POOL = 12 * MiB


def test_paper001_sequence_fills_the_pool_before_every_free():
    blocks = paper001_sequence(POOL)
    assert len(blocks) == 10 and max_live_bytes(blocks) == POOL
    for j in range(1, 5):  # just before d_j, the live blocks are a_ik with i <= j <= k
        live = sum(b.size for b in blocks if int(b.name[1]) <= j <= int(b.name[2]))
        assert live == POOL


def test_paper001_no_placement_fits_the_pool():
    """The exact solver settles the paper's claim: no placement fits in P; the optimum is 13/12 P."""
    blocks = paper001_sequence(POOL)
    assert solve_exact(blocks, pool_bytes=POOL).status == "infeasible"
    best = solve_exact(blocks)
    assert best.optimal and best.arena_bytes == 13 * MiB


def test_paper001_first_fit_pool_needs_more_than_the_optimum():
    blocks = paper001_sequence(POOL)
    for alloc in (FirstFit(pool_bytes=POOL), Cnmem(pool_bytes=POOL)):
        p = alloc.place(blocks)
        assert p.arena_bytes == 14 * MiB and "grew 1" in p.notes  # does not fit; 7/6 P with growth
    assert FirstFit().place(blocks).arena_bytes == 14 * MiB


def test_time_limit_null_means_no_limit_as_for_minisearch(monkeypatch):
    """QA: ``--option time_limit=null`` meant no limit for minisearch and the 10 s default for exact."""
    import harness.allocators.exact as exact

    limits = []
    solve = exact.solve_exact
    monkeypatch.setattr(exact, "solve_exact", lambda *a, **k: limits.append(k["time_limit_s"]) or solve(*a, **k))
    t = IntTrace(np.array([0, 3, 0, 9, 0]), np.array([3, 9, 9, 21, 21]), np.array([4, 4, 4, 4, 4]))
    assert ExactAllocator(time_limit_s=7.0).place(t, time_limit=None).optimal
    ExactAllocator(time_limit_s=7.0).place(t)
    assert limits == [math.inf, 7.0]
    with pytest.raises(ValueError, match="or null: none"):
        ExactAllocator().place(t, time_limit=-1)
