"""``membudget place`` (place_command) and the allocators' registration."""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pytest

from harness import hookimpl
from harness.allocators import register_builtin
from harness.commands import place_command
from harness.allocators.trace import read_csv_offsets
from harness.allocators.validate import violations
from harness.errors import MembudgetError, UnknownPlugin
from harness.plugins import Registry

CSV = "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,4\n"
BUILTINS = {"caching", "first-fit", "cnmem", "greedy-by-size", "exact"}


class _BuiltinAllocators:
    """The core's allocator hook alone (the other built-ins import torch: slow, not needed here)."""

    @hookimpl
    def membudget_register_allocators(self, register):
        register_builtin(register)


@pytest.fixture(scope="module")
def builtins_registry():
    reg = Registry()
    reg.add_plugin(_BuiltinAllocators(), "membudget", "dev")
    return reg


@pytest.fixture()
def trace_csv(tmp_path):
    path = tmp_path / "input.12.csv"
    path.write_text(CSV)
    return path


def test_builtin_allocators_are_registered(builtins_registry):
    reg = builtins_registry
    entries = {e.name: e for e in reg.entries("allocator")}
    assert BUILTINS <= set(entries)
    assert all(entries[name].plugin == "membudget" for name in BUILTINS)
    assert all(e.description and "\n" not in e.description for e in entries.values())


@pytest.mark.parametrize("name", sorted(BUILTINS - {"exact"}))
def test_place_command_text(trace_csv, name, builtins_registry):
    out = io.StringIO()
    assert place_command(trace_csv, name, False, registry=builtins_registry, stream=out) == 0
    text = out.getvalue()
    assert "max-live bytes 12" in text and "valid          yes" in text


def test_place_command_json_and_solution_file(trace_csv, tmp_path, builtins_registry):
    pytest.importorskip("ortools")
    out = io.StringIO()
    solution = tmp_path / "output.csv"
    code = place_command(trace_csv, "exact", True, output=solution, registry=builtins_registry, stream=out)
    report = json.loads(out.getvalue())
    assert code == 0
    assert report["arena_bytes"] == 12 and report["max_live_bytes"] == 12 and report["optimal"] is True
    assert report["fragmentation"] == 1.0 and report["valid"] and report["blocks"] == 5
    assert set(report) >= {"trace", "allocator", "place_time_s", "offsets", "violations", "notes"}
    trace, offsets = read_csv_offsets(solution)
    assert offsets == report["offsets"] and not violations(trace, offsets)


def test_place_command_unknown_allocator(trace_csv, builtins_registry):
    with pytest.raises(UnknownPlugin, match="caching"):
        place_command(trace_csv, "nope", registry=builtins_registry, stream=io.StringIO())


class _Broken:
    name = "broken"
    description = "puts everything at 0"

    def place(self, trace):
        from harness.allocators._common import make_placement
        from harness.allocators.trace import as_int_trace

        t = as_int_trace(trace)
        return make_placement(self.name, t, [0] * len(t))


def test_place_command_reports_an_invalid_placement(trace_csv):
    class Reg:
        def allocator(self, name):
            return _Broken()

    out = io.StringIO()
    assert place_command(trace_csv, "broken", False, registry=Reg(), stream=out) == 1
    assert "valid          NO" in out.getvalue() and "violation" in out.getvalue()
    text = out.getvalue()
    assert "(no gap: the placement is invalid)" in text and "gap -" not in text  # not a negative gap


class _Slipping:
    """An allocator author's slips, by ``slip``."""

    name = "slipping"
    description = "slips"

    def __init__(self, slip: str) -> None:
        self.slip = slip

    def place(self, trace):
        from harness.allocators._common import make_placement
        from harness.allocators.trace import as_int_trace

        t = as_int_trace(trace)
        stacked = [int(x) for x in np.cumsum(t.size) - t.size]
        if self.slip == "list":
            return stacked
        if self.slip == "raise":
            return 1 / 0
        if self.slip == "exit":
            raise SystemExit(3)
        placement = make_placement(self.name, t, stacked)
        if self.slip == "short":
            return dataclasses.replace(placement, offsets=tuple(stacked[:-1]))
        if self.slip == "float-offsets":
            return dataclasses.replace(placement, offsets=tuple(float(x) for x in stacked))
        return dataclasses.replace(placement, arena_bytes=float(placement.arena_bytes))  # float-arena


