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
