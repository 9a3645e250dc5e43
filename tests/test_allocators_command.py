"""``membudget place`` (place_command) and the allocators' registration."""

from __future__ import annotations

import io
import json

import pytest

from harness import hookimpl
from harness.allocators import register_builtin
from harness.commands import place_command
from harness.allocators.trace import read_csv_offsets
from harness.allocators.validate import violations
from harness.errors import UnknownPlugin
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
    assert "lower bound    12 (gap 0.000%)" in text.getvalue()


def test_place_command_without_a_bound_says_none(trace_csv, builtins_registry):
    out = io.StringIO()
    place_command(trace_csv, "first-fit", True, registry=builtins_registry, stream=out)
    report = json.loads(out.getvalue())
    assert report["lower_bound_bytes"] is None and report["gap"] is None and report["options"] == {}


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
