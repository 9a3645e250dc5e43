"""The baselines follow the rules they model: PyTorch's caching allocator, CNMEM, TFLite."""

from __future__ import annotations

import numpy as np
import pytest

from harness.allocators.caching import CachingAllocator, allocation_size, round_size
from harness.allocators.first_fit import Cnmem, FirstFit, PoolAllocator
from harness.allocators.greedy_by_size import GreedyBySize
from harness.allocators.trace import IntTrace, blocks_from_events
from harness.allocators.validate import violations
from harness.testing_allocators import dnn_inference_trace, dnn_training_trace

KiB, MiB = 1 << 10, 1 << 20


def run(events):
    """Blocks from ("alloc", key, size) / ("free", key, 0) events, and a name -> index map."""
    blocks = blocks_from_events(events)
    return blocks, {b.name: i for i, b in enumerate(blocks)}


# --------------------------------------------------------------------------- caching


@pytest.mark.parametrize("size, rounded", [(0, 512), (1, 512), (512, 512), (513, 1024), (MiB + 1, MiB + 512)])
def test_round_size(size, rounded):
    assert round_size(size) == rounded


@pytest.mark.parametrize(
    "size, segment",
    [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),
     (10 * MiB, 10 * MiB), (11 * MiB, 12 * MiB), (12 * MiB + 512, 14 * MiB)],
)
def test_allocation_size(size, segment):
    assert allocation_size(size) == segment


def test_small_requests_share_a_2mib_segment():
    blocks, ix = run([("alloc", "a", 100), ("alloc", "b", 1000), ("alloc", "c", MiB)])
    p = CachingAllocator().place(blocks)
    assert p.arena_bytes == 2 * MiB
    assert [p.offsets[ix[k]] for k in "abc"] == [0, 512, 512 + 1024]


def test_small_pool_overflows_into_a_new_segment():
    blocks, _ = run([("alloc", "a", MiB), ("alloc", "b", MiB), ("alloc", "c", 512)])
    assert CachingAllocator().place(blocks).arena_bytes == 4 * MiB


def test_medium_requests_split_a_20mib_segment():
    blocks, ix = run([("alloc", "a", 3 * MiB), ("alloc", "b", 3 * MiB)])
    p = CachingAllocator().place(blocks)
    assert p.arena_bytes == 20 * MiB
    assert (p.offsets[ix["a"]], p.offsets[ix["b"]]) == (0, 3 * MiB)


def test_large_block_not_split_when_remainder_is_at_most_1mib():
    """11 MiB -> a 12 MiB segment whose 1 MiB remainder is not split off (remaining > kSmallSize fails)."""
    blocks, _ = run([("alloc", "a", 11 * MiB), ("alloc", "b", MiB + 512)])
    p = CachingAllocator().place(blocks)
    assert p.arena_bytes == 12 * MiB + 20 * MiB


def test_best_fit_within_the_pool_and_split():
    """The smallest free block that fits is taken, even when a larger one comes first."""
    blocks, ix = run([
        ("alloc", "A", 4 * MiB), ("alloc", "B", 2 * MiB), ("alloc", "C", 3 * MiB), ("alloc", "D", 2 * MiB),
        ("free", "A", 0), ("free", "C", 0),
        ("alloc", "E", 3 * MiB),          # C's 3 MiB hole, not A's 4 MiB one
        ("alloc", "F", 2 * MiB + 512 * KiB),  # A's hole, split (1.5 MiB > 1 MiB remains)
    ])
    p = CachingAllocator().place(blocks)
    assert p.offsets[ix["E"]] == 6 * MiB
    assert p.offsets[ix["F"]] == 0
    assert p.arena_bytes == 20 * MiB


def test_freed_neighbours_merge_and_nothing_is_released():
    blocks, ix = run([
        ("alloc", "a", 6 * MiB), ("alloc", "b", 6 * MiB), ("alloc", "c", 6 * MiB),
        ("free", "a", 0), ("free", "c", 0), ("free", "b", 0),
        ("alloc", "big", 18 * MiB),  # fits only in the merged 20 MiB block
        ("free", "big", 0),
    ])
    p = CachingAllocator().place(blocks)
    assert p.offsets[ix["big"]] == 0
    assert p.arena_bytes == 20 * MiB  # reserved, though nothing is live at the end