@pytest.mark.parametrize("slip, words", [
    ("list", "allocator 'slipping' returned a list, not a harness.model.Placement"),
    ("short", "allocator 'slipping' invalid placement: 4 offsets for 5 blocks"),
    ("raise", "allocator 'slipping' failed: ZeroDivisionError: division by zero (at tests.test_allocators_command:"),
    ("exit", "allocator 'slipping' failed: SystemExit: the plugin called sys.exit(3) (at "),
])
def test_place_with_an_allocator_that_slips_is_one_line_naming_it(trace_csv, slip, words):
    """QA: an allocator returning a list, too few offsets, or raising made `membudget place` end in a traceback
    (exit 1, the status of an invalid placement), where a suite made each an error row naming it."""
    class Reg:
        def allocator(self, name):
            return _Slipping(slip)

    with pytest.raises(MembudgetError) as failed:
        place_command(trace_csv, "slipping", False, registry=Reg(), stream=io.StringIO())
    assert str(failed.value).startswith(words) and "\n" not in str(failed.value), str(failed.value)


@pytest.mark.parametrize("slip, words", [
    ("float-offsets", "block 0: offset 0.0 is not a whole number of bytes (an int)"),
    ("float-arena", "arena_bytes is 20.0, not a whole number of bytes (an int)"),
])
def test_a_placement_in_fractions_of_bytes_is_invalid(trace_csv, slip, words):
    """QA: offsets and an arena given as floats were valid (offsets cut to whole bytes without a word, and
    `1858469411.0` in the arena_bytes column); they are violations, for `place`, the runner and the
    conformance kit alike (harness.allocators.validate.violations)."""
    class Reg:
        def allocator(self, name):
            return _Slipping(slip)

    out = io.StringIO()
    assert place_command(trace_csv, "slipping", True, registry=Reg(), stream=out) == 1
    report = json.loads(out.getvalue())
    assert report["valid"] is False and report["violations"] == [words]


@pytest.mark.parametrize("name", ["first-fit", "greedy-by-size", "caching", "cnmem"])
def test_zero_length_blocks_take_no_part_in_a_placement(tmp_path, name, builtins_registry):
    """A block with ``lower == upper`` occupies no time: offset 0, nothing in max-live or the arena."""
    from harness.commands import place_trace_file
    from harness.allocators.trace import max_live_bytes, read_csv

    with_empty = tmp_path / "with-empty.csv"
    with_empty.write_text("id,lower,upper,size\na,0,10,1000\nb,5,5,1000\nc,3,7,24\nd,10,10,4096\n")
    without = tmp_path / "without.csv"
    without.write_text("id,lower,upper,size\na,0,10,1000\nc,3,7,24\n")
    report = place_trace_file(with_empty, name, registry=builtins_registry)
    alone = place_trace_file(without, name, registry=builtins_registry)
    assert report["valid"] and report["blocks"] == 4
    assert report["max_live_bytes"] == max_live_bytes(read_csv(with_empty)) == alone["max_live_bytes"] == 1024
    assert report["arena_bytes"] == alone["arena_bytes"]
    assert report["offsets"][1] == report["offsets"][3] == 0
    assert [report["offsets"][0], report["offsets"][2]] == alone["offsets"]


def test_a_trace_with_a_duplicate_id_is_not_placed(tmp_path, builtins_registry):
    from harness.allocators.trace import TraceError

    trace = tmp_path / "dup.csv"
    trace.write_text("id,lower,upper,size\na,0,10,100\na,2,5,100\n")
    with pytest.raises(TraceError, match="duplicate id 'a'"):
        place_command(trace, "first-fit", output=tmp_path / "out.csv", registry=builtins_registry,
                      stream=io.StringIO())
    assert not (tmp_path / "out.csv").exists()


def test_place_command_passes_options_and_reports_the_bound(trace_csv, builtins_registry):
    """``--option time_limit=...`` reaches the allocator's ``place``; a proved bound is reported."""
    pytest.importorskip("ortools")
    out = io.StringIO()
    code = place_command(trace_csv, "exact", True, registry=builtins_registry, stream=out,
                         options={"time_limit": 5})
    report = json.loads(out.getvalue())
    assert code == 0 and report["options"] == {"time_limit": 5}
    assert report["optimal"] is True and report["lower_bound_bytes"] == 12 and report["gap"] == 0.0
    text = io.StringIO()
    place_command(trace_csv, "exact", False, registry=builtins_registry, stream=text, options={"time_limit": 5})
    assert "lower bound    12 (gap 0.000% of the arena)" in text.getvalue()


