"""Traces for allocators: papers/003 section 4.1 time counting, max-live bytes, CSV files."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from hypothesis import given, settings

from harness.allocators.trace import (
    IntTrace,
    TraceError,
    blocks_from_events,
    blocks_from_torch_snapshot,
    live_bytes_profile,
    max_live_bytes,
    read_csv,
    read_csv_offsets,
    to_int_trace,
    to_memory_blocks,
    write_csv,
)
from harness.model import MemoryBlock
from harness.testing_allocators import memory_traces


def B(i, size, a, f):
    return MemoryBlock(id=i, name=f"b{i}", size=size, alloc=a, free=f)


def brute_max_live(blocks):
    """Max over instants of the sizes alive there, on float times (half-open)."""
    points = {b.alloc for b in blocks}
    return max((sum(b.size for b in blocks if b.alloc <= t < b.free) for t in points), default=0)


def test_time_counting_follows_section_4_1():
    """y starts at 1 and advances after every allocation and every free."""
    blocks = [B(0, 10, 0.0, 3.0), B(1, 20, 1.0, 2.0), B(2, 30, 2.5, 4.0)]
    t = to_int_trace(blocks)
    # events: a0@0 -> 1, a1@1 -> 2, f1@2 -> 3, a2@2.5 -> 4, f0@3 -> 5, f2@4 -> 6
    assert t.lower.tolist() == [1, 2, 4]
    assert t.upper.tolist() == [5, 3, 6]
    assert t.size.tolist() == [10, 20, 30]
    assert sorted(t.lower.tolist() + t.upper.tolist()) == list(range(1, 7))


def test_ties_free_before_alloc_and_zero_length_blocks_stay_alive():
    """Back-to-back blocks do not overlap; a zero-length block occupies its instant."""
    blocks = [B(0, 5, 0.0, 1.0), B(1, 5, 1.0, 2.0), B(2, 7, 1.0, 1.0)]
    t = to_int_trace(blocks)
    assert t.upper[0] < t.lower[1]  # the free at time 1 comes first
    assert t.lower[2] < t.upper[2]  # the zero-length block is alive for one event
    assert t.lower[1] < t.upper[2]  # ... while block 1 is alive: the conservative choice
    assert max_live_bytes(t) == 12


def test_never_freed_blocks_end_last():
    t = to_int_trace([B(0, 1, 0.0, math.inf), B(1, 1, 1.0, 2.0)])
    assert t.upper[0] == 4 and t.upper[1] == 3


def test_invalid_blocks_are_refused():
    with pytest.raises(TraceError, match="free"):
        to_int_trace([B(0, 1, 2.0, 1.0)])
    with pytest.raises(TraceError, match="size"):
        IntTrace(np.array([0]), np.array([1]), np.array([-1]))


@settings(max_examples=150, deadline=None)
@given(memory_traces(max_blocks=25))
def test_integer_trace_keeps_every_overlap_and_max_live(blocks):
    """Positive-length blocks overlap in integer time exactly when they overlap in float time."""
    t = to_int_trace(blocks)
    for i, a in enumerate(blocks):
        for j, b in enumerate(blocks[:i]):
            float_overlap = a.alloc < b.free and b.alloc < a.free
            int_overlap = t.lower[i] < t.upper[j] and t.lower[j] < t.upper[i]
            if a.free > a.alloc and b.free > b.alloc:
                assert float_overlap == int_overlap
            elif float_overlap:
                assert int_overlap
    positive = [b for b in blocks if b.free > b.alloc]
    assert max_live_bytes(t) >= brute_max_live(positive)
    if len(positive) == len(blocks):
        assert max_live_bytes(t) == brute_max_live(blocks)


def test_live_bytes_profile():
    t = IntTrace(np.array([0, 1, 1]), np.array([2, 3, 2]), np.array([4, 5, 6]))
    times, live = live_bytes_profile(t)
    assert times.tolist() == [0, 1, 2, 3]
    assert live.tolist() == [4, 15, 5, 0]
    assert max_live_bytes(t) == 15


def test_blocks_from_events():
    blocks = blocks_from_events([("alloc", "a", 3), ("alloc", "b", 4), ("free", "a", 0), ("alloc", "a", 5)])
    assert [(b.name, b.size, b.alloc, b.free) for b in blocks] == [
        ("a", 3, 1.0, 3.0), ("b", 4, 2.0, 5.0), ("a", 5, 4.0, 6.0),
    ]
    with pytest.raises(TraceError):
        blocks_from_events([("free", "x", 0)])


def test_blocks_from_torch_snapshot():
    snapshot = {"device_traces": [[
        {"action": "segment_alloc", "addr": 0, "size": 2 << 20},
        {"action": "alloc", "addr": 0, "size": 512},
        {"action": "alloc", "addr": 512, "size": 1024},
        {"action": "free_requested", "addr": 0, "size": 512},
        {"action": "free_completed", "addr": 0, "size": 512},
        {"action": "alloc", "addr": 0, "size": 512},
        {"action": "free_requested", "addr": 512, "size": 1024},
        {"action": "free_completed", "addr": 512, "size": 1024},
    ]]}
    blocks = blocks_from_torch_snapshot(snapshot)
    assert [(b.size, b.alloc, b.free) for b in blocks] == [(512, 1.0, 3.0), (1024, 2.0, 5.0), (512, 4.0, 6.0)]
    assert blocks_from_torch_snapshot({"device_traces": []}) == ()


CSV = "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,4\n"


def test_csv_read_minimalloc_example():
    """MiniMalloc's README example: 5 buffers, peak 12 over [0, 3)."""
    t = read_csv(io.StringIO(CSV))
    assert t.ids == ("b1", "b2", "b3", "b4", "b5")
    assert t.lower.tolist() == [0, 3, 0, 9, 0]
    assert t.upper.tolist() == [3, 9, 9, 21, 21]
    assert max_live_bytes(t) == 12


