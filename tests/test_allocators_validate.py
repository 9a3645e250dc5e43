"""The placement validator: overlaps in address while alive, arena bounds, counts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.allocators.trace import IntTrace, max_live_bytes
from harness.allocators.validate import PlacementError, check_placement, is_valid, violations
from harness.model import MemoryBlock, Placement


def trace(*rows):
    lo, up, sz = zip(*rows) if rows else ((), (), ())
    return IntTrace(np.array(lo, np.int64), np.array(up, np.int64), np.array(sz, np.int64))


def test_valid_placement_has_no_violations():
    t = trace((0, 2, 4), (2, 4, 4), (0, 4, 2))
    assert violations(t, [0, 0, 4]) == []  # blocks 0 and 1 touch in time only
    assert is_valid(t, [0, 0, 4], arena_bytes=6)


def test_overlap_while_alive_is_found():
    t = trace((0, 3, 4), (2, 4, 4))
    found = violations(t, [0, 2])
    assert [v.kind for v in found] == ["overlap"] and found[0].blocks == (0, 1)


def test_arena_negative_and_count():
    t = trace((0, 1, 4), (0, 1, 4))
    kinds = {v.kind for v in violations(t, [-1, 2], arena_bytes=5)}
    assert kinds == {"negative", "arena", "overlap"}
    assert [v.kind for v in violations(t, [0])] == ["count"]


def test_placement_object_checks_max_live():
    t = trace((0, 1, 4), (0, 1, 4))
    good = Placement("x", (0, 4), 8, 8)
    bad = Placement("x", (0, 4), 8, 7)
    assert violations(t, good) == []
    assert [v.kind for v in violations(t, bad)] == ["max_live"]
    with pytest.raises(PlacementError, match="max_live"):
        check_placement(t, bad)


def test_zero_size_and_empty_lifetime_blocks_occupy_nothing():
    t = trace((0, 5, 0), (0, 5, 3), (2, 2, 9))
    assert violations(t, [1, 0, 0]) == []


def test_memory_blocks_are_accepted():
    blocks = [MemoryBlock(0, "a", 4, 0.0, 1.0), MemoryBlock(1, "b", 4, 1.0, 2.0)]
    assert violations(blocks, [0, 0]) == []
    assert violations([MemoryBlock(0, "a", 4, 0.0, 1.5), blocks[1]], [0, 0])[0].kind == "overlap"


@st.composite
def placed_traces(draw):
    n = draw(st.integers(0, 14))
    rows = []
    for _ in range(n):
        lo = draw(st.integers(0, 10))
        rows.append((lo, lo + draw(st.integers(0, 6)), draw(st.integers(0, 5))))
    offsets = [draw(st.integers(0, 12)) for _ in range(n)]
    return trace(*rows), offsets


@settings(max_examples=400, deadline=None)
@given(placed_traces())
def test_validator_agrees_with_brute_force(case):
    """The sweep finds an overlap exactly when some pair overlaps in both time and address.

    Blocks of size 0 or with an empty lifetime never overlap anything.
    """
    t, off = case
    n = len(t)
    brute = any(
        t.lower[i] < t.upper[j] and t.lower[j] < t.upper[i]
        and off[i] < off[j] + t.size[j] and off[j] < off[i] + t.size[i]
        and t.size[i] > 0 and t.size[j] > 0 and t.upper[i] > t.lower[i] and t.upper[j] > t.lower[j]
        for i in range(n) for j in range(i)
    )
    found = {v.kind for v in violations(t, off)}
    assert ("overlap" in found) == brute
    if not brute and n:
        # a valid placement never beats max-live
        assert max(o + int(s) for o, s in zip(off, t.size)) >= max_live_bytes(t)