class _Stack:
    """Every block above the one before: never optimal but where they all live at once; no bound of its own."""

    name = "stack"
    description = "offsets: the sizes of the blocks before"

    def place(self, trace):
        from harness.allocators._common import make_placement
        from harness.allocators.trace import as_int_trace

        t = as_int_trace(trace)
        return make_placement(self.name, t, [int(x) for x in np.cumsum(t.size) - t.size])


def test_an_allocator_without_a_bound_is_judged_against_the_max_live_bytes(tmp_path):
    """Every report says how far from the optimum its arena is at most: the lower bound is the larger of
    the allocator's and the max-live bytes; an arena at its bound is proved optimal, whoever placed it
    (QA: best-fit said 'optimal -' at max-live; exact said 'optimal no' with a gap of 0)."""
    class Reg:
        def allocator(self, name):
            return _Stack()

    reports = {}
    for name, text in (("apart", "a,0,2,1\nb,0,4,1\nc,2,6,2\n"), ("together", "a,0,4,1\nb,1,4,3\n")):
        trace = tmp_path / f"{name}.csv"
        trace.write_text("id,lower,upper,size\n" + text)
        out = io.StringIO()
        place_command(trace, "stack", True, registry=Reg(), stream=out)
        reports[name] = json.loads(out.getvalue())
    apart, together = reports["apart"], reports["together"]
    assert (apart["max_live_bytes"], apart["arena_bytes"], apart["lower_bound_bytes"]) == (3, 4, 3)
    assert apart["gap"] == 0.25 and apart["optimal"] is None  # not proved, and the allocator said nothing
    assert together["arena_bytes"] == together["lower_bound_bytes"] == 4 and together["optimal"] is True
    assert together["gap"] == 0.0 and "proved optimal by its arena, the lower bound" in together["notes"]


@pytest.mark.parametrize("name", ["greedy-by-size", "exact"])
def test_nanosecond_timestamps_keep_their_order(tmp_path, name, builtins_registry):
    """QA: times beyond 2**53 (nanosecond timestamps) became equal floats, so blocks one after the other
    overlapped: arena 2000 for three blocks of 1000 bytes in turn, marked proved. They are placed by
    their ranks now."""
    from harness.commands import place_trace_file

    if name == "exact":
        pytest.importorskip("ortools")
    trace = tmp_path / "ns.csv"
    start = 1_732_000_000_000_000_000
    trace.write_text("id,lower,upper,size\n" + "".join(f"{i},{start + 100 * i},{start + 100 * (i + 1)},1000\n"
                                                        for i in range(3)))
    report = place_trace_file(trace, name, registry=builtins_registry)
    assert report["max_live_bytes"] == report["arena_bytes"] == 1000 and report["valid"]
    assert "times beyond 2**53 were placed by their ranks" in report["notes"]


class _Interrupted:
    """An allocator that is interrupted while it searches, leaving (or not) the best placement it had."""

    name = "interrupted"
    description = "raises KeyboardInterrupt from place"

    def __init__(self, leaves: bool, at_call: int = 2):
        self.leaves, self.calls, self.at_call = leaves, 0, at_call

    def place(self, trace):
        from harness.allocators.first_fit import FirstFit

        self.calls += 1
        best = FirstFit().place(trace)
        if self.calls < self.at_call:  # the warm-up on one block
            return best
        exc = KeyboardInterrupt()
        if self.leaves:
            exc.placement = best
        raise exc


@pytest.mark.parametrize("leaves", [True, False], ids=["leaves-its-best", "leaves-nothing"])
def test_an_interrupted_place_prints_and_writes_the_best_placement_found(trace_csv, tmp_path, leaves):
    """QA: Ctrl-C in a long search printed nothing and wrote no -o file, though the allocator had a
    placement. An allocator may leave it on the interrupt (``harness.protocols.Allocator``)."""
    class Reg:
        def allocator(self, name):
            return allocator

    allocator = _Interrupted(leaves)
    out, solution = io.StringIO(), tmp_path / "placed.csv"
    with pytest.raises(KeyboardInterrupt) as caught:
        place_command(trace_csv, "interrupted", False, output=solution, registry=Reg(), stream=out)
    if not leaves:
        assert out.getvalue() == "" and not solution.exists()
        return
    assert caught.value.report["interrupted"] is True and caught.value.report["valid"]
    assert "interrupted after" in out.getvalue() and "valid          yes" in out.getvalue()
    trace, offsets = read_csv_offsets(solution)
    assert offsets == caught.value.report["offsets"] and not violations(trace, offsets)