def test_csv_old_format_has_inclusive_end(tmp_path):
    path = tmp_path / "old.csv"
    path.write_text("buffer,start,end,size,offset\nb1,0,2,4,8\nb2,3,8,4,0\n")
    t, offsets = read_csv_offsets(path)
    assert t.upper.tolist() == [3, 9]
    assert offsets == [8, 0]


def test_csv_old_format_exclusive_end_on_request():
    t = read_csv(io.StringIO("buffer,start,end,size\nb1,0,2,4\n"), end_inclusive=False)
    assert t.upper.tolist() == [2]


def test_csv_round_trip(tmp_path):
    t = read_csv(io.StringIO(CSV))
    path = tmp_path / "t.csv"
    write_csv(t, path, offsets=[0, 4, 4, 0, 8])
    back, offsets = read_csv_offsets(path)
    assert back.rows() == t.rows() and offsets == [0, 4, 4, 0, 8]
    blocks = to_memory_blocks(t)
    again = to_int_trace(blocks)
    # re-ranking keeps the overlap structure; max-live is unchanged
    assert max_live_bytes(again) == max_live_bytes(t)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("id,lower,size\nb,0,1\n", "missing column"),
        ("id,lower,upper,size\nb,0,x,1\n", "upper 'x' is not a whole number"),
        ("id,lower,upper,size\nb,0,1\n", "fields"),
        ("id,lower,upper,size\nb,5,1,1\n", "upper"),
        ("id,lower,upper,size,alignment\nb,0,1,1,64\n", "alignment"),
        # QA: "block 1: size must be >= 0" named the block's index, not the file's line as every other error does
        ("id,lower,upper,size\na,0,2,10\nb,1,3,-5\n", r"^<stream>:3: block 'b': size -5 is negative \(bytes, >= 0\)$"),
    ],
)
def test_csv_errors_name_the_problem(text, message):
    with pytest.raises(TraceError, match=message):
        read_csv(io.StringIO(text))


@pytest.mark.parametrize("text, message", [
    ("id,lower,upper,size\na,0,4,99999999999999999999\n", r"sizes add up to 99999999999999999999 bytes, more than"),
    ("id,lower,upper,size\na,0,4,4611686018427387904\nb,2,6,4611686018427387904\n",
     r"sizes add up to 9223372036854775808 bytes, more than 4611686018427387904 \(2\*\*62\)"),
    ("id,lower,upper,size\na,0,99999999999999999999,4\n", r"<stream>:2: upper 99999999999999999999 is too large"),
    ("id,lower,upper,size,offset\na,0,4,4,0\nb,0,4,4,9223372036854775807\n", r"<stream>:3: offset .* too large"),
])
def test_numbers_beyond_int64_arithmetic_are_refused_rather_than_wrapped(text, message):
    """Sizes near 2**63 once overflowed max-live and were reported valid; now they are refused."""
    with pytest.raises(TraceError, match=message):
        read_csv_offsets(io.StringIO(text))


def test_a_byte_order_mark_is_read_past_and_binary_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes("\ufeffid,lower,upper,size\na,0,4,100\n".encode())
    assert max_live_bytes(read_csv(path)) == 100
    path.write_bytes(b"\x80\x81binary")
    with pytest.raises(TraceError, match=r"t.csv: not a text trace file \(not UTF-8"):
        read_csv(path)


