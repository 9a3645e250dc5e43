"""The Numba kernels against their plain-Python twins, and Figure 4's scheme search by example."""

from __future__ import annotations

import random

import numpy as np
import pytest

from membudget_modnn import _kernels as k
from membudget_modnn.memory import LinkedListMemory
from membudget_modnn.reference import ReferenceMemory, find_scheme_reference


def _layout(arrays) -> list[tuple[int, int, int]]:
    off, size, owner, nxt, prv, meta, _ = arrays
    _, o, s, w = k.ll_flatten(off, size, owner, nxt, prv, meta)
    return list(zip(o.tolist(), s.tolist(), w.tolist()))


def _node_at(arrays, offset: int) -> int:
    off, size, owner, nxt, prv, meta, _ = arrays
    nodes, o, _, _ = k.ll_flatten(off, size, owner, nxt, prv, meta)
    return int(nodes[list(o).index(offset)])


@pytest.mark.parametrize("seed", range(40))
def test_linked_list_kernels_agree_with_the_reference(seed: int) -> None:
    """Random alloc (both ends) / free / shrink / compact sequences give identical layouts."""
    rng = random.Random(seed)
    arena = rng.randint(50, 5000)
    arrays = k.ll_new(256, arena)
    ref = ReferenceMemory(arena)
    owners = 0
    for _ in range(120):
        occupied = [s for s in ref.segments if s.owner >= 0]
        action = rng.random()
        if action < 0.5 or not occupied:
            req = rng.randint(1, max(1, arena // 4))
            top = rng.random() < 0.4
            node = k.ll_alloc(*arrays, req, owners, top)
            got = ref.alloc(req, owners, top)
            assert (node >= 0) == (got is not None)
            if node >= 0:
                assert arrays[0][node] == got
            owners += 1
        elif action < 0.8:
            seg = rng.choice(occupied)
            k.ll_free(*arrays, _node_at(arrays, seg.off))
            ref.free(seg.off)
        elif action < 0.95:
            seg = rng.choice(occupied)
            keep = rng.randint(1, seg.size)
            k.ll_shrink(*arrays, _node_at(arrays, seg.off), keep)
            ref.shrink(seg.off, keep)
        else:
            k.ll_compact(*arrays)
            ref.compact()
        assert _layout(arrays) == ref.layout()
        # the list always tiles the arena
        layout = ref.layout()
        assert sum(s for _, s, _ in layout) == arena
        assert all(a[0] + a[1] == b[0] for a, b in zip(layout, layout[1:]))


def test_freeing_coalesces_and_compaction_leaves_one_hole() -> None:
    mem = LinkedListMemory(100)
    for owner in range(5):
        assert mem.alloc(20, owner)
    assert not mem.alloc(1, 9)
    mem.free(1)
    mem.free(3)
    assert mem.largest_free() == 20  # two separate 20-byte holes
    mem.free(2)
    assert mem.largest_free() == 60  # 1, 2, 3 merged
    mem.alloc(60, 7)
    mem.free(7)
    mem.free(0)
    mem.compact()
    _, size, owner = mem.segments()
    assert list(owner) == [4, -1] and list(size) == [20, 80]


def test_short_lived_data_goes_to_the_top() -> None:
    mem = LinkedListMemory(100)
    mem.alloc(30, 0)
    mem.alloc(10, 1, short_lived=True)
    off, size, owner = mem.segments()
    assert list(zip(off, size, owner)) == [(0, 30, 0), (30, 60, -1), (90, 10, 1)]


def test_short_lived_data_goes_best_fit_at_the_high_end() -> None:
    mem = LinkedListMemory(100)
    for owner in range(4):
        assert mem.alloc(20, owner)
    mem.free(1)  # two 20-byte holes: at 20 and at 80 (the top)
    mem.alloc(10, 7, short_lived=True)  # the smallest hole holding it, the highest on ties
    off, size, owner = mem.segments()
    assert list(zip(off, size, owner)) == [(0, 20, 0), (20, 20, -1), (40, 20, 2), (60, 20, 3), (80, 10, -1), (90, 10, 7)]
    mem.free(3)  # a 30-byte hole at 60..90 and the 20-byte one at 20
    mem.alloc(15, 8, short_lived=True)
    off, size, owner = mem.segments()
    assert list(zip(off, size, owner))[:3] == [(0, 20, 0), (20, 5, -1), (25, 15, 8)]


def _random_layout(rng: random.Random):
    n = rng.randint(1, 12)
    blocks = rng.randint(1, 6)
    seg_owner = np.array([rng.choice([-1] + list(range(blocks))) for _ in range(n)], dtype=np.int64)
    seg_size = np.array([rng.randint(1, 10) for _ in range(n)], dtype=np.int64)
    can = np.array([rng.random() < 0.7 for _ in range(blocks)], dtype=np.bool_)
    ready = np.array([float(rng.randint(0, 5)) for _ in range(blocks)])  # integers: ties happen
    dur = np.array([float(rng.randint(1, 4)) for _ in range(blocks)])
    moved = np.array([rng.randint(1, 20) for _ in range(blocks)], dtype=np.int64)
    next_use = np.array([rng.randint(0, 6) for _ in range(blocks)], dtype=np.int64)
    return seg_size, seg_owner, can, ready, dur, moved, next_use


@pytest.mark.parametrize("seed", range(20))
def test_scheme_search_agrees_with_the_reference(seed: int) -> None:
    rng = random.Random(1000 + seed)
    found = 0
    for _ in range(50):
        args = _random_layout(rng)
        engine, now, req = float(rng.randint(0, 6)), float(rng.randint(0, 8)), rng.randint(1, 30)
        got = k.find_scheme(*args, engine, now, req)
        want = find_scheme_reference(*args, engine, now, req)
        assert (int(got[0]), int(got[1]), float(got[2]), int(got[3])) == want
        found += want[0] >= 0
    assert found  # the comparison is not only over "no scheme"


def _figure4(ready_12: float, ready_56: float):
    """Figure 4: six blocks, block (4) must not be offloaded; sizes 2, 2, 1, 3, 2, 2."""
    seg_owner = np.array([1, 2, 3, 4, 5, 6], dtype=np.int64)
    seg_size = np.array([2, 2, 1, 3, 2, 2], dtype=np.int64)
    can = np.ones(7, dtype=np.bool_)
    can[4] = False
    ready = np.zeros(7)
    ready[[1, 2]] = ready_12
    ready[[5, 6]] = ready_56
    dur = np.ones(7)
    moved = np.full(7, 2, dtype=np.int64)
    next_use = np.zeros(7, dtype=np.int64)
    return seg_size, seg_owner, can, ready, dur, moved, next_use


def test_figure_4_finds_the_two_schemes_and_keeps_the_lower_delay() -> None:
    """papers/000 Figure 4: for an allocation of size 4 the schemes are (1)(2) and (5)(6)."""
    # (5)(6) could only start copying at t=5: (1)(2), ready at 0, end at 2 and cause no delay at t=2
    first, last, delay, moved = k.find_scheme(*_figure4(0.0, 5.0), 0.0, 2.0, 4)
    assert (first, last, delay, moved) == (0, 1, 0.0, 4)
    # the other way round: (5)(6)
    first, last, delay, _ = k.find_scheme(*_figure4(5.0, 0.0), 0.0, 2.0, 4)
    assert (first, last) == (4, 5) and delay == 0.0
    # delay of (1)(2) ready at 1: copies end at 3, one second after the task wanted to start
    first, _, delay, _ = k.find_scheme(*_figure4(1.0, 9.0), 0.0, 2.0, 4)
    assert first == 0 and delay == 1.0


def test_no_scheme_when_every_run_hits_a_pinned_block() -> None:
    seg_size, seg_owner, can, ready, dur, moved, next_use = _figure4(0.0, 0.0)
    can[:] = False
    assert k.find_scheme(seg_size, seg_owner, can, ready, dur, moved, next_use, 0.0, 0.0, 4)[0] == -1
