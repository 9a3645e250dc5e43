"""papers/003 sections 4.1-4.3 as an API: profile, plan, serve, interrupt/resume, re-optimise."""

from __future__ import annotations

import random

import pytest

from harness.allocators.validate import violations
from membudget_bestfit import BestFit, ProfileGuidedSession

MiB = 1 << 20


def training_program(sizes, workspace=MiB):
    """One iteration: forward allocations, a workspace per layer, frees in reverse order."""
    prog = []
    for i, s in enumerate(sizes):
        prog += [("alloc", f"ws{i}", workspace), ("alloc", f"a{i}", s), ("free", f"ws{i}")]
    for i in reversed(range(len(sizes))):
        prog += [("alloc", f"g{i}", sizes[i]), ("free", f"a{i}")]
        if i + 1 < len(sizes):
            prog.append(("free", f"g{i + 1}"))
    prog.append(("free", "g0"))
    return prog


def run_iteration(session, program, nonhot=None):
    """Play ``program`` in one iteration; check that live planned allocations never overlap.

    ``nonhot(rng)`` returns extra sizes requested (and freed) inside interrupt/resume after
    the first forward allocation.
    """
    session.begin_iteration()
    live, served = {}, []
    for step, op in enumerate(program):
        if op[0] == "alloc":
            a = session.malloc(op[2])
            live[op[1]] = a
            served.append(a)
            if a.region == "plan":
                for other in live.values():
                    if other is not a and other.region == "plan":
                        assert a.offset + a.size <= other.offset or other.offset + other.size <= a.offset
            if nonhot is not None and step == 1:
                with session.unmonitored():
                    extra = [session.malloc(s) for s in nonhot]
                    for e in extra:
                        assert e.region == "pool" and e.index is None
                    for e in extra:
                        session.free(e)
        else:
            session.free(live.pop(op[1]))
    replanned = session.end_iteration()
    return served, replanned


def test_hot_loop_profiles_once_then_serves_planned_offsets():
    prog = training_program([8 * MiB, 16 * MiB, 4 * MiB, 32 * MiB])
    s = BestFit().session()
    served, replanned = run_iteration(s, prog)
    assert replanned and all(a.region == "pool" for a in served)  # the sample run
    assert s.plan is not None and s.stats.optimizations == 1
    plan = s.plan
    for _ in range(3):
        served, replanned = run_iteration(s, prog)
        assert not replanned
        assert all(a.region == "plan" for a in served)
        assert [a.offset for a in served] == [plan.offsets[a.index] for a in served]  # x_lambda
    assert s.stats.reoptimizations == 0 and s.stats.pooled == len(served)  # only the sample run
    trace = s.profile_trace()
    assert not violations(trace, plan) and s.arena_bytes == plan.arena_bytes == trace.max_live_bytes
    assert s.total_bytes == s.arena_bytes + s.pool_bytes


def test_profile_counts_time_as_section_4_1():
    s = ProfileGuidedSession()
    s.begin_iteration()
    a = s.malloc(10)
    b = s.malloc(20)
    s.free(a)
    c = s.malloc(30)
    s.free(c)
    s.free(b)
    s.end_iteration()
    t = s.profile_trace()
    # lambda order of requests; y = 1, 2 (allocs), 3 (free a), 4 (alloc c), 5, 6
    assert t.lower.tolist() == [1, 2, 4] and t.upper.tolist() == [3, 6, 5]
    assert [a.index, b.index, c.index] == [0, 1, 2]


def test_interrupted_part_goes_to_the_pool_and_is_not_planned():
    prog = training_program([4 * MiB, 4 * MiB, 8 * MiB])
    s = BestFit().session()
    rng = random.Random(0)
    nonhot = [[rng.randrange(1, 64) * MiB for _ in range(3)] for _ in range(5)]
    run_iteration(s, prog, nonhot=nonhot[0])
    planned_blocks = len(s.profile_trace())
    for sizes in nonhot[1:]:  # the non-hot part asks for different sizes each time
        served, replanned = run_iteration(s, prog, nonhot=sizes)
        assert not replanned and all(a.region == "plan" for a in served)
    assert planned_blocks == len([op for op in prog if op[0] == "alloc"])
    assert s.stats.reoptimizations == 0 and s.stats.unmonitored == 15
    assert s.pool_bytes >= max(sum(sizes) for sizes in nonhot[1:])


def test_larger_request_is_pooled_then_reoptimised():
    sizes = [8 * MiB, 16 * MiB, 4 * MiB]
    s = BestFit().session()
    run_iteration(s, training_program(sizes))
    first_arena = s.arena_bytes
    bigger = training_program([8 * MiB, 24 * MiB, 4 * MiB])
    served, replanned = run_iteration(s, bigger)
    assert replanned and s.stats.reoptimizations == 1
    assert any(a.region == "pool" for a in served) and any(a.region == "plan" for a in served)
    assert s.arena_bytes > first_arena
    served, replanned = run_iteration(s, bigger)  # now planned for
    assert not replanned and all(a.region == "plan" for a in served)
    # a smaller request than planned needs no re-optimisation
    served, replanned = run_iteration(s, training_program(sizes))
    assert not replanned and all(a.region == "plan" for a in served)


def test_more_requests_than_planned_trigger_reoptimisation():
    s = BestFit().session()
    run_iteration(s, training_program([MiB, MiB]))
    served, replanned = run_iteration(s, training_program([MiB, MiB, MiB]))
    assert replanned and any(a.region == "pool" for a in served)
    assert any("beyond" in r for r in s.stats.reasons)
    served, replanned = run_iteration(s, training_program([MiB, MiB, MiB]))
    assert not replanned and all(a.region == "plan" for a in served)