def test_csv_with_a_duplicate_id_is_refused_naming_it():
    with pytest.raises(TraceError, match=r"<stream>:4: duplicate id 'a' \(first on line 2\)"):
        read_csv(io.StringIO("id,lower,upper,size\na,0,10,100\nb,1,3,8\na,2,5,100\n"))


@pytest.mark.parametrize("text", ["0,0,10,100\n1,2,5,100\n", "a,0,10,100\nb,2,5,100\n", "7,1,2,3\n"])
def test_csv_without_a_header_says_the_first_line_must_be_the_header(text):
    with pytest.raises(TraceError, match=r"<stream>:1: the first line must be the header id,lower,upper,size"):
        read_csv(io.StringIO(text))


def test_zero_length_csv_blocks_occupy_nothing():
    """``lower == upper``: the block holds no bytes at any time, whatever sits beside it."""
    t = read_csv(io.StringIO("id,lower,upper,size\na,0,10,100\nb,5,5,100\nc,10,10,50\n"))
    assert max_live_bytes(t) == 100
    assert live_bytes_profile(t)[1].max() == 100


def test_inference_trace_of_a_chain():
    """Each stage input lives from its producer's start to its consumer's end; workspaces during F_i."""
    from harness.allocators.trace import inference_trace
    from harness.model import Profile, Stage

    stages = tuple(
        Stage(f"s{i}", "conv", fwd_time=1.0, bwd_time=2.0, input_bytes=100 * (i + 1), saved_bytes=0,
              grad_bytes=0, fwd_workspace=10)
        for i in range(3)
    )
    profile = Profile("m", 1, (3,), "cpu", 10**9, 1e9, 1e9, weight_bytes=1000, output_bytes=50, stages=stages)
    blocks = {b.name: b for b in inference_trace(profile)}
    assert (blocks["weights"].alloc, blocks["weights"].free) == (0.0, 3.0)
    assert (blocks["x0"].alloc, blocks["x0"].free) == (0.0, 1.0)
    assert (blocks["x2"].alloc, blocks["x2"].free) == (1.0, 3.0)
    assert (blocks["wF1"].alloc, blocks["wF1"].free) == (1.0, 2.0)
    assert (blocks["output"].alloc, blocks["output"].free) == (2.0, 3.0)
    # the peak is during F_1: weights, x1 (its input), x2 (its output) and its workspace
    assert max_live_bytes(list(blocks.values())) == 1000 + 200 + 300 + 10


def test_a_json_file_given_as_a_trace_says_what_writes_a_trace():
    """QA (2026-11-28): a profile given to ``membudget place`` read "the first line must be the header ...,
    got '{'"."""
    with pytest.raises(TraceError, match=r"<stream>: a JSON file, not a trace .* --trace trace.csv"):
        read_csv(io.StringIO('{\n  "model": "builtin:mlp"\n}\n'))


def test_a_block_that_ends_before_it_starts_names_its_line():
    """QA (2026-11-28): the error read "block 1: upper 1 < lower 2", with no line, unlike the other trace errors."""
    with pytest.raises(TraceError, match=r"^<stream>:3: block 'b' ends before it starts \(lower 2, upper 1\)$"):
        read_csv(io.StringIO("id,lower,upper,size\na,0,3,10\nb,2,1,10\n"))


def test_times_beyond_what_a_float_holds_are_ranked_keeping_every_overlap():
    """``ranked_times``: a trace whose times pass 2**53 (nanosecond timestamps) gets the ranks of its
    times, so that ``to_memory_blocks``' floats keep them apart; the same pairs of blocks overlap and the
    max-live bytes are the same. A trace whose times all fit is left as it is (None)."""
    from harness.allocators.trace import FLOAT_EXACT, IntTrace, max_live_bytes, ranked_times, to_memory_blocks

    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(1, 30))
        lower = rng.integers(0, 50, n)
        small = IntTrace(lower, lower + rng.integers(0, 20, n), rng.integers(0, 100, n))
        assert ranked_times(small) is None
        big = IntTrace(small.lower * 7 + 2**60, small.upper * 7 + 2**60, small.size)
        ranked = ranked_times(big)
        assert ranked is not None and max(ranked.upper) < FLOAT_EXACT
        blocks = to_memory_blocks(ranked)
        for i in range(n):
            for j in range(n):
                overlap = small.lower[i] < small.upper[j] and small.lower[j] < small.upper[i]
                assert (blocks[i].alloc < blocks[j].free and blocks[j].alloc < blocks[i].free) == overlap
        assert max_live_bytes(ranked) == max_live_bytes(small)
