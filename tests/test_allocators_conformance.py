"""Every built-in allocator passes the allocator conformance kit (harness.testing_allocators)."""

from __future__ import annotations

import pytest

from harness.allocators.caching import CachingAllocator
from harness.allocators.first_fit import Cnmem, FirstFit, PoolAllocator
from harness.allocators.greedy_by_size import GreedyBySize
from harness.testing_allocators import AllocatorConformance


class TestCachingConformance(AllocatorConformance):
    allocator = CachingAllocator()


class TestFirstFitConformance(AllocatorConformance):
    allocator = FirstFit()


class TestCnmemConformance(AllocatorConformance):
    allocator = Cnmem()


class TestBoundedPoolConformance(AllocatorConformance):
    """A CNMEM pool of fixed size that has to grow on most random traces."""

    allocator = PoolAllocator("best", granularity=1, pool_bytes=1 << 20, name="cnmem-1MiB")


class TestGreedyBySizeConformance(AllocatorConformance):
    allocator = GreedyBySize()


class TestExactConformance(AllocatorConformance):
    """CP-SAT on small random traces (the DNN-like ones are left to the heuristics)."""

    max_examples = 40
    max_blocks = 12
    dnn_layers = 0

    def make_allocator(self):
        pytest.importorskip("ortools")
        from harness.allocators.exact import ExactAllocator

        return ExactAllocator(time_limit_s=20.0)


def test_the_kit_fails_an_allocator_that_places_in_fractions_of_bytes() -> None:
    """QA: an allocator returning float offsets passed every test of the kit (the validator cut them to whole
    bytes); the kit now fails it with the validator's words."""
    import dataclasses

    from harness.testing_allocators import check_placement_conforms, dnn_training_trace

    class FloatFirstFit(FirstFit):
        def place(self, blocks, **options):
            placement = super().place(blocks, **options)
            return dataclasses.replace(placement, offsets=tuple(float(o) for o in placement.offsets))

    trace = dnn_training_trace(0, layers=4)
    check_placement_conforms(FirstFit(), trace)
    with pytest.raises(AssertionError, match="not a whole number of bytes"):
        check_placement_conforms(FloatFirstFit(), trace)