def test_an_interrupt_in_the_warm_up_of_a_one_block_trace_is_reported_too(tmp_path):
    """Review: on a trace of one block the warm-up places the whole trace; an interrupt there was an
    UnboundLocalError (the clock had not started)."""
    class Reg:
        def allocator(self, name):
            return _Interrupted(True, at_call=1)

    one = tmp_path / "one.csv"
    one.write_text("id,lower,upper,size\na,0,5,100\n")
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt) as caught:
        place_command(one, "interrupted", False, registry=Reg(), stream=out)
    assert caught.value.report["interrupted"] and "interrupted after" in out.getvalue()


def test_an_interrupted_place_that_cannot_write_its_file_still_stops_as_interrupted(trace_csv, tmp_path, capsys):
    """Review: a failed -o write replaced the interrupt (exit 2, not 130/143) and printed nothing."""
    class Reg:
        def allocator(self, name):
            return _Interrupted(True)

    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt) as caught:
        place_command(trace_csv, "interrupted", False, output=tmp_path, registry=Reg(), stream=out)  # a folder
    assert "valid          yes" in out.getvalue() and caught.value.written is False
    assert "could not be written" in capsys.readouterr().err


def test_an_allocator_that_proves_its_arena_without_a_bound_is_its_own_bound(trace_csv):
    """Review: optimal=True with no bound printed the max-live bytes as the bound and a 0% gap beside a
    larger arena; the arena it proved optimal is the bound."""
    class Proved(_Stack):
        def place(self, trace):
            from dataclasses import replace

            return replace(super().place(trace), optimal=True)

    class Reg:
        def allocator(self, name):
            return Proved()

    out = io.StringIO()
    place_command(trace_csv, "stack", True, registry=Reg(), stream=out)
    report = json.loads(out.getvalue())
    assert report["arena_bytes"] > report["max_live_bytes"]
    assert report["lower_bound_bytes"] == report["arena_bytes"] and report["gap"] == 0.0 and report["optimal"]


def test_the_interrupt_message_of_place_says_where_the_placement_is():
    import argparse

    from harness.cli import _what_an_interrupted_run_left

    args = argparse.Namespace(command="place", allocator="exact", output="placed.csv")
    exc = KeyboardInterrupt()
    assert _what_an_interrupted_run_left(args, exc) == "; exact left no placement"
    exc.report = {"offsets": []}
    assert _what_an_interrupted_run_left(args, exc) == "; the best placement found so far is above and in placed.csv"
    exc.written = False
    assert _what_an_interrupted_run_left(args, exc) == "; the best placement found so far is above"


def test_place_command_rejects_an_option_the_allocator_does_not_take(trace_csv, builtins_registry):
    from harness.errors import UnknownOption

    with pytest.raises(UnknownOption, match="allocator 'first-fit' has no option 'time_limit'; it takes no options"):
        place_command(trace_csv, "first-fit", registry=builtins_registry, stream=io.StringIO(),
                      options={"time_limit": 1})
    with pytest.raises(UnknownOption, match="its options: time_limit"):
        place_command(trace_csv, "exact", registry=builtins_registry, stream=io.StringIO(),
                      options={"time_limt": 1})
    with pytest.raises(UnknownOption, match="time_limit must be"):
        place_command(trace_csv, "exact", registry=builtins_registry, stream=io.StringIO(),
                      options={"time_limit": "soon"})


def test_cli_place_option(trace_csv, capsys):
    """``membudget place ... --option KEY=VALUE`` (values read as YAML) and its one-line error."""
    pytest.importorskip("ortools")
    from harness.cli import main

    assert main(["place", str(trace_csv), "--allocator", "exact", "--option", "time_limit=2.5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["options"] == {"time_limit": 2.5} and report["optimal"] is True
    assert main(["place", str(trace_csv), "--allocator", "first-fit", "--option", "time_limit=1"]) == 2
    assert "has no option 'time_limit'" in capsys.readouterr().err
