"""minisearch: conformance, kernel = reference, the optimum (CP-SAT, known constructions), bounds, options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.allocators.trace import IntTrace, max_live_bytes, read_csv, to_int_trace, to_memory_blocks
from harness.allocators.validate import violations
from harness.model import Placement, from_json, to_json
from harness.testing import registered_by_entry_point
from harness.testing_allocators import AllocatorConformance, dnn_inference_trace, dnn_training_trace
from membudget_bestfit import BestFit
from membudget_minisearch import MiniSearch, solve
from membudget_minisearch._search import EXHAUSTED, FOUND, PAUSED, SearchKernel, prepare, search_reference
from membudget_minisearch.instances import cut_rectangle, cut_rectangle_dnn, random_instance

ROOT = Path(__file__).resolve().parents[3]
H100 = sorted((ROOT / "results" / "traces" / "h100").glob("trace-*.csv"))


# deterministic budgets: a node limit, no time limit (the result must not depend on the machine)
class TestMiniSearchConformance(AllocatorConformance):
    allocator = MiniSearch(time_limit=None, node_limit=20_000)
    max_examples = 80


class TestMiniSearchReferenceConformance(AllocatorConformance):
    allocator = MiniSearch(time_limit=None, node_limit=2_000, kernel="python")
    max_examples = 25
    max_blocks = 20
    dnn_layers = 3


def test_registered_by_its_entry_point():
    """The distribution names its module in the ``membudget`` group; the hook registers ``minisearch``."""
    assert isinstance(registered_by_entry_point("minisearch", "membudget-minisearch", "allocator"), MiniSearch)


# --------------------------------------------------------------------------- kernel = reference


def _kernel(inst, threshold, chunk=None):
    k = SearchKernel(inst, threshold)
    if chunk is None:
        k.advance(10**12)
    else:
        while k.advance(chunk) == PAUSED:
            pass
    return k.status, k.offsets, k.nodes, k.next_bound


@pytest.mark.parametrize("preference", ["lifetime", "size", "area", "start", "start-size", 7])
def test_kernel_visits_the_reference_nodes(preference):
    """On random instances, at every threshold up to the optimum: same status, offsets,
    node count and next bound; advancing the kernel in chunks of 7 nodes changes nothing."""
    thresholds = 0
    for seed in range(40):
        t = random_instance(int(np.random.default_rng(seed).integers(3, 11)), seed)
        inst = prepare(t.lower, t.upper, t.size, preference)
        T = inst.max_live - 1 - seed % 5  # below the optimum first: exhausted, the bound raised
        while True:
            ref = search_reference(inst, T)
            for chunk in (None, 7):
                got = _kernel(inst, T, chunk)
                assert (got[0], got[2], got[3]) == (ref[0], ref[2], ref[3]), (seed, T, chunk)
                if ref[0] == FOUND:
                    assert np.array_equal(got[1], ref[1])
            thresholds += 1
            if ref[0] == FOUND:
                assert not violations(IntTrace(inst.lower, inst.upper, inst.size), ref[1], T)
                break
            assert ref[0] == EXHAUSTED and T < ref[3] <= inst.max_live
            T = ref[3]
    assert thresholds > 40


def test_kernel_pauses_where_the_reference_does():
    t = random_instance(12, 3)
    inst = prepare(t.lower, t.upper, t.size)
    for limit in (1, 5, 50):
        deepest = {}
        ref = search_reference(inst, inst.max_live, limit, deepest)
        k = SearchKernel(inst, inst.max_live)
        status = k.advance(limit)
        assert (status, k.nodes) == (ref[0], ref[2])
        assert status != PAUSED or k.nodes == limit
        got = k.deepest
        assert got["depth"] == deepest["depth"]
        assert np.array_equal(got["placed"], deepest["placed"])
        assert np.array_equal(got["offsets"][got["placed"]], deepest["offsets"][deepest["placed"]])


def test_completing_the_deepest_partial_placement_is_valid():
    """The driver's completion of a partial placement (the deepest one under a threshold
    that was not reached) is a valid placement of every block."""
    from membudget_minisearch.solver import complete

    for seed in range(5):
        t = cut_rectangle(120, seed)
        inst = prepare(t.lower, t.upper, t.size)
        k = SearchKernel(inst, inst.max_live)
        k.advance(3_000)
        deep = k.deepest
        assert 0 < deep["depth"] <= inst.n
        full = complete(inst, deep["placed"], deep["offsets"])
        assert np.array_equal(full[deep["placed"]], deep["offsets"][deep["placed"]])
        assert not violations(IntTrace(inst.lower, inst.upper, inst.size), full)


# --------------------------------------------------------------------------- against the optimum


def test_proves_the_cp_sat_optimum_on_small_random_instances():
    """Run to the end (no limit), the search proves exactly CP-SAT's optimum; both kernels agree."""
    pytest.importorskip("ortools")
    from harness.allocators.exact import solve_exact

    for seed in range(60):
        n = int(np.random.default_rng(seed).integers(4, 13))
        t = random_instance(n, 100 + seed, max_len=1 + seed % 6, horizon=n // 2 + seed % 7)
        opt = solve_exact(t, time_limit_s=30)
        assert opt.optimal
        # from a poor incumbent (every block stacked), so that the search has work to do
        stacked = np.cumsum(t.size) - t.size
        res = solve(t.lower, t.upper, t.size, time_limit=None, incumbent=stacked)
        assert res.optimal and res.arena_bytes == opt.arena_bytes == res.lower_bound_bytes, seed
        assert res.thresholds >= 1 or res.incumbent_bytes == res.max_live_bytes
        assert not violations(t, res.offsets, res.arena_bytes)
        ref = solve(t.lower, t.upper, t.size, time_limit=None, kernel="python", incumbent=stacked)
        assert np.array_equal(ref.offsets, res.offsets) and ref.nodes == res.nodes


def test_portfolio_driver_same_with_either_kernel_under_a_node_limit():
    """The driver's slices, resumptions and midpoint questions under node limits: the
    reference (rerun with the larger budget) and the kernel (resumed) end in the same state."""
    for seed in range(6):
        t = cut_rectangle(24, seed, width=64, granule=1)
        stacked = np.cumsum(t.size) - t.size
        for limit in (5, 30, 200):
            a = solve(t.lower, t.upper, t.size, time_limit=None, node_limit=limit, incumbent=stacked,
                      slice_nodes=2)
            b = solve(t.lower, t.upper, t.size, time_limit=None, node_limit=limit, incumbent=stacked,
                      slice_nodes=2, kernel="python")
            assert np.array_equal(a.offsets, b.offsets), (seed, limit)
            assert (a.arena_bytes, a.lower_bound_bytes, a.nodes, a.thresholds) == \
                (b.arena_bytes, b.lower_bound_bytes, b.nodes, b.thresholds)
            assert a.nodes <= limit and not violations(t, a.offsets, a.arena_bytes)
            assert a.lower_bound_bytes <= 64 <= a.arena_bytes


@pytest.mark.parametrize("make,n,seeds", [
    (cut_rectangle, 30, range(4)),
    (cut_rectangle, 60, range(4)),
    (cut_rectangle_dnn, 40, range(4)),
    (cut_rectangle_dnn, 80, range(2)),
])
def test_reaches_the_known_optimum_of_cut_rectangles(make, n, seeds):
    """A rectangle cut into pieces: optimum = max-live = its width, proved (modest sizes;
    the larger ones are in the benchmark)."""
    for seed in seeds:
        t = make(n, seed)
        width = int(t.size[(t.lower == 0)].sum())
        res = solve(t.lower, t.upper, t.size, time_limit=None, node_limit=3_000_000)
        assert res.max_live_bytes == width
        assert res.optimal and res.arena_bytes == width, (make.__name__, n, seed, res)
        assert not violations(t, res.offsets, res.arena_bytes)


def test_states_its_gap_when_out_of_nodes():
    """A limit too small to settle a hard instance: the best-fit incumbent (or better), the
    max-live bound, and the gap between them, all consistent."""
    t = cut_rectangle(150, 0)
    res = solve(t.lower, t.upper, t.size, time_limit=None, node_limit=1_000)
    bf = BestFit().place(to_memory_blocks(t)).arena_bytes
    assert res.timed_out and not res.optimal
    assert res.lower_bound_bytes == res.max_live_bytes == (1 << 20) < res.arena_bytes <= bf
    assert res.gap == pytest.approx((res.arena_bytes - res.lower_bound_bytes) / res.arena_bytes)
    assert not violations(t, res.offsets, res.arena_bytes)


def test_time_limit_zero_keeps_the_incumbent():
    t = cut_rectangle(150, 1)
    res = solve(t.lower, t.upper, t.size, time_limit=0)
    assert res.timed_out and res.nodes == 0 and res.arena_bytes == res.incumbent_bytes
    assert res.lower_bound_bytes == res.max_live_bytes


# --------------------------------------------------------------------------- the allocator


def _dnn_traces():
    for seed in range(3):
        yield to_int_trace(dnn_training_trace(seed, layers=12))
        yield to_int_trace(dnn_inference_trace(seed, layers=12))


def test_never_above_best_fit_and_reports_its_bound():
    alloc = MiniSearch(time_limit=None, node_limit=50_000)
    for t in [*_dnn_traces(), *(random_instance(30, s, max_size=1000) for s in range(5))]:
        blocks = to_memory_blocks(t)
        p = alloc.place(blocks)
        assert not violations(blocks, p)
        assert p.arena_bytes <= BestFit().place(blocks).arena_bytes
        assert p.max_live_bytes <= p.lower_bound_bytes <= p.arena_bytes
        assert p.optimal == (p.lower_bound_bytes == p.arena_bytes)
        assert ("proved optimal" in p.notes) == p.optimal
        assert from_json(Placement, to_json(p)) == p


@pytest.mark.parametrize("path", H100, ids=lambda p: p.stem)
def test_real_h100_traces(path):
    """The committed CUDA traces: valid, at most best-fit, within 1% of the proved bound."""
    blocks = to_memory_blocks(read_csv(path))
    p = MiniSearch(time_limit=None, node_limit=20_000).place(blocks)
    assert not violations(blocks, p)
    assert p.arena_bytes <= BestFit().place(blocks).arena_bytes
    assert p.lower_bound_bytes >= p.max_live_bytes
    assert p.gap < 0.01


def test_deterministic_variant():
    from harness.testing_allocators import deterministic_variant

    d = deterministic_variant(MiniSearch(time_limit=3, preference="size"))
    assert d.settings == {"time_limit": None, "node_limit": 20_000, "kernel": "numba", "preference": "size"}
    assert deterministic_variant(BestFit()).__class__ is BestFit


def test_resnet50_training_trace_proved_at_max_live():
    """The hardest committed trace (673 blocks; best-fit 0.0087% above max-live): the
    portfolio's ``start`` order finds a placement at max-live, a proof of optimality."""
    path = [p for p in H100 if p.stem == "trace-resnet50-b32-training"]
    assert path, "results/traces/h100/trace-resnet50-b32-training.csv is committed: this check needs it"
    t = read_csv(path[0])
    res = solve(t.lower, t.upper, t.size, time_limit=None, node_limit=300_000)
    assert res.optimal and res.arena_bytes == res.max_live_bytes < res.incumbent_bytes
    assert not violations(t, res.offsets, res.arena_bytes)


def test_options_are_checked():
    with pytest.raises(TypeError, match="its options: time_limit"):
        MiniSearch().place([], time_limt=3)
    with pytest.raises(ValueError, match="time_limit"):
        MiniSearch(time_limit=-1)
    with pytest.raises(ValueError, match="node_limit"):
        MiniSearch(node_limit=1.5)
    assert MiniSearch(node_limit=1e6).settings["node_limit"] == 1_000_000
    with pytest.raises(ValueError, match="kernel"):
        MiniSearch(kernel="cuda")
    with pytest.raises(ValueError, match="preference"):
        MiniSearch().place([], preference="random")


def test_place_command_option(tmp_path):
    """``membudget place --option node_limit=...`` reaches the search; the report has the bound."""
    import io
    import json

    from harness.commands import place_command
    from harness.allocators.trace import write_csv

    class Reg:
        def allocator(self, name):
            return MiniSearch()

    path = tmp_path / "cut.csv"
    write_csv(cut_rectangle(30, 0), path)
    out = io.StringIO()
    assert place_command(path, "minisearch", True, registry=Reg(), stream=out,
                         options={"node_limit": 100_000, "time_limit": None}) == 0
    report = json.loads(out.getvalue())
    assert report["optimal"] is True and report["lower_bound_bytes"] == report["arena_bytes"] == 1 << 20
    assert report["gap"] == 0.0 and report["valid"]


def test_overlap_lists_are_every_intersecting_block_in_rank_order():
    """The sweep that builds the overlap lists (``overlapping_pairs``, ``_lists_by_rank``; it replaced an
    all-pairs test that took 8.5 s on 100,000 blocks) gives each block exactly the blocks whose lifetimes
    intersect its own, sorted by rank, for every order of preference."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        lower = rng.integers(0, 30, n)
        upper = lower + rng.integers(1, 10, n)
        for preference in ("lifetime", "size", "start", 5):
            inst = prepare(lower, upper, rng.integers(1, 100, n), preference)
            for i in range(n):
                want = [j for j in inst.order if j != i and inst.lower[j] < inst.upper[i]
                        and inst.lower[i] < inst.upper[j]]
                assert list(inst.neighbours(i)) == want


def test_an_interrupt_leaves_the_best_placement_found_so_far():
    """QA: Ctrl-C during a long search printed nothing. The interrupt now carries the best placement
    (``placement``), valid, for ``membudget place`` to print and write."""
    import _thread
    import signal
    import threading

    t = cut_rectangle_dnn(800, seed=1)  # not proved in 30 s
    MiniSearch().place(to_memory_blocks(cut_rectangle_dnn(20, seed=1)))  # compiled: the interrupt lands in the search
    # interrupt_main does nothing where SIGINT is not Python's (an earlier test's library may have set it)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            MiniSearch().place(to_memory_blocks(t), time_limit=60)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    best = caught.value.placement
    assert len(best.offsets) == len(t) and not violations(t, best)
    assert best.arena_bytes >= best.lower_bound_bytes >= t.max_live_bytes


def test_the_time_limit_bounds_best_fits_rounds_too(monkeypatch):
    """QA: on 100,000 random blocks best-fit's 32 rounds, the search's start, took 25 s whatever
    the time limit. With a limit of 0 the incumbent is best-fit's first round alone."""
    from membudget_bestfit import improve

    t = random_instance(300, seed=0)
    rounds = []
    kernel = improve.bestfit_kernel
    monkeypatch.setattr(improve, "bestfit_kernel", lambda *args: rounds.append(1) or kernel(*args))
    full = BestFit().rounds_run(t)
    assert full.done > 1, "the instance must take more than one round to test this"
    rounds.clear()
    res = solve(t.lower, t.upper, t.size, time_limit=0)
    assert len(rounds) == 1 and res.timed_out and res.nodes == 0
    assert res.incumbent_bytes == int((BestFit(paper_only=True).offsets(t) + t.size).max())


def test_an_interrupt_during_best_fits_rounds_leaves_its_placement(monkeypatch):
    """Ctrl-C during the incumbent's rounds: best-fit's best so far (its ``partial``, tested in
    membudget-bestfit) becomes the placement the interrupt carries, judged against max-live."""
    from membudget_bestfit.improve import Rounds
    from membudget_minisearch import solver

    t = random_instance(300, seed=0)
    first = BestFit(paper_only=True).offsets(t)

    def interrupted(*args):
        exc = KeyboardInterrupt()
        exc.partial = Rounds(first, 1, False)
        raise exc

    monkeypatch.setattr(solver, "_incumbent", interrupted)
    with pytest.raises(KeyboardInterrupt) as caught:
        MiniSearch().place(t)
    best = caught.value.placement
    assert np.array_equal(best.offsets, first) and not violations(t, best)
    assert best.lower_bound_bytes == t.max_live_bytes and not best.optimal


# --------------------------------------------------------------------------- QA: mutants that no test killed


def test_an_incumbent_at_max_live_is_proved_optimal_without_search_and_not_timed_out():
    """Best-fit's placement at the max-live bound is optimal before any node is tried: with no node to
    spend (``node_limit=0``) the result is still proved, and the search is not reported as ended by
    its limit (``timed_out``: the limit ended it before it settled; here nothing was left to settle)."""
    res = solve([0, 2, 0], [1, 3, 3], [4, 5, 2], time_limit=None, node_limit=0)
    assert res.optimal and res.arena_bytes == res.lower_bound_bytes == res.max_live_bytes == 7
    assert res.nodes == 0 and not res.timed_out


def test_blocks_that_hold_nothing_for_no_time_are_left_out_of_the_search():
    """Only the blocks that occupy something take part (module docstring of ``solver``): a block that is
    freed when it is allocated, whatever its size, gets offset 0 and does not reach the search (whose
    instances refuse it). Every block stacked is the incumbent, so that the search has work to do."""
    lower, upper, size = np.array([0, 0, 1, 3]), np.array([0, 2, 3, 4]), np.array([5, 3, 4, 6])
    res = solve(lower, upper, size, time_limit=None, node_limit=1_000, incumbent=np.cumsum(size) - size)
    assert res.nodes > 0 and res.optimal and res.arena_bytes == 7 and res.offsets[0] == 0
    assert not violations(IntTrace(lower, upper, size), res.offsets, 7)


def test_completion_puts_a_block_into_a_gap_it_fills_exactly():
    """The completion of a partial placement puts each remaining block at the lowest offset where it
    fits between the placed blocks that overlap it, a gap of exactly its size included."""
    from membudget_minisearch.solver import complete

    inst = prepare([0, 0, 0, 1], [2, 2, 2, 3], [10, 10, 10, 4])
    placed = np.array([True, True, False, False])
    full = complete(inst, placed, np.array([0, 20, 0, 0]))
    assert full[:3].tolist() == [0, 20, 10]  # the gap [10, 20) between the two placed blocks
    assert full[3] == 30  # above all three (alive with them at time 1)


# Ten blocks whose optimum (8 units) is above their max-live bytes (7): no placement packs them at the
# load's peak. Found by a search over random instances whose load is the same at every time; CP-SAT
# proves it (below). Random instances almost never have such a gap, so without it the search's step
# past a ruled-out threshold went untested (QA mutation run, 2026-12-01).
ABOVE_MAX_LIVE = [(0, 1, 3), (0, 2, 4), (1, 3, 2), (1, 3, 1), (2, 4, 2), (2, 5, 1), (3, 5, 1), (2, 6, 1),
                  (4, 6, 4), (5, 6, 2)]


def test_an_optimum_above_max_live_is_proved_and_no_bound_claims_more():
    """When the question at the max-live bound is exhausted, the bound rises to the smallest arena the
    exhausted search met above it (a proved bound), not to the threshold + 1 byte: at 1 KiB units it is
    the optimum at once. At every node limit the bound stated is max-live or that optimum, never above
    the optimum CP-SAT proves, and both kernels agree."""
    pytest.importorskip("ortools")
    from harness.allocators.exact import solve_exact

    unit = 1024
    lower, upper, size = (np.array(column) for column in zip(*ABOVE_MAX_LIVE))
    t = IntTrace(lower, upper, size * unit)
    opt = solve_exact(t, time_limit_s=30)
    assert opt.optimal and opt.arena_bytes == 8 * unit and max_live_bytes(t) == 7 * unit
    assert solve_exact(IntTrace(lower, upper, size), time_limit_s=30, pool_bytes=7).status == "infeasible"
    stacked = np.cumsum(t.size) - t.size
    bounds = set()
    for limit in range(400):  # every limit: the step is seen only where the limit ends the search right after it
        res = solve(t.lower, t.upper, t.size, time_limit=None, node_limit=limit, incumbent=stacked)
        assert res.lower_bound_bytes in (7 * unit, 8 * unit) and res.arena_bytes >= 8 * unit, (limit, res)
        assert not violations(t, res.offsets, res.arena_bytes)
        bounds.add(res.lower_bound_bytes)
    assert bounds == {7 * unit, 8 * unit}  # the sweep saw the bound before and after the step
    for kernel in ("numba", "python"):
        res = solve(t.lower, t.upper, t.size, time_limit=None, incumbent=stacked, kernel=kernel)
        assert res.optimal and res.arena_bytes == res.lower_bound_bytes == 8 * unit and res.thresholds >= 1


def test_the_time_limit_stops_the_search_inside_a_slice(monkeypatch):
    """The time limit is anytime: a deadline that passes while a question is being searched ends it
    within a chunk of work, not at the end of the driver's slice (``slice_nodes`` children, doubling every
    round). A clock that moves 0.3 s each time it is read passes a 1 s limit during the first slice."""
    import types

    from membudget_minisearch import solver as solver_module

    clock = iter(np.arange(0, 10_000, 0.3))
    monkeypatch.setattr(solver_module, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    t = cut_rectangle(150, 0)
    stacked = np.cumsum(t.size) - t.size
    res = solve(t.lower, t.upper, t.size, time_limit=1.0, incumbent=stacked, slice_nodes=20_000)
    assert res.timed_out and not res.optimal
    assert 0 < res.nodes < 20_000 and not violations(t, res.offsets, res.arena_bytes)