def test_changed_lifetimes_are_detected_and_replanned():
    """Same sizes, but a block now outlives the one planned into its addresses."""
    s = BestFit().session()
    hot = [("alloc", "x", 4), ("free", "x"), ("alloc", "y", 4), ("free", "y")]
    run_iteration(s, hot)
    assert s.arena_bytes == 4  # x and y share addresses
    not_hot = [("alloc", "x", 4), ("alloc", "y", 4), ("free", "x"), ("free", "y")]
    served, replanned = run_iteration(s, not_hot)
    assert [a.region for a in served] == ["plan", "pool"] and replanned
    assert any("still in use" in r for r in s.stats.reasons)
    served, replanned = run_iteration(s, not_hot)
    assert not replanned and [a.region for a in served] == ["plan", "plan"] and s.arena_bytes == 8


def test_outside_iterations_nothing_is_monitored():
    s = BestFit().session()
    w = s.malloc(100)  # weights, before the loop
    assert w.region == "pool" and w.index is None and not s.monitoring
    run_iteration(s, [("alloc", "a", 10), ("free", "a")])
    assert len(s.profile_trace()) == 1


def test_misuse_is_refused():
    s = BestFit().session()
    with pytest.raises(RuntimeError):
        s.end_iteration()
    with pytest.raises(RuntimeError):
        s.resume()
    s.begin_iteration()
    with pytest.raises(RuntimeError):
        s.begin_iteration()
    a = s.malloc(5)
    s.free(a)
    with pytest.raises(ValueError):
        s.free(a)
    with pytest.raises(ValueError):
        s.malloc(-1)


def test_a_request_one_byte_larger_than_planned_departs():
    """Served at its planned offset, a request larger than its block would run into the block planned
    next to it (section 4.3: a larger request is served from the pool and the plan is recomputed)."""
    s = BestFit().session()
    both = [("alloc", "a", 100), ("alloc", "b", 100), ("free", "a"), ("free", "b")]
    run_iteration(s, both)
    assert s.arena_bytes == 200
    served, replanned = run_iteration(s, [("alloc", "a", 101), ("alloc", "b", 100), ("free", "a"), ("free", "b")])
    assert [a.region for a in served] == ["pool", "plan"] and replanned
    assert any("101 bytes > 100 planned" in r for r in s.stats.reasons)


def test_a_planned_request_that_would_end_one_byte_past_the_arena_departs():
    """``capacity`` is the real arena's size: a planned block that ends past it is a departure."""
    s = BestFit().session()
    both = [("alloc", "a", 100), ("alloc", "b", 100), ("free", "a"), ("free", "b")]
    run_iteration(s, both)
    s.capacity = s.arena_bytes - 1
    served, replanned = run_iteration(s, both)
    ends = [a.offset + a.size for a in served if a.region == "plan"]
    assert ends == [100] and replanned  # the block ending at 200 went to the pool
    assert any("beyond the arena's 199 bytes" in r for r in s.stats.reasons)


def test_a_replan_keeps_each_request_at_the_largest_size_it_had():
    """Section 4.3 keeps every lambda's largest size: a re-plan caused by one request does not shrink
    another that was smaller in the iteration it re-planned from, so the sizes can alternate without
    a departure once each has been seen."""
    s = BestFit().session()

    def program(a, b):
        return [("alloc", "a", a), ("alloc", "b", b), ("free", "a"), ("free", "b")]

    run_iteration(s, program(300, 100))
    served, replanned = run_iteration(s, program(200, 400))  # b departs, a is smaller
    assert [a.region for a in served] == ["plan", "pool"] and replanned
    for sizes in [(300, 100), (200, 400), (300, 400)]:
        served, replanned = run_iteration(s, program(*sizes))
        assert not replanned and [a.region for a in served] == ["plan", "plan"]
    assert s.stats.reoptimizations == 1 and s.arena_bytes == 700


def test_a_request_that_grows_within_its_aligned_size_stays_planned():
    """Planned sizes are rounded up to the alignment (CUDA's 512 bytes): a request of 1000 bytes
    where 513 were profiled fits the 1024 planned for it."""
    s = BestFit().session(alignment=512)
    run_iteration(s, [("alloc", "a", 513), ("alloc", "b", 512), ("free", "a"), ("free", "b")])
    served, replanned = run_iteration(s, [("alloc", "a", 1000), ("alloc", "b", 512), ("free", "a"), ("free", "b")])
    assert not replanned and [a.region for a in served] == ["plan", "plan"]
    assert all(a.offset % 512 == 0 for a in served) and s.arena_bytes == 1536


def test_the_pool_merges_a_freed_block_with_both_neighbours_and_gives_its_top_back():
    """The dynamic pool is first fit over a free list that merges neighbours: its high-water mark
    (``pool_bytes``) grows only when no free stretch fits. Requests outside iterations go to it."""
    s = BestFit().session()
    a, b, c = (s.malloc(1024) for _ in range(3))
    s.free(b)
    s.free(a)  # merges with b, after it
    d = s.malloc(2048)
    assert d.offset == 0 and s.pool_bytes == 3072
    s.free(d)
    s.free(c)  # the whole pool is free again, its top back at 0
    e = s.malloc(1024)
    f = s.malloc(4096)
    assert (e.offset, f.offset) == (0, 1024) and s.pool_bytes == 5120