def test_zero_size_requests_reserve_nothing():
    blocks, _ = run([("alloc", "a", 0), ("alloc", "b", 0)])
    assert CachingAllocator().place(blocks).arena_bytes == 0


# --------------------------------------------------------------------------- CNMEM-like pools


def holes():
    """A 10-byte hole at 0 and a 4-byte hole at 11, then a 4-byte request."""
    return run([
        ("alloc", "A", 10), ("alloc", "B", 1), ("alloc", "C", 4), ("alloc", "D", 1),
        ("free", "A", 0), ("free", "C", 0), ("alloc", "E", 4),
    ])


def test_first_fit_takes_the_lowest_hole():
    blocks, ix = holes()
    assert PoolAllocator("first", granularity=1).place(blocks).offsets[ix["E"]] == 0


def test_cnmem_takes_the_smallest_hole():
    blocks, ix = holes()
    assert Cnmem(granularity=1).place(blocks).offsets[ix["E"]] == 11


def test_cnmem_granularity_is_512_bytes():
    blocks, ix = run([("alloc", "a", 1), ("alloc", "b", 1)])
    p = FirstFit().place(blocks)
    assert (p.offsets[ix["a"]], p.offsets[ix["b"]], p.arena_bytes) == (0, 512, 1024)


def test_bounded_pool_fits_or_grows():
    blocks, _ = run([("alloc", "a", 4), ("alloc", "b", 4), ("free", "a", 0), ("alloc", "c", 4)])
    fits = PoolAllocator("first", granularity=1, pool_bytes=8).place(blocks)
    assert fits.arena_bytes == 8 and "grew 0" in fits.notes
    grows = PoolAllocator("first", granularity=1, pool_bytes=6).place(blocks)
    assert grows.arena_bytes == 6 + 4 and "grew 1" in grows.notes


def test_cnmem_never_merges_across_a_cudamalloc_boundary():
    """A grown block is a separate cudaMalloc: freed, it does not merge with the pool below it."""
    blocks, _ = run([
        ("alloc", "x", 4), ("alloc", "y", 2),  # y does not fit in the 4-byte pool: grown at 4
        ("free", "x", 0), ("free", "y", 0),
        ("alloc", "z", 6),  # 4 + 2 free bytes, but in two pieces: grows again
    ])
    p = Cnmem(granularity=1, pool_bytes=4).place(blocks)
    assert p.arena_bytes == 4 + 2 + 6


# --------------------------------------------------------------------------- greedy by size


def test_greedy_by_size_on_minimalloc_example():
    """MiniMalloc's README example fits its capacity of 12."""
    t = IntTrace(np.array([0, 3, 0, 9, 0]), np.array([3, 9, 9, 21, 21]), np.array([4, 4, 4, 4, 4]))
    p = GreedyBySize().place(t)
    assert list(p.offsets) == [0, 0, 4, 0, 8] and p.arena_bytes == 12


def test_greedy_by_size_uses_a_gap_between_blocks():
    t = IntTrace(np.array([0, 0, 2, 2]), np.array([1, 4, 4, 4]), np.array([10, 9, 8, 2]))
    # 10 at 0; 9 above it (10..19); 8 below the 9 (the 10 is not alive then); 2 in the gap 8..10
    assert list(GreedyBySize().place(t).offsets) == [0, 10, 0, 8]


# --------------------------------------------------------------------------- on DNN-like traces


@pytest.mark.parametrize("make", [dnn_training_trace, dnn_inference_trace])
def test_baselines_on_dnn_like_traces(make):
    """Every baseline is valid, and the caching model pays for its segment granularity."""
    trace = make(0)
    arenas = {}
    for alloc in (CachingAllocator(), FirstFit(), Cnmem(), GreedyBySize()):
        p = alloc.place(trace)
        assert not violations(trace, p)
        arenas[alloc.name] = p.arena_bytes
        live = p.max_live_bytes
    assert min(arenas.values()) >= live
    assert arenas["caching"] > live
