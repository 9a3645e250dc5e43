"""The runner: rows and their metrics, isolation of failures, interruption and resume."""

from __future__ import annotations

import csv
import functools
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.bounds import lower_bound, min_memory, peak_memory
from harness.results import COLUMNS, STABLE_COLUMNS, drop_rows, read_meta, read_rows_csv
from harness.runner import run_suite
from harness.same_schedule import key, took_earlier_run
from harness.suite import load_suite
from tests import test_suite_support as support

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("plan_time_s", "place_time_s", "run_time_s", "finished_at", "run_id")


@pytest.fixture(autouse=True)
def _plugin():
    support.install()
    support.PLANS.clear()
    support.PROFILED.clear()


def _suite(tmp_path: Path, text: str | None = None):
    return load_suite(support.write_suite(tmp_path, textwrap.dedent(text) if text else None))


def _rows(run_dir: Path) -> list[dict[str, str]]:
    return read_rows_csv(run_dir / "rows.csv")


def test_rows_carry_metrics_and_bounds(tmp_path):
    suite = _suite(tmp_path)
    outcome = run_suite(suite, tmp_path / "results", progress=False)
    header = (outcome.run_dir / "rows.csv").read_text().splitlines()[0].split(",")
    assert tuple(header[: len(STABLE_COLUMNS)]) == STABLE_COLUMNS and tuple(header) == COLUMNS
    rows = _rows(outcome.run_dir)
    assert sorted(r["case_id"] for r in rows) == sorted(c.case_id for c in suite.cases())
    for row in rows:
        profile = support.chain(row["model"], int(row["batch_size"]))
        budget = int(row["budget_bytes"])
        lo, hi = min_memory(profile), peak_memory(profile)
        fraction = float(row["budget_fraction"])
        assert budget == lo + int(fraction * (hi - lo))
        assert int(row["min_memory_bytes"]) == lo and int(row["peak_memory_bytes"]) == hi
        lb = lower_bound(profile, budget, m_peak=hi)
        assert float(row["budget_lower_bound_s"]) == pytest.approx(lb)  # every row, run or not
        assert int(row["weight_bytes"]) == profile.weight_bytes  # an infeasible row's too (QA: it was empty)
        if row["planner"] == "keep-all" and budget < hi:
            assert row["status"] == "infeasible" and f"needs at least {hi} bytes" in row["message"]
            assert int(row["needed_bytes"]) == hi  # keep-all needs the peak (papers/004 sec. 3.1)
            continue
        assert row["needed_bytes"] == ""
        assert row["status"] == "ok", row["message"]
        makespan = float(row["makespan_s"])
        assert makespan >= lb * (1 - 1e-9)  # papers/004 Prop. 3
        # offloading schedules on one pass with default algorithms: their own bound is the budget's
        assert float(row["lower_bound_s"]) == pytest.approx(lb)
        assert float(row["ratio_to_lb"]) == pytest.approx(makespan / lb)
        assert float(row["ratio_to_budget_lb"]) == pytest.approx(makespan / lb)
        assert float(row["slowdown"]) == pytest.approx(makespan / profile.compute_time)
        assert float(row["throughput"]) == pytest.approx(int(row["batch_size"]) / makespan)
        assert int(row["peak_bytes"]) <= budget
        assert int(row["max_live_bytes"]) <= budget
        assert row["valid"] == "true" and float(row["plan_time_s"]) >= 0
        assert (int(row["moved_bytes"]) > 0) == (budget < hi), row["case_id"]
    meta = read_meta(outcome.run_dir)
    assert meta["status"] == "complete" and meta["cases"] == len(rows)
    env = meta["environment"]
    assert env["python"] == sys.version.split()[0] and env["packages"]["numba"]
    assert "commit" in env["git"]
    assert {"kind": "planner", "name": "prefix", "plugin": "membudget-test-support", "version": "0.0"} in env["plugins"]
    assert (outcome.run_dir / "rows.parquet").exists() == _has("pyarrow")


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_each_profile_is_made_once_and_kept_in_the_run_folder(tmp_path):
    outcome = run_suite(_suite(tmp_path), tmp_path / "results", progress=False)
    assert support.PROFILED == {("synthetic:chain4", 2): 1, ("synthetic:chain8", 1): 1, ("synthetic:chain8", 2): 1}
    assert len(list((outcome.run_dir / "profiles").glob("*.json"))) == 3


def test_a_resumed_run_takes_the_profiles_its_folder_stored(tmp_path):
    """A GPU part resumed in a later call ranks its new rows on the profile its earlier rows ran on: the one
    in the run folder, not a new measurement."""
    suite = _suite(tmp_path)
    run_dir = run_suite(suite, tmp_path / "r", run_id="x", progress=False).run_dir
    kept = [r["case_id"] for r in _rows(run_dir)][:3]
    drop_rows(run_dir, lambda row: row["case_id"] not in kept)
    support.PROFILED.clear()
    outcome = run_suite(suite, tmp_path / "r", run_id="x", resume=True, progress=False)
    assert outcome.ran == len(suite.cases()) - 3 and not support.PROFILED


def test_budget_below_the_minimum_gives_infeasible_rows_with_the_needed_bytes(tmp_path):
    suite = _suite(tmp_path, """\
        name: low
        profiler: synthetic
        device: synthetic
        models: [{model: synthetic:chain4, batch_sizes: [2]}]
        budgets: {bytes: [1KiB, 1GiB]}
        planners: [keep-all, prefix]
        """)
    rows = {r["case_id"]: r for r in _rows(run_suite(suite, tmp_path / "r", progress=False).run_dir)}
    profile = support.chain("synthetic:chain4", 2)
    low = rows["synthetic:chain4/b2/3x32x32/prefix/1KiB/simulate"]
    assert low["status"] == "infeasible"
    assert f"needs at least {min_memory(profile)} bytes" in low["message"]
    assert low["budget_bytes"] == "1024" and low["makespan_s"] == ""
    assert rows["synthetic:chain4/b2/3x32x32/keep-all/1KiB/simulate"]["status"] == "infeasible"
    high = rows["synthetic:chain4/b2/3x32x32/prefix/1GiB/simulate"]
    assert high["status"] == "ok"
    # a byte budget's place in the span from the minimum to the peak (the pages' x axis), as a fraction's is
    lo, hi = min_memory(profile), peak_memory(profile)
    assert float(high["budget_fraction"]) == pytest.approx((2**30 - lo) / (hi - lo))
    assert float(low["budget_fraction"]) == pytest.approx((1024 - lo) / (hi - lo))


def test_only_a_budget_below_the_minimum_is_said_to_be_below_it(tmp_path):
    """A failed row's message adds that the budget is below the minimum memory only where it is: at the
    minimum itself (memory-optimal algorithms) a failure is the planner's own."""
    profile = support.chain("synthetic:chain4", 2)
    least = min_memory(profile, memory_optimal=True)
    suite = _suite(tmp_path, f"""\
        name: edge
        profiler: synthetic
        device: synthetic
        models: [{{model: synthetic:chain4, batch_sizes: [2]}}]
        budgets: {{bytes: [{least - 1}, {least}]}}
        planners: [boom]
        """)
    rows = {int(r["budget_bytes"]): r for r in _rows(run_suite(suite, tmp_path / "r", progress=False).run_dir)}
    assert {r["status"] for r in rows.values()} == {"error"}
    assert f"needs at least {least} bytes" in rows[least - 1]["message"]
    assert "below the minimum" not in rows[least]["message"]


def test_failing_cases_become_rows_and_the_rest_run(tmp_path):
    suite = _suite(tmp_path, support.SUITE.format(name="fail").replace("[keep-all, prefix]", "[prefix, boom, oom]"))
    rows = _rows(run_suite(suite, tmp_path / "r", progress=False).run_dir)
    by_planner = {}
    for row in rows:
        by_planner.setdefault(row["planner"], set()).add((row["status"], row["message"]))
    # a plugin's slip names its line (the innermost frame outside the standard library), by module
    [(status, message)] = by_planner["boom"]
    assert status == "error" and re.fullmatch(r"RuntimeError: boom goes the planner \(at tests\.test_suite_support:"
                                              r"\d+ in plan\)", message), message
    # a planner that exhausts the host is not the budget failing on the device: `oom` is kept for that
    [(status, message)] = by_planner["oom"]
    assert status == "error" and re.fullmatch(r"the host ran out of memory in planner 'oom': MemoryError: cannot "
                                              r"allocate the planning table \(at tests\.test_suite_support:\d+ in "
                                              r"plan\)", message), message
    assert {s for s, _ in by_planner["prefix"]} == {"ok"}
    assert len(rows) == len(suite.cases())


@pytest.mark.parametrize("budget_model", ["chain", "device"])
@pytest.mark.parametrize("slip, words", [
    ("exit", "SystemExit: the plugin called sys.exit(3)"),
    ("none", "PlanContractError: planner sloppy returned NoneType, not a Schedule"),
    ("lie", "PlanContractError: planner sloppy returned a schedule for 1000000000000000 bytes, above the "),
    ("over", "invalid schedule: "),
    ("refuse", "PlanContractError: planner sloppy refused the budget of "),
    ("refuse-float", "InfeasibleBudget.needed_bytes is a whole number of bytes above the budget it was given"),
])
def test_a_planners_slips_are_error_rows_that_say_what_it_did(tmp_path, monkeypatch, slip, words, budget_model):
    """QA, a plugin author's slips: ``sys.exit`` in a plan ended the run with no row and no word; None gave
    'replace() should be called on dataclass instances'; a schedule claiming a larger budget ran as ok against
    that budget (the executors enforce Schedule.budget_bytes); a schedule over the budget, returned instead of
    raising InfeasibleBudget, read as an honest 'infeasible', and so did a refusal needing 1 byte, or a float
    of bytes. Each is an error row now, and the rest run."""
    monkeypatch.setenv("MEMBUDGET_TEST_SLIP", slip)
    suite = _suite(tmp_path, support.SUITE.format(name="slip").replace("[keep-all, prefix]", "[prefix, sloppy]")
                   .replace("[0, 0.5, 1.0]", "[0, 0.5]") + f"budget_model: {budget_model}\n")
    outcome = run_suite(suite, tmp_path / "r", progress=False)
    rows = _rows(outcome.run_dir)
    assert len(rows) == len(suite.cases()) and read_meta(outcome.run_dir)["status"] == "complete"
    sloppy = [r for r in rows if r["planner"] == "sloppy"]
    assert sloppy and all(r["status"] == "error" and words in r["message"] for r in sloppy), sloppy[0]["message"]
    prefix = [r["status"] for r in rows if r["planner"] == "prefix"]  # the others plan as before
    assert set(prefix) == ({"ok"} if budget_model == "chain" else {"infeasible"})  # device: runtime bytes first


@pytest.mark.parametrize("slip", sorted(support.MALFORMED))
def test_a_schedule_no_memory_rule_can_read_is_an_invalid_row_not_a_crash_in_the_core(tmp_path, monkeypatch, slip):
    """QA, a plugin author's malformed schedules: the row read ``IndexError: tuple index out of range (at
    harness.memory:121 in stage_memory)``, ``KeyError: 'X'`` or a NumPy broadcast error, from the memory
    rules and the simulator that read the schedule before the validator did. Its structure is checked as the
    planner returns it: an ``error`` row in the validator's words, ``valid`` false, the other rows run."""
    monkeypatch.setenv("MEMBUDGET_TEST_SLIP", slip)
    suite = _suite(tmp_path, support.SUITE.format(name="slip").replace("[keep-all, prefix]", "[prefix, sloppy]")
                   .replace("[0, 0.5, 1.0]", "[1.0]"))
    outcome = run_suite(suite, tmp_path / "r", progress=False)
    rows = _rows(outcome.run_dir)
    sloppy = [r for r in rows if r["planner"] == "sloppy"]
    assert sloppy and all((r["status"], r["valid"]) == ("error", "false") for r in sloppy)
    assert all(r["message"].startswith(support.MALFORMED[slip]) for r in sloppy), sloppy[0]["message"]
    assert {r["status"] for r in rows if r["planner"] == "prefix"} == {"ok"}


def test_where_an_error_was_raised_skips_the_standard_library():
    """``raised_at`` names the innermost frame outside the standard library and the libraries: a plugin
    that feeds ``json.loads`` bad text is told its own line, not the json module's; one whose pandas
    lookup fails is told its own line, via pandas'."""
    import json as json_module

    import pandas as pd

    from harness.errors import raised_at

    def plugin_code():
        return json_module.loads("{not json")

    try:
        plugin_code()
    except ValueError as exc:
        where = raised_at(exc)
    line = plugin_code.__code__.co_firstlineno + 1
    assert where == f" (at tests.test_runner:{line} in plugin_code)"
    assert raised_at(ValueError("never raised")) == ""

    def plugin_code_with_pandas():  # a KeyError raised deep inside pandas: the plugin's line, via pandas'
        return pd.Series([1.0], index=["a"])["x"]

    try:
        plugin_code_with_pandas()
    except KeyError as exc:
        where = raised_at(exc)
    line = plugin_code_with_pandas.__code__.co_firstlineno + 1
    assert where.startswith(f" (at tests.test_runner:{line} in plugin_code_with_pandas, via pandas."), where


def test_a_helper_misused_by_a_plugin_names_the_plugins_line_too():
    """QA: a planner that gave ``ordered_schedule`` a stage the chain does not have read ``KeyError: (18, 0)
    (at harness.schedules:181 in ordered_schedule)``, no line of its own: the plugin's frame follows."""
    from harness.errors import raised_at
    from harness.schedules import ordered_schedule

    profile = support.chain("synthetic:chain4", 2)

    def plugin_plan():
        return ordered_schedule(profile, 10**12, {18}, planner="careless")

    try:
        plugin_plan()
    except (KeyError, IndexError) as exc:
        where = raised_at(exc)
    line = plugin_plan.__code__.co_firstlineno + 1
    assert where.startswith(" (at harness.") and where.endswith(f", called from tests.test_runner:{line} in plugin_plan)")


def test_profiling_failure_fails_only_that_model(tmp_path):
    text = support.SUITE.format(name="prof").replace("models:\n", "models:\n  - {model: synthetic:broken, batch_sizes: [4]}\n")
    rows = _rows(run_suite(_suite(tmp_path, text), tmp_path / "r", progress=False).run_dir)
    broken = [r for r in rows if r["model"] == "synthetic:broken"]
    assert len(broken) == 6 and len(rows) == 24
    assert all(r["status"] == "error" and re.fullmatch(r"profiling failed: RuntimeError: profiler crashed \(at "
                                                       r"tests\.test_suite_support:\d+ in profile\)", r["message"])
               for r in broken), broken[0]["message"]
    assert {r["status"] for r in rows if r["model"] != "synthetic:broken"} == {"ok", "infeasible"}


def test_the_executors_of_a_case_run_one_plan(tmp_path):
    # a GPU suite's measured run and its simulate twin: one plan, made once (harness.case.SharedPlans)
    text = support.SUITE.format(name="twins").replace("[simulate]", "[simulate, quirky]")
    suite = _suite(tmp_path, text)
    rows = _rows(run_suite(suite, tmp_path / "r", progress=False).run_dir)
    assert len(rows) == 2 * 18 and {r["executor"] for r in rows} == {"simulate", "quirky"}
    # prefix plans 9 cases once each (the infeasible ones refuse once), not once per executor
    assert set(support.PLANS.values()) == {1} and len(support.PLANS) == 9
    twins = {}
    for row in rows:
        twins.setdefault((row["model"], row["batch_size"], row["budget_label"], row["planner"]), []).append(row)
    assert len(twins) == 18 and all(len(pair) == 2 for pair in twins.values())
    for simulated, other in twins.values():
        assert simulated["status"] == other["status"] and simulated["message"] == other["message"]
        for column in ("schedule_fingerprint", "plan_time_s", "makespan_s", "needed_bytes"):
            assert simulated[column] == other[column], column


def test_shared_plans_plan_again_for_other_inputs():
    from harness.case import SharedPlans
    from harness.errors import InfeasibleBudget

    profile = support.chain("synthetic:chain8", 2)
    hi, lo = peak_memory(profile), min_memory(profile)
    planner, plans = support.Prefix(), SharedPlans(size=2)
    first = plans.plan(planner, profile, hi)
    assert plans.plan(planner, profile, hi) is first and sum(support.PLANS.values()) == 1
    plans.plan(planner, profile, hi, duplex=True)  # another copy layout
    plans.plan(support.Prefix(), profile, hi)  # another planner object: its plan may differ
    assert sum(support.PLANS.values()) == 3
    plans.plan(planner, profile, hi)  # the first was the oldest of three kept in two
    assert sum(support.PLANS.values()) == 4
    plans.plan(planner, profile, hi, repeat=1)  # a repeat times its own plan
    assert sum(support.PLANS.values()) == 5
    for _ in range(2):  # a refusal is kept too
        with pytest.raises(InfeasibleBudget):
            plans.plan(planner, profile, lo - 1)
    assert support.PLANS[("prefix", "synthetic:chain8", 2, lo - 1)] == 1


def test_allocators_give_one_row_each(tmp_path):
    text = support.SUITE.format(name="alloc") + "allocators: [caching, first-fit]\n"
    suite = _suite(tmp_path, text)
    rows = _rows(run_suite(suite, tmp_path / "r", progress=False).run_dir)
    assert len(rows) == 2 * 18
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["allocator"] for r in ok} == {"caching", "first-fit"}
    for row in ok:
        assert int(row["arena_bytes"]) >= int(row["max_live_bytes"]) > 0
        assert float(row["fragmentation"]) == pytest.approx(int(row["arena_bytes"]) / int(row["max_live_bytes"]))
    # the two allocators of one case share the plan and the run
    pairs = {}
    for row in ok:
        pairs.setdefault(row["case_id"].rsplit("/", 1)[0], set()).add((row["makespan_s"], row["peak_bytes"]))
    assert all(len(v) == 1 for v in pairs.values())
    assert sum(support.PLANS.values()) == 9  # one plan per case, not per allocator


def test_an_allocator_placement_is_judged_by_the_core_not_taken_at_its_word(tmp_path):
    """QA: an allocator placing every block at offset 0 got ok rows, an arena below the max-live bytes and
    'optimal', and won the published placement table; one returning a dict blamed the harness. Each is now
    an error row naming the allocator, beside the good allocator's rows of the same schedule."""
    text = support.SUITE.format(name="alloc") + "allocators: [first-fit, overlapper, not-a-placement]\n"
    rows = _rows(run_suite(_suite(tmp_path, text), tmp_path / "r", progress=False).run_dir)
    ran = {r["case_id"].rsplit("/", 1)[0] for r in rows if r["allocator"] == "first-fit" and r["status"] == "ok"}
    assert ran
    for row in rows:
        if row["case_id"].rsplit("/", 1)[0] not in ran:
            continue
        if row["allocator"] == "first-fit":
            assert row["status"] == "ok" and int(row["arena_bytes"]) >= int(row["max_live_bytes"])
        elif row["allocator"] == "overlapper":
            assert row["status"] == "error" and row["arena_bytes"] == ""
            assert row["message"].startswith("allocator overlapper: invalid placement: ")
            assert "share addresses while both alive" in row["message"] or "end beyond the arena" in row["message"]
        else:
            assert row["status"] == "error"
            assert row["message"] == "allocator not-a-placement: returned a dict, not a harness.model.Placement"


CRASHER_SUITE = (support.SUITE.format(name="crash").replace("[keep-all, prefix]", "[prefix]").replace("[1, 2]", "[1]")
                 .replace("[0, 0.5, 1.0]", "[1.0]") + "allocators: [first-fit, crasher]\ntimelines: [{planner: prefix}]\n")


def _only_the_crashing_allocator_failed(suite, outcome):
    from harness.workers import WORKER_DIED

    rows = _rows(outcome.run_dir)
    assert read_meta(outcome.run_dir)["status"] == "complete"
    assert sorted(r["case_id"] for r in rows) == sorted(c.case_id for c in suite.cases())
    by_allocator = {}
    for row in rows:
        by_allocator.setdefault(row["allocator"], []).append(row)
    assert all((r["status"], r["message"]) == ("error", WORKER_DIED) for r in by_allocator["crasher"])
    assert all(r["status"] == "ok" and int(r["arena_bytes"]) >= int(r["max_live_bytes"]) > 0
               for r in by_allocator["first-fit"])
    assert len(by_allocator["first-fit"]) == len(by_allocator["crasher"]) == 2
    # the unit's timeline comes from the part that finished (runner._joined)
    assert all(r["timeline"] and (outcome.run_dir / r["timeline"]).is_file() for r in by_allocator["first-fit"])


@pytest.mark.parametrize("jobs, limit", [(2, None), (1, 60)])
def test_an_allocator_that_kills_its_worker_costs_its_own_rows_only(tmp_path, jobs, limit):
    """QA: an allocator crashing in native code killed the worker of its unit, and every row of that unit
    (the other allocators' placements of the same run) said the worker died. A unit that dies alone runs
    again case by case: only the crashing allocator's rows are errors."""
    suite = _suite(tmp_path, CRASHER_SUITE)
    _only_the_crashing_allocator_failed(suite, run_suite(suite, tmp_path / "r", jobs=jobs, case_timeout=limit,
                                                         progress=False))


def test_on_ray_an_allocator_that_kills_its_worker_costs_its_own_rows_only(tmp_path):
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'membudget[ray]')")
    suite = _suite(tmp_path, CRASHER_SUITE)
    _only_the_crashing_allocator_failed(suite, _run_on_ray(suite, tmp_path / "r"))


def test_timelines_are_saved_for_selected_cases(tmp_path):
    text = support.SUITE.format(name="tl") + "timelines: [{planner: prefix, budget: 0}]\n"
    outcome = run_suite(_suite(tmp_path, text), tmp_path / "r", progress=False)
    files = sorted((outcome.run_dir / "timelines").glob("*.json"))
    assert len(files) == 3  # one per model/batch
    rows = [r for r in _rows(outcome.run_dir) if r["timeline"]]
    assert {r["planner"] for r in rows} == {"prefix"} and {r["budget_label"] for r in rows} == {"f0"}
    data = json.loads((outcome.run_dir / rows[0]["timeline"]).read_text())
    streams = {e[1] for e in data["events"]}
    assert streams == {"compute", "copy"}
    assert max(e[3] for e in data["events"]) == pytest.approx(float(rows[0]["makespan_s"]))


def test_planning_time_leaves_out_the_first_call_compile(tmp_path, monkeypatch):
    """The first call's hour-long 'compile' passes on a clock the stopwatch reads and nothing else moves:
    a row timed across it would read 3600 s, every row reads 0."""
    from types import SimpleNamespace

    import harness.case
    import harness.jit_time

    clock = [0.0]
    monkeypatch.setattr(harness.jit_time, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(support.SlowFirst, "compile", staticmethod(lambda: clock.__setitem__(0, clock[0] + 3600)))
    monkeypatch.setattr(support.SlowFirst, "compiled", False)
    monkeypatch.setattr(harness.case, "_WARMED", set())  # warmed by no earlier test of this process
    suite = _suite(tmp_path, support.SUITE.format(name="jit").replace("[keep-all, prefix]", "[slow-first]"))
    rows = _rows(run_suite(suite, tmp_path / "r", progress=False).run_dir)
    assert support.SlowFirst.compiled and clock[0] == 3600 and all(r["status"] == "ok" for r in rows)
    assert {float(r["plan_time_s"]) for r in rows} == {0.0}  # the first call was the warm-up


def test_a_planner_that_changes_the_working_folder_does_not_lose_a_relative_run_folder(tmp_path, monkeypatch):
    """QA: a planner calling os.chdir broke a --jobs 1 run given a relative -o: 'out/chdir/c1/meta.json: No such
    file or directory', meta.json stayed running, the lock stayed. The run folder is absolute from the start."""
    monkeypatch.chdir(tmp_path)  # and back after the test, wherever the planner went
    monkeypatch.setenv("MEMBUDGET_TEST_SLIP", "chdir")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("MEMBUDGET_TEST_CHDIR", str(tmp_path / "elsewhere"))
    suite = _suite(tmp_path, support.SUITE.format(name="chdir").replace("[keep-all, prefix]", "[prefix, sloppy]")
                   .replace("[1, 2]", "[1]"))
    outcome = run_suite(suite, "out", run_id="c1", progress=False)
    run_dir = tmp_path / "out" / "chdir" / "c1"
    assert outcome.run_dir == run_dir and read_meta(run_dir)["status"] == "complete"
    assert {r["status"] for r in _rows(run_dir)} == {"ok"} and len(_rows(run_dir)) == len(suite.cases())
    assert not (tmp_path / "out" / "chdir" / ".c1.lock").exists()


def test_a_named_run_is_never_appended_to_by_accident(tmp_path):
    from harness.errors import MembudgetError

    suite = _suite(tmp_path)
    run_suite(suite, tmp_path / "r", run_id="x", progress=False)
    with pytest.raises(MembudgetError, match="exists: resume it"):
        run_suite(suite, tmp_path / "r", run_id="x", progress=False)
    again = run_suite(suite, tmp_path / "r", run_id="x", overwrite=True, progress=False)
    assert again.ran == len(suite.cases()) == len(_rows(again.run_dir))


def test_interrupted_run_resumes_without_losing_or_repeating_a_case(tmp_path):
    suite = _suite(tmp_path, support.SUITE.format(name="intr").replace("[keep-all, prefix]", "[interrupter]"))
    total = len(suite.cases())
    support.Interrupter.calls, support.Interrupter.interrupt_at = 0, 4
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite, tmp_path / "r", progress=False)
    run_dir = next((tmp_path / "r" / "intr").iterdir())
    first = _rows(run_dir)
    assert len(first) == 3 and read_meta(run_dir)["status"] == "interrupted"
    support.Interrupter.interrupt_at = 0
    outcome = run_suite(suite, tmp_path / "r", resume=True, progress=False)
    assert outcome.run_dir == run_dir and outcome.skipped == 3 and outcome.ran == total - 3
    ids = [r["case_id"] for r in _rows(run_dir)]
    assert len(ids) == len(set(ids)) == total
    assert [r["case_id"] for r in _rows(run_dir)[:3]] == [r["case_id"] for r in first]
    assert all(n == 1 for n in support.PLANS.values()) and len(support.PLANS) == total
    meta = read_meta(run_dir)
    assert meta["status"] == "complete" and [s["status"] for s in meta["sessions"]] == ["interrupted", "complete"]
    again = run_suite(suite, tmp_path / "r", resume=True, progress=False)
    assert again.ran == 0 and len(_rows(run_dir)) == total


def test_resume_without_a_run_id_continues_the_run_started_last(tmp_path):
    """``--resume`` alone takes the suite's latest run: the one started last, whatever the names sort as
    (here the finished run is "b", the interrupted one started after it "a")."""
    suite = _suite(tmp_path, support.SUITE.format(name="latest").replace("[keep-all, prefix]", "[interrupter]"))
    total = len(suite.cases())
    support.Interrupter.calls, support.Interrupter.interrupt_at = 0, 0
    assert run_suite(suite, tmp_path / "r", run_id="b", progress=False).ran == total
    support.Interrupter.calls, support.Interrupter.interrupt_at = 0, 4
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite, tmp_path / "r", run_id="a", progress=False)
    support.Interrupter.interrupt_at = 0
    outcome = run_suite(suite, tmp_path / "r", resume=True, progress=False)
    assert outcome.run_dir == tmp_path / "r" / "latest" / "a"
    assert (outcome.skipped, outcome.ran) == (3, total - 3)
    assert read_meta(outcome.run_dir)["status"] == "complete" and len(_rows(tmp_path / "r" / "latest" / "b")) == total


def test_ctrl_c_inside_a_compiled_kernel_interrupts_the_run_and_is_never_a_row(tmp_path):
    """Numba turns Ctrl-C into a SystemError whose context is the KeyboardInterrupt: still an interrupt."""
    suite = _suite(tmp_path, support.SUITE.format(name="numba").replace("[keep-all, prefix]", "[numba-interrupter]"))
    total = len(suite.cases())
    support.NumbaInterrupter.calls, support.NumbaInterrupter.interrupt_at = 0, 4
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite, tmp_path / "r", progress=False)
    run_dir = next((tmp_path / "r" / "numba").iterdir())
    rows = _rows(run_dir)
    assert len(rows) == 3 and all(r["status"] != "error" for r in rows)
    assert read_meta(run_dir)["status"] == "interrupted"
    support.NumbaInterrupter.interrupt_at = 0
    outcome = run_suite(suite, tmp_path / "r", resume=True, progress=False)
    assert outcome.ran == total - 3 and len(_rows(run_dir)) == total


def test_resuming_with_another_suite_counts_only_its_cases_and_keeps_the_earlier_spec(tmp_path):
    """The GPU suite's parts share one run folder: a resume by another spec keeps the rows it does not
    have, says so, and meta.json keeps the spec those rows ran."""
    first = _suite(tmp_path, support.SUITE.format(name="parts"))
    run_suite(first, tmp_path / "r", run_id="p", progress=False)
    before = _rows(tmp_path / "r" / "parts" / "p")
    (tmp_path / "b").mkdir()
    second = load_suite(support.write_suite(tmp_path / "b", support.SUITE.format(name="parts").replace(
        "[keep-all, prefix]", "[prefix, {name: prefix, label: prefix-again}]")))
    outcome = run_suite(second, tmp_path / "r", run_id="p", resume=True, progress=False)
    n_prefix = sum(r["planner_label"] == "prefix" for r in before)
    assert outcome.skipped == n_prefix and outcome.ran == len(second.cases()) - n_prefix
    assert any(f"{len(before) - n_prefix} row(s) of" in n and "they are kept" in n for n in outcome.notes)
    rows = _rows(outcome.run_dir)
    assert {r["case_id"] for r in before} <= {r["case_id"] for r in rows}
    assert len(rows) == len(before) + outcome.ran
    meta = read_meta(outcome.run_dir)
    assert meta["spec"]["planners"] == ["prefix", {"name": "prefix", "label": "prefix-again"}]
    assert meta["earlier_specs"] == [{"source": str(first.source), "spec": first.raw}]
    assert meta["sessions"][-1]["cases_run"] == outcome.ran
    assert meta["cases"] == len(rows)  # QA: it counted the second suite's cases alone


SAME = support.SUITE.replace("[keep-all, prefix]", "[keep-all, {{name: keep-all, label: again}}, prefix]").replace(
    "[simulate]", "[noisy]")


def _runs_by_key(rows):
    """key -> the rows of one schedule's run, in the grid's order (the first ran, the others took it)."""
    out = {}
    for row in rows:
        if row["schedule_fingerprint"]:
            out.setdefault(key(row), []).append(row)
    return out


# a device budget: the planner gets what is left of it (its planning_budget_bytes, in the key); the caching
# allocator reserves 2 MiB segments for small blocks, which these tiny chains need
@pytest.mark.parametrize("budgets", ["chain", "device"])
def test_under_reuse_a_schedule_runs_once_and_the_cases_that_share_it_take_its_figures(tmp_path, budgets):
    support.NOISY_RUNS.clear()
    text = SAME.format(name="same") + "same_schedule: reuse\n"
    if budgets == "device":
        text = text.replace("{fractions: [0, 0.5, 1.0]}", "{fractions: [0.5, 1.0], bytes: [4MiB]}")
        text += "budget_model: device\n"
    suite = _suite(tmp_path, text)
    rows = _rows(run_suite(suite, tmp_path / "r", progress=False).run_dir)
    groups = _runs_by_key(rows)
    # keep-all and its second label plan one schedule wherever keep-all fits (and prefix may too): one run each
    assert len(support.NOISY_RUNS) == len(groups) < sum(len(g) for g in groups.values())
    assert any(len(g) > 1 for g in groups.values())
    for group in groups.values():
        first, *others = group
        assert "not run again" not in first["message"]
        for row in others:  # in the grid's order: the first case of the key ran
            assert row["makespan_s"] == first["makespan_s"] and row["status"] == first["status"]
            assert row["peak_bytes"] == first["peak_bytes"] and row["valid"] == first["valid"]
            assert (f"the same schedule as {first['planner_label']}'s (fingerprint {first['schedule_fingerprint']}; "
                    f"case {first['case_id']}): that run's figures, not run again") in row["message"]
            assert row["planner_label"] != first["planner_label"] and float(row["plan_time_s"]) >= 0
            assert row["run_time_s"] == "" and took_earlier_run(row)  # it did not run
        assert not took_earlier_run(first)


def test_a_case_that_wants_a_timeline_takes_a_run_that_saved_one_or_runs(tmp_path):
    """A taken row's timeline is the run's own file; where that run saved none and the case asks for one,
    the case runs and saves its own (a review found it left without one)."""
    support.NOISY_RUNS.clear()
    text = SAME.format(name="tl") + "same_schedule: reuse\n"
    rows = _rows(run_suite(_suite(tmp_path, text), tmp_path / "r", progress=False).run_dir)
    taken = [r for r in rows if took_earlier_run(r)]
    assert taken and all(r["timeline"] and r["timeline"] == _runs_by_key(rows)[key(r)][0]["timeline"] for r in taken)
    (tmp_path / "b").mkdir()
    support.NOISY_RUNS.clear()
    only = load_suite(support.write_suite(tmp_path / "b", text + "timelines: [{planner: again}]\n"))
    run_dir = run_suite(only, tmp_path / "r2", progress=False).run_dir
    again = [r for r in _rows(run_dir) if r["planner_label"] == "again" and r["schedule_fingerprint"]]
    assert again and all(not took_earlier_run(r) and (run_dir / r["timeline"]).is_file() for r in again)


def test_reuse_leaves_the_cases_with_an_allocator_alone_and_says_so(tmp_path):
    support.NOISY_RUNS.clear()
    heard: list[str] = []
    suite = _suite(tmp_path, SAME.format(name="alloc") + "same_schedule: reuse\nallocators: [caching]\n")
    rows = _rows(run_suite(suite, tmp_path / "r", progress=False, on_note=heard.append).run_dir)
    assert "same_schedule: reuse leaves the cases with an allocator alone" in " ".join(heard)
    assert len(support.NOISY_RUNS) == len({r["case_id"].rsplit("/", 1)[0] for r in rows if r["schedule_fingerprint"]})
    assert not any(took_earlier_run(r) for r in rows)


def test_under_reuse_a_case_with_an_allocator_never_takes_a_run_without_a_trace(tmp_path):
    """A run folder shared by two suites (the GPU table's parts): the rows of one without allocators hold the
    same schedules' runs, which carry no memory trace, so the other's cases with an allocator run their own."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = load_suite(support.write_suite(tmp_path / "a", SAME.format(name="mix") + "same_schedule: reuse\n"))
    placed = load_suite(support.write_suite(tmp_path / "b", SAME.format(name="mix")
                                            + "same_schedule: reuse\nallocators: [caching]\n"))
    run_suite(plain, tmp_path / "r", run_id="x", progress=False)
    outcome = run_suite(placed, tmp_path / "r", run_id="x", resume=True, progress=False)
    rows = [r for r in _rows(outcome.run_dir) if r["allocator"]]
    assert len(rows) == len(placed.cases()) and not any(took_earlier_run(r) for r in rows)
    assert all(int(r["arena_bytes"]) >= int(r["max_live_bytes"]) > 0 for r in rows if r["status"] == "ok")


def test_by_default_every_case_runs_its_schedule(tmp_path):
    support.NOISY_RUNS.clear()
    rows = _rows(run_suite(_suite(tmp_path, SAME.format(name="apart")), tmp_path / "r", progress=False).run_dir)
    ran = [r for r in rows if r["schedule_fingerprint"]]
    assert len(support.NOISY_RUNS) == len(ran)
    again = {(r["model"], r["batch_size"], r["budget_label"]): r["makespan_s"] for r in ran if r["planner_label"] == "again"}
    assert again and all(r["makespan_s"] != again[r["model"], r["batch_size"], r["budget_label"]]
                         for r in ran if r["planner_label"] == "keep-all")  # timed apart: its own noise


def test_a_resumed_run_reuses_the_runs_its_folder_holds_but_not_an_error_nor_another_budget(tmp_path):
    support.NOISY_RUNS.clear()
    first = _suite(tmp_path, SAME.format(name="res").replace("{name: keep-all, label: again}, ", "")
                   + "same_schedule: reuse\n")
    run_dir = run_suite(first, tmp_path / "r", run_id="x", progress=False).run_dir
    before = {r["case_id"]: r for r in _rows(run_dir)}
    broken = "synthetic:chain8/b1/3x32x32/keep-all/f1/noisy"
    support.rewrite_rows(run_dir, lambda row: row.update(status="error", message="a fault")
                         if row["case_id"] == broken else None)
    ran_first = len(support.NOISY_RUNS)
    (tmp_path / "b").mkdir()
    second = load_suite(support.write_suite(tmp_path / "b", SAME.format(name="res") + "same_schedule: reuse\n"))
    rows = {r["case_id"]: r for r in _rows(run_suite(second, tmp_path / "r", run_id="x", resume=True,
                                                      progress=False).run_dir)}
    # the new cases took keep-all's runs from rows.csv ...
    for case_id in ("synthetic:chain4/b2/3x32x32/keep-all/f1/noisy", "synthetic:chain8/b2/3x32x32/keep-all/f1/noisy"):
        again = rows[case_id.replace("/keep-all/", "/again/")]
        assert again["makespan_s"] == before[case_id]["makespan_s"] and f"case {case_id})" in again["message"]
    # ... but not the error row's, nor prefix's there, which had taken that one's: that case alone ran
    assert len(support.NOISY_RUNS) == ran_first + 1
    again = rows[broken.replace("/keep-all/", "/again/")]
    assert again["status"] == "ok" and again["message"] == "" and again["run_time_s"] != ""
    # prefix's same operations and copies at two budgets ran at each: what a run is held to is part of it
    f0, f05 = (before[f"synthetic:chain4/b2/3x32x32/prefix/{b}/noisy"] for b in ("f0", "f0.5"))
    assert f0["run_time_s"] and f05["run_time_s"] and f0["makespan_s"] != f05["makespan_s"]


def test_a_run_says_before_its_cases_when_nothing_is_left_to_run_or_jobs_outnumber_the_cores(tmp_path, monkeypatch):
    """QA: resuming a finished run said nothing until its end, and ``--jobs 3`` on 2 cores said
    nothing of the times it slows down. Both are notes, heard before any case runs."""
    import harness.runner as runner

    suite = _suite(tmp_path)
    heard: list[str] = []
    run_suite(suite, tmp_path / "r", run_id="x", progress=False)
    again = run_suite(suite, tmp_path / "r", run_id="x", resume=True, progress=False, on_note=heard.append)
    assert again.ran == 0 and heard == [f"every case of the suite has its row in {again.run_dir} already: nothing "
                                        "to run (--retry STATUS runs the cases of a status again)"]
    monkeypatch.setattr(runner, "_usable_cores", lambda: 1)
    heard.clear()
    run_suite(suite, tmp_path / "r", run_id="y", jobs=2, progress=False, on_note=heard.append)
    assert heard == ["--jobs 2 is more than the 1 CPU core this process may use: the cases share cores, and the "
                     "times they measure (plan_time_s, a torch executor's iterations) are slower for it"]
    heard.clear()
    run_suite(suite, tmp_path / "r", run_id="z", jobs=1, progress=False, on_note=heard.append)
    assert heard == []


def test_resume_reruns_error_rows_left_by_an_interrupt_without_duplicating_them(tmp_path):
    """Rows recorded as errors by an interrupt (before interrupts were recognised) are run again."""
    suite = _suite(tmp_path)
    first = run_suite(suite, tmp_path / "r", run_id="old", progress=False)
    rows = _rows(first.run_dir)
    stale = {rows[1]["case_id"]: "SystemError: CPUDispatcher(<function f at 0x7f>) returned a result with an "
             "exception set", rows[4]["case_id"]: "KeyboardInterrupt: "}
    for row in rows:
        if row["case_id"] in stale:
            row.update(status="error", message=stale[row["case_id"]], makespan_s="")
    with open(first.run_dir / "rows.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    from harness.results import finished_case_ids

    assert finished_case_ids(first.run_dir) == {r["case_id"] for r in rows} - set(stale)
    support.PLANS.clear()
    outcome = run_suite(suite, tmp_path / "r", run_id="old", resume=True, progress=False)
    assert outcome.ran == 2 and outcome.skipped == len(rows) - 2
    after = _rows(first.run_dir)
    ids = [r["case_id"] for r in after]
    assert len(ids) == len(set(ids)) == len(rows)
    again = {r["case_id"]: r for r in after}
    assert all(again[c]["message"] != m for c, m in stale.items())
    assert all(again[c]["status"] in ("ok", "infeasible") for c in stale)
    assert sorted(outcome.rows["case_id"]) == sorted(ids)


def test_an_interrupt_row_beside_its_cases_finished_row_is_not_a_second_row(tmp_path):
    """A case with an interrupt's error row beside its finished row counts one row: resume does not refuse the
    folder as one whose case has two rows (_check_one_row_per_case), and the case ends with one row, no error."""
    suite = _suite(tmp_path)
    first = run_suite(suite, tmp_path / "r", run_id="x", progress=False)
    rows = _rows(first.run_dir)
    with open(first.run_dir / "rows.csv", "a", newline="") as f:
        csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n").writerow(
            {**rows[2], "status": "error", "message": "KeyboardInterrupt: ", "makespan_s": ""})
    outcome = run_suite(suite, tmp_path / "r", run_id="x", resume=True, progress=False)
    ids = [r["case_id"] for r in _rows(outcome.run_dir)]
    assert sorted(ids) == sorted(r["case_id"] for r in rows)
    assert all(r["status"] != "error" for r in _rows(outcome.run_dir))


@pytest.mark.slow
def test_killed_process_resumes_from_its_rows(tmp_path):
    """SIGKILL mid-run (no cleanup at all): every finished row survives, resume runs the rest once."""
    suite_path = support.write_suite(
        tmp_path, support.SUITE.format(name="kill").replace("[keep-all, prefix]", "[killer]"))
    script = textwrap.dedent(f"""
        import sys
        from tests import test_suite_support as support
        support.install()
        from harness.cli import main
        sys.exit(main(["run", {str(suite_path)!r}, "-o", {str(tmp_path / 'r')!r}, "--no-progress"]))
    """)
    env = {**os.environ, "MEMBUDGET_TEST_KILL_AT": "6", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == -9, done.stderr
    run_dir = next(p for p in (tmp_path / "r" / "kill").iterdir() if p.is_dir())  # a SIGKILL leaves .<id>.lock
    first = [r["case_id"] for r in _rows(run_dir)]
    assert len(first) == 5
    with open(run_dir / "rows.csv", "a") as f:  # as if killed in the middle of a write
        f.write("kill,synthetic:chain8/b2/3x32x32/killer/f1/sim")
    from harness.cli import main

    assert main(["run", str(suite_path), "-o", str(tmp_path / "r"), "--resume", "--no-progress", "--json"]) == 0
    rows = _rows(run_dir)
    ids = [r["case_id"] for r in rows]
    total = len(load_suite(suite_path).cases())
    assert len(ids) == len(set(ids)) == total and ids[:5] == first
    assert sum(support.PLANS.values()) == total - 5  # this process planned only what was missing
    with open(run_dir / "rows.csv") as f:
        assert all(len(r) == len(COLUMNS) for r in csv.reader(f))


def _comparable(rows):
    return sorted(({k: v for k, v in r.items() if k not in TIMING} for r in rows), key=lambda r: r["case_id"])


@pytest.mark.slow
def test_process_pool_gives_the_same_rows(tmp_path):
    text = support.SUITE.format(name="pool").replace("[1, 2]", "[1]")
    suite = _suite(tmp_path, text)
    one = _rows(run_suite(suite, tmp_path / "a", progress=False).run_dir)
    two = _rows(run_suite(suite, tmp_path / "b", jobs=2, progress=False).run_dir)
    assert _comparable(one) == _comparable(two)


def test_a_full_disk_leaves_the_old_parquet_and_reports_the_first_error(tmp_path, monkeypatch):
    """rows.parquet is written beside and renamed: a disk that fills mid-write left it torn and unreadable.
    Its failure never hides the error that stopped the run (rows.csv's), which named no file."""
    pytest.importorskip("pyarrow")
    import pandas as pd

    from harness.results import load_rows

    suite = _suite(tmp_path)
    run_dir = run_suite(suite, tmp_path / "r", run_id="a", progress=False).run_dir
    good = (run_dir / "rows.parquet").read_bytes()

    def full_disk(self, path, **kwargs):
        Path(path).write_bytes(b"PAR1 torn")
        raise OSError(27, "File too large")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full_disk)
    with pytest.raises(OSError) as info:
        run_suite(suite, tmp_path / "r", run_id="a", progress=False, resume=True)
    assert info.value.filename == str(run_dir / "rows.parquet")
    assert (run_dir / "rows.parquet").read_bytes() == good and not list(run_dir.glob("*.tmp"))

    def csv_full(self, rows):
        raise OSError(28, "No space left on device", str(run_dir / "rows.csv"))

    monkeypatch.setattr("harness.runner.RowWriter.append", csv_full)
    with pytest.raises(OSError) as info:
        run_suite(suite, tmp_path / "r", run_id="b", progress=False)
    assert info.value.filename.endswith("rows.csv")
    assert len(load_rows(run_dir)) == len(suite.cases())


def test_resuming_a_run_id_that_does_not_exist_says_so(tmp_path):
    """Not 'nothing to resume under results/synth' when that folder holds other runs."""
    suite = _suite(tmp_path)
    run_suite(suite, tmp_path / "r", run_id="other", progress=False)
    outcome = run_suite(suite, tmp_path / "r", run_id="new", resume=True, progress=False)
    assert f"{tmp_path / 'r' / 'synth' / 'new'} does not exist yet: started it (a misspelt id? the suite's runs " \
        "are other)" in outcome.notes  # the ids it could have meant, for a typo that starts a whole run
    for k in range(5):
        run_suite(suite, tmp_path / "r", run_id=f"x{k}", progress=False)
    outcome = run_suite(suite, tmp_path / "r", run_id="newer", resume=True, progress=False)
    assert any(n.endswith("the suite's runs are x0, x1, x2, x3, x4 and 2 more)") for n in outcome.notes), \
        outcome.notes  # five of seven named: the note says that there are more


def test_a_run_folder_that_cannot_be_replaced_is_named(tmp_path, monkeypatch):
    """--overwrite on a read-only folder: rmtree's error named a profile file relative to it."""
    suite = _suite(tmp_path)
    run_dir = run_suite(suite, tmp_path / "r", run_id="a", progress=False).run_dir

    def read_only(path, *args, **kwargs):
        raise OSError(30, "Read-only file system", "synthetic_chain4-b2.json")

    monkeypatch.setattr("harness.runner.shutil.rmtree", read_only)
    with pytest.raises(OSError) as info:
        run_suite(suite, tmp_path / "r", run_id="a", overwrite=True, progress=False)
    assert info.value.filename == str(run_dir) and "Read-only file system" in info.value.strerror


def test_a_run_folder_has_one_writer_at_a_time(tmp_path):
    """A second run into a folder another run is writing (--resume, --overwrite) is refused before it
    touches anything: two writers duplicated rows, and --overwrite deleted the first run's folder."""
    from harness.errors import MembudgetError
    from harness.runner import RunLock

    suite = _suite(tmp_path)
    first = run_suite(suite, tmp_path / "r", run_id="a", progress=False)
    before = (first.run_dir / "rows.csv").read_text()
    held = RunLock(first.run_dir)  # as a run in another process holds it
    try:
        for how in ({"resume": True}, {"overwrite": True}):
            with pytest.raises(MembudgetError, match=f"is being written by another membudget run .pid {os.getpid()}."):
                run_suite(suite, tmp_path / "r", run_id="a", progress=False, **how)
            assert (first.run_dir / "rows.csv").read_text() == before
    finally:
        held.release()
    assert run_suite(suite, tmp_path / "r", run_id="a", progress=False, overwrite=True).ran == len(suite.cases())


@pytest.mark.slow
@pytest.mark.parametrize("jobs, limit", [(2, None), (1, 60)])
def test_a_worker_that_dies_costs_its_case_only(tmp_path, monkeypatch, jobs, limit):
    """A planner that kills its worker process (a crash in native code, os._exit, the OS) under --jobs 2, or
    --jobs 1 with a case time limit (which runs the cases in a worker too): its cases are error rows that
    say so, every other case has its row, and no worker is left behind. The dead worker broke the pool and
    the run with it (a BrokenProcessPool traceback, 14 of 56 rows)."""
    import multiprocessing

    from harness.workers import WORKER_DIED

    monkeypatch.setenv("MEMBUDGET_TEST_KILL_AT", "1")  # each worker process dies on its first killer plan
    text = support.SUITE.format(name="crash").replace("[keep-all, prefix]", "[keep-all, killer]")
    suite = _suite(tmp_path, text.replace("[1, 2]", "[1]").replace("[0, 0.5, 1.0]", "[0.5, 1.0]"))
    rows = _rows(run_suite(suite, tmp_path / "r", jobs=jobs, case_timeout=limit, progress=False).run_dir)
    assert sorted(r["case_id"] for r in rows) == sorted(c.case_id for c in suite.cases())
    killed = [r for r in rows if r["planner"] == "killer"]
    assert len(killed) == 4 and all((r["status"], r["message"]) == ("error", WORKER_DIED) for r in killed)
    assert all(r["status"] in ("ok", "infeasible") for r in rows if r["planner"] == "keep-all")
    assert not multiprocessing.active_children()


@pytest.mark.slow
def test_a_unit_sent_to_a_pool_that_broke_since_the_last_wait_still_gets_its_rows(tmp_path, monkeypatch):
    """A worker that died since the last wait breaks the pool before the next unit is sent: ``submit`` raises
    BrokenProcessPool. That unit runs again alone, as the pool's other units do, and every case has its row.
    (The parent's ``submit`` raises it here on its third call, standing in for a death between two waits.)"""
    from concurrent.futures.process import BrokenProcessPool

    import harness.workers

    submit, calls = harness.workers._Watch.submit, []

    def breaks_once(self, task):
        calls.append(task)
        if len(calls) == 3:
            raise BrokenProcessPool("a worker died since the last wait")
        return submit(self, task)

    monkeypatch.setattr(harness.workers._Watch, "submit", breaks_once)
    suite = _suite(tmp_path, support.SUITE.format(name="broke").replace("[0, 0.5, 1.0]", "[1.0]"))
    rows = _rows(run_suite(suite, tmp_path / "r", jobs=2, progress=False).run_dir)
    assert len(calls) > 3
    assert sorted(r["case_id"] for r in rows) == sorted(c.case_id for c in suite.cases())
    assert {r["status"] for r in rows} == {"ok"}


def _run_on_ray(suite, root, case_timeout=None, gpus=None, **env):
    """``suite`` run on a local Ray of two CPUs whose workers see this checkout (and ``env``); ``gpus``
    declares that many GPUs, which Ray then counts whatever the machine has (None: the ones it finds)."""
    import ray

    ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), **env}})
    try:
        return run_suite(suite, root, backend="ray", jobs=2, case_timeout=case_timeout, progress=False)
    finally:
        ray.shutdown()


class _FailingCluster:
    """Ray as the runner uses it, run in this process, whose cluster fails on the second result asked for."""

    def __init__(self, ray):
        self.exceptions, self.asked, self.cancelled = ray.exceptions, 0, []

    def is_initialized(self):
        return True  # the caller's cluster: the runner neither starts nor stops it

    def remote(self, max_retries):
        class Remote:
            def __init__(self, fn):
                self.fn = fn

            def options(self, **_):
                return self

            def remote(self, task, *arguments):
                return functools.partial(self.fn, task, *arguments)  # a reference: hashed by identity

        return lambda fn: Remote(fn)

    def wait(self, pending, num_returns, timeout):
        return pending[:1], pending[1:]

    def get(self, ref):
        self.asked += 1
        if self.asked == 2:
            raise self.exceptions.RaySystemError("the cluster went away")
        return ref()

    def cancel(self, ref, force):
        self.cancelled.append(ref)


def test_on_ray_a_failing_cluster_stops_the_run_and_loses_no_finished_case(tmp_path, monkeypatch):
    """Any Ray error but a dead worker or a task that raised (the cluster failing) stops the run: the
    unit that finished keeps its rows, the ones not collected are cancelled, meta.json says
    interrupted, and --resume runs the rest."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'membudget[ray]')")
    import harness.runner
    from harness.suite import iter_units

    cluster = _FailingCluster(ray)
    monkeypatch.setattr(harness.runner, "_import_ray", lambda: cluster)
    suite = _suite(tmp_path)
    with pytest.raises(ray.exceptions.RaySystemError, match="the cluster went away"):
        run_suite(suite, tmp_path / "r", run_id="x", backend="ray", jobs=2, progress=False)
    run_dir = tmp_path / "r" / suite.name / "x"
    kept = _rows(run_dir)
    units = list(iter_units(suite.cases()))
    assert [r["case_id"] for r in kept] == [c.case_id for c in units[0]]
    assert len(cluster.cancelled) == len(units) - 2  # all but the one collected and the one that failed
    assert read_meta(run_dir)["status"] == "interrupted"
    # a task run in the driver's own process (as this cluster, or Ray's local mode, runs them) leaves
    # Ctrl-C an interrupt there: it once turned the rest of the process's interrupts into error rows
    from harness.case import classify

    with pytest.raises(KeyboardInterrupt):
        classify(KeyboardInterrupt())
    monkeypatch.undo()
    again = run_suite(suite, tmp_path / "r", run_id="x", resume=True, progress=False)
    assert again.ran == len(suite.cases()) - len(kept) and read_meta(run_dir)["status"] == "complete"


class _OwnCluster(_FailingCluster):
    """Ray as the runner uses it when no cluster runs: the runner starts it, and stops it. Its shutdown
    leaves SIGTERM's default action behind, as Ray 2.60's does (the process dies at a SIGTERM then), and
    records what the run folder said at that moment; ``fail_at``: the result whose fetch is interrupted."""

    def __init__(self, ray, run_dir: Path, fail_at: int = 0) -> None:
        super().__init__(ray)
        self.run_dir, self.fail_at, self.running, self.at_shutdown = run_dir, fail_at, False, None

    def is_initialized(self):
        return self.running

    def init(self, **_):
        self.running = True

    def get(self, ref):
        self.asked += 1
        if self.asked == self.fail_at:
            raise KeyboardInterrupt
        return ref()

    def shutdown(self):
        import signal

        lock = self.run_dir.with_name(f".{self.run_dir.name}.lock")
        self.at_shutdown = (read_meta(self.run_dir)["status"], lock.exists())
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.running = False


class _Stop(KeyboardInterrupt):
    pass


def _stop(signum, frame):
    raise _Stop()


@pytest.mark.parametrize("fail_at", [0, 2], ids=["complete", "interrupted"])
def test_on_ray_a_cluster_started_for_the_run_stops_after_the_run_folder_is_settled(tmp_path, monkeypatch, fail_at):
    """A signal while Ray stops meets Ray's handling, not the command's: by then meta.json must say
    complete or interrupted and the lock be gone (they said running, the lock stayed), and the command's
    SIGTERM handler is back. The cluster's tasks stop with it: no forced cancel, which crashed Ray 2.60
    (a native abort, exit 1) on tasks that were just finishing."""
    import signal

    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'membudget[ray]')")
    import harness.runner

    suite = _suite(tmp_path)
    run_dir = tmp_path / "r" / suite.name / "x"
    cluster = _OwnCluster(ray, run_dir, fail_at)
    monkeypatch.setattr(harness.runner, "_import_ray", lambda: cluster)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        if fail_at:
            with pytest.raises(KeyboardInterrupt):
                run_suite(suite, tmp_path / "r", run_id="x", backend="ray", jobs=2, progress=False)
        else:
            run_suite(suite, tmp_path / "r", run_id="x", backend="ray", jobs=2, progress=False)
        assert signal.getsignal(signal.SIGTERM) is _stop
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert cluster.at_shutdown == ("interrupted" if fail_at else "complete", False)
    assert cluster.cancelled == [] and not cluster.running


def test_on_ray_sigterm_while_ray_starts_stops_the_run_as_the_command_says(tmp_path, monkeypatch):
    """Ray's start-up replaces SIGTERM's handler with one that exits (``SystemExit(15)``): the runner hands
    the signal to the handler it replaced (the command's, which says terminated and exits 143), and puts
    that handler back."""
    import signal

    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'membudget[ray]')")
    import harness.runner

    suite = _suite(tmp_path)
    run_dir = tmp_path / "r" / suite.name / "x"
    cluster = _OwnCluster(ray, run_dir)

    def init(**_):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        os.kill(os.getpid(), signal.SIGTERM)

    cluster.init = init
    monkeypatch.setattr(harness.runner, "_import_ray", lambda: cluster)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        with pytest.raises(_Stop):
            run_suite(suite, tmp_path / "r", run_id="x", backend="ray", jobs=2, progress=False)
        assert signal.getsignal(signal.SIGTERM) is _stop
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert read_meta(run_dir)["status"] == "interrupted"
    assert not run_dir.with_name(".x.lock").exists()


@pytest.mark.slow
def test_on_ray_a_worker_that_dies_costs_its_case_only(tmp_path):
    """The same killer planner on the ray backend without a time limit: Ray runs a unit whose worker
    died once more, then its cases are error rows saying so and every other case has its row. Before,
    Ray's WorkerCrashedError ended the run."""
    from harness.workers import WORKER_DIED

    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'membudget[ray]')")
    text = support.SUITE.format(name="crash").replace("[keep-all, prefix]", "[keep-all, killer]")
    suite = _suite(tmp_path, text.replace("[1, 2]", "[1]").replace("[0, 0.5, 1.0]", "[0.5, 1.0]"))
    outcome = _run_on_ray(suite, tmp_path / "r", MEMBUDGET_TEST_KILL_AT="1")
    rows = _rows(outcome.run_dir)
    assert sorted(r["case_id"] for r in rows) == sorted(c.case_id for c in suite.cases())
    killed = [r for r in rows if r["planner"] == "killer"]
    assert len(killed) == 4 and all((r["status"], r["message"]) == ("error", WORKER_DIED) for r in killed)
    assert all(r["status"] in ("ok", "infeasible") for r in rows if r["planner"] == "keep-all")
    assert read_meta(outcome.run_dir)["status"] == "complete"


def test_on_ray_a_plugins_keyboard_interrupt_is_an_error_row_naming_it(tmp_path):
    """QA: a planner's own KeyboardInterrupt in a Ray task came back as Ray's TaskCancelledError ("could not
    run as a Ray task"), as if the run had cancelled it; the row names the planner and its line, as on the
    local backend's workers."""
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'membudget[ray]')")
    suite = _suite(tmp_path, support.SUITE.format(name="base").replace("[keep-all, prefix]", "[prefix, sloppy]")
                   .replace("[1, 2]", "[1]").replace("[0, 0.5, 1.0]", "[1.0]"))
    outcome = _run_on_ray(suite, tmp_path / "r", MEMBUDGET_TEST_SLIP="ctrl-c")
    rows = _rows(outcome.run_dir)
    assert read_meta(outcome.run_dir)["status"] == "complete" and len(rows) == len(suite.cases())
    sloppy = [r for r in rows if r["planner"] == "sloppy"]
    raised = "planner 'sloppy' raised KeyboardInterrupt in a worker process, which Ctrl-C does not reach: pressed by the plugin"
    assert sloppy and all(r["status"] == "error" and re.fullmatch(
        re.escape(raised) + r" \(at tests\.test_suite_support:\d+ in plan\)", r["message"]) for r in sloppy), sloppy
    assert {r["status"] for r in rows if r["planner"] == "prefix"} == {"ok"}


@pytest.mark.slow
def test_on_ray_a_unit_whose_executor_needs_a_gpu_is_given_one(tmp_path, monkeypatch):
    """Ray hands a GPU only to a task that asks for one (it hides the others: ``CUDA_VISIBLE_DEVICES``), so a
    unit whose executor says ``needs_gpu`` is submitted asking for one; the cluster here declares one GPU."""
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'membudget[ray]')")
    monkeypatch.setenv("MEMBUDGET_TEST_RUN", "gpu")  # the driver reads needs_gpu
    suite = _suite(tmp_path, support.SUITE.format(name="gpu").replace("[simulate]", "[quirky]")
                   .replace("[1, 2]", "[1]").replace("[0, 0.5, 1.0]", "[1.0]"))
    ids = tmp_path / "gpu-ids"
    outcome = _run_on_ray(suite, tmp_path / "r", gpus=1, MEMBUDGET_TEST_RUN="gpu", MEMBUDGET_TEST_GPU_IDS=str(ids))
    rows = _rows(outcome.run_dir)
    assert rows and {r["status"] for r in rows} <= {"ok", "infeasible"}, rows
    given = [json.loads(line) for line in ids.read_text().splitlines()]
    assert given and all(len(g) == 1 for g in given), given


@pytest.mark.slow
def test_on_ray_a_case_that_cannot_be_sent_costs_its_case_only(tmp_path):
    """A planner that does not serialise (it holds a lock) on the ray backend: Ray refused it at
    submission, outside the loop that turns failures into rows, and the run ended there. Its cases are
    error rows now, and the others run."""
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'membudget[ray]')")
    suite = _suite(tmp_path, support.SUITE.format(name="pickle").replace("[keep-all, prefix]", "[prefix, unpicklable]")
                   .replace("[1, 2]", "[1]"))
    outcome = _run_on_ray(suite, tmp_path / "r")
    rows = _rows(outcome.run_dir)
    assert sorted(r["case_id"] for r in rows) == sorted(c.case_id for c in suite.cases())
    assert {(r["planner"], r["status"]) for r in rows} == {("prefix", "ok"), ("unpicklable", "error")}
    assert all(r["message"].startswith("could not run as a Ray task: ") and "lock" in r["message"]
               for r in rows if r["planner"] == "unpicklable")
    assert read_meta(outcome.run_dir)["status"] == "complete"


HANG_SUITE = support.SUITE.format(name="hang").replace("[keep-all, prefix]", "[keep-all, hang]").replace(
    "[0, 0.5, 1.0]", "[1.0]")


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_case_past_the_time_limit_costs_its_case_only(tmp_path, jobs):
    """A planner that never returns (``hang`` on chain8 at batch 1) under a 3 s case time limit, in this
    process's place (jobs=1) or beside another worker (jobs=2): its case is an error row that names the
    limit, every other case has its own row, the run is complete, and no worker is left behind. Without
    the limit the run never ends."""
    import multiprocessing

    suite = _suite(tmp_path, HANG_SUITE)
    _only_the_hanging_case_stopped(suite, run_suite(suite, tmp_path / "r", jobs=jobs, case_timeout=3, progress=False))
    assert not multiprocessing.active_children()


def _only_the_hanging_case_stopped(suite, outcome, limit=3):
    from harness.workers import timed_out

    rows = _rows(outcome.run_dir)
    assert sorted(r["case_id"] for r in rows) == sorted(c.case_id for c in suite.cases())
    stopped = [r for r in rows if r["status"] == "error"]
    assert [(r["planner"], r["model"], r["batch_size"]) for r in stopped] == [("hang", "synthetic:chain8", "1")]
    assert stopped[0]["message"] == timed_out(limit) and f"{limit} s" in stopped[0]["message"]
    assert float(stopped[0]["budget_lower_bound_s"]) > 0  # the column it is ranked beside, as every row has it
    assert all(r["status"] == "ok" for r in rows if r not in stopped)
    meta = read_meta(outcome.run_dir)
    assert meta["status"] == "complete" and meta["sessions"][-1]["case_timeout_s"] == limit


CHILD_SUITE = support.SUITE.format(name="child").replace("[keep-all, prefix]", "[sloppy]").replace(
    "[0, 0.5, 1.0]", "[1.0]").replace("  - model: synthetic:chain8\n    batch_sizes: [1, 2]\n", "")


def _still_running(pids, seconds):
    """The processes of ``pids`` still running after up to ``seconds`` (a zombie that no parent reaps has ended)."""
    import time

    def running(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + seconds
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if running(pid)]


def _end(pids):
    """Kill what a failed test left running (the test's own processes, by pid)."""
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_case_past_the_time_limit_takes_what_its_planner_started_with_it(tmp_path, monkeypatch):
    """QA: a planner's child (a solver; here ``sleep 600``) outlived the worker the time limit killed, holding the
    run's stdout (``membudget run | grep`` waited for it) and, on a GPU, its memory. The worker's process group
    goes."""
    monkeypatch.setenv("MEMBUDGET_TEST_SLIP", "child")
    monkeypatch.setenv("MEMBUDGET_TEST_CHILD", str(tmp_path / "pids"))
    outcome = run_suite(_suite(tmp_path, CHILD_SUITE), tmp_path / "r", case_timeout=3, progress=False)
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    try:
        assert [r["status"] for r in _rows(outcome.run_dir)] == ["error"]
        assert _still_running(pids, 5) == []
    finally:
        _end(pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_what_a_planner_left_running_ends_with_the_pool_of_a_run_that_completes(tmp_path, monkeypatch):
    """A planner that returns its schedule but leaves its child (a solver's server; here ``sleep 600``)
    running: the run completes, and the child goes with its worker's process group when the pool is
    shut down, rather than holding the run's stdout and, on a GPU, its memory after the run."""
    monkeypatch.setenv("MEMBUDGET_TEST_SLIP", "child-returns")
    monkeypatch.setenv("MEMBUDGET_TEST_CHILD", str(tmp_path / "pids"))
    outcome = run_suite(_suite(tmp_path, CHILD_SUITE), tmp_path / "r", jobs=2, progress=False)
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    try:
        rows = _rows(outcome.run_dir)
        assert rows and all(r["status"] in ("ok", "infeasible") for r in rows), rows
        assert read_meta(outcome.run_dir)["status"] == "complete"
        assert _still_running(pids, 5) == []
    finally:
        _end(pids)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_and_what_they_started_end_with_a_run_killed_without_a_word(tmp_path):
    """QA: after a kill -9 of ``membudget run --jobs 2``, its workers and a planner's child ran on (on a GPU
    machine, holding its memory). A worker whose parent is gone kills its process group."""
    import signal
    import time

    suite = support.write_suite(tmp_path, CHILD_SUITE)
    script = textwrap.dedent(f"""
        import sys
        from tests import test_suite_support as support
        support.install()
        from harness.cli import main
        sys.exit(main(["run", {str(suite)!r}, "-o", {str(tmp_path / 'r')!r}, "--jobs", "2", "--no-progress"]))
    """)
    env = {**os.environ, "MEMBUDGET_TEST_SLIP": "child", "MEMBUDGET_TEST_CHILD": str(tmp_path / "pids"),
           "PYTHONPATH": str(ROOT)}
    with open(tmp_path / "stderr", "w") as err:
        run = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=err)
    deadline = time.monotonic() + 240
    while not (tmp_path / "pids").exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert (tmp_path / "pids").exists(), (tmp_path / "stderr").read_text()
    time.sleep(0.2)  # the file is written before the planner sleeps
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    try:
        assert _still_running(pids, 10) == []
    finally:
        _end(pids)


@pytest.mark.slow
def test_the_ray_backend_stops_a_case_past_the_time_limit(tmp_path):
    """The same hanging case on the ray backend: each Ray task runs its unit in a worker process of
    its own, stopped by the same clock, so the case is an error row naming the limit and the run
    completes. Before, a time limit with --backend ray was refused (Ray's cancel loses a unit's rows)."""
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'membudget[ray]')")
    suite = _suite(tmp_path, HANG_SUITE)
    # 8 s, not the local pool's 3: each Ray task starts a worker process of its own, whose planning (its
    # kernels' compilation) took over 3 s on a loaded 2-core machine and stopped a case that does not hang
    outcome = _run_on_ray(suite, tmp_path / "r", case_timeout=8)
    _only_the_hanging_case_stopped(suite, outcome, limit=8)
    assert read_meta(outcome.run_dir)["sessions"][-1]["backend"] == "ray"


def test_a_worker_the_kill_cannot_end_is_given_up_after_its_grace(tmp_path, monkeypatch):
    """A worker stuck where SIGKILL does not end it at once (in the GPU driver) never breaks its pool: the
    wait polled forever. After KILL_GRACE_S the unit is given up, the pool replaced, and the run goes on.
    (Here the kill is signal 0, which ends nothing.)"""
    import multiprocessing

    import harness.workers
    from harness.workers import timed_out

    monkeypatch.setattr(harness.workers.signal, "SIGKILL", 0)
    monkeypatch.setattr(harness.workers, "KILL_GRACE_S", 1.0)
    suite = _suite(tmp_path, HANG_SUITE)
    outcome = run_suite(suite, tmp_path / "r", jobs=2, case_timeout=2, progress=False)
    rows = _rows(outcome.run_dir)
    assert sorted(r["case_id"] for r in rows) == sorted(c.case_id for c in suite.cases())
    assert [r["message"] for r in rows if r["status"] != "ok"] == [timed_out(2)]
    assert not multiprocessing.active_children()


def test_the_watch_keeps_nothing_of_a_collected_unit(monkeypatch):
    """Every unit's future (and with it its rows and timeline) was kept until the run ended."""
    import harness.workers
    from harness.workers import run_in_workers

    watches = []
    original = harness.workers._Watch.__init__

    def keep(self, *args, **kwargs):
        watches.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(harness.workers._Watch, "__init__", keep)
    assert sorted(run_in_workers(range(6), 2, abs, lambda task, message: message, limit=30)) == list(range(6))
    assert watches and all(not (w._tokens or w._started or w._stopped) for w in watches)


def test_a_case_that_cannot_be_sent_to_a_worker_is_an_error_row(tmp_path):
    """A plugin object that does not pickle ended the whole run under --jobs 2 (or any case time limit)."""
    suite = _suite(tmp_path, support.SUITE.format(name="pickle").replace("[keep-all, prefix]", "[prefix, unpicklable]")
                   .replace("[0, 0.5, 1.0]", "[1.0]"))
    rows = _rows(run_suite(suite, tmp_path / "r", jobs=2, progress=False).run_dir)
    assert len(rows) == len(suite.cases())
    assert {(r["planner"], r["status"]) for r in rows} == {("prefix", "ok"), ("unpicklable", "error")}
    assert all("could not run in a worker process" in r["message"] for r in rows if r["planner"] == "unpicklable")


def test_the_suite_sets_the_case_time_limit_and_resume_keeps_a_stopped_case(tmp_path):
    """``case_timeout_s`` in the suite is the limit when the caller gives none; a resumed run does not run
    a stopped case again (it would hang again: a GPU slice would spend itself on it), while a limit the
    caller gives replaces the suite's."""
    suite = _suite(tmp_path, HANG_SUITE + "case_timeout_s: 2.5\n")
    assert suite.spec.case_timeout_s == 2.5
    outcome = run_suite(suite, tmp_path / "r", run_id="a", progress=False)
    assert [r["message"] for r in _rows(outcome.run_dir) if r["status"] == "error"] == [
        __import__("harness.workers", fromlist=["timed_out"]).timed_out(2.5)]
    again = run_suite(suite, tmp_path / "r", run_id="a", resume=True, case_timeout=60, progress=False)
    assert again.ran == 0 and len(_rows(again.run_dir)) == len(suite.cases())
    assert read_meta(again.run_dir)["sessions"][-1]["case_timeout_s"] == 60


def test_resume_with_retry_runs_the_failed_cases_again_once_each(tmp_path, monkeypatch):
    """A case that failed (its planner raised; a time limit too short; a GPU run out of memory before a
    fix) kept its row on --resume, and retrying it meant editing rows.csv by hand."""
    from harness.errors import MembudgetError

    suite = _suite(tmp_path, support.SUITE.format(name="retry").replace("[keep-all, prefix]", "[keep-all, boom]"))
    first = run_suite(suite, tmp_path / "r", run_id="x", progress=False)
    statuses = {r["case_id"]: r["status"] for r in _rows(first.run_dir)}
    failed = {case for case, status in statuses.items() if status == "error"}
    assert failed and "infeasible" in statuses.values()
    with pytest.raises(MembudgetError, match="add --resume"):
        run_suite(suite, tmp_path / "r", run_id="y", retry=["error"], progress=False)
    with pytest.raises(MembudgetError, match="'ok': the statuses a case can be run again for are error, oom, "
                                             "infeasible"):
        run_suite(suite, tmp_path / "r", run_id="x", resume=True, retry=["ok"], progress=False)
    assert not (tmp_path / "r" / "retry" / "y").exists()

    monkeypatch.setattr(support.Boom, "plan", support.Prefix.plan)  # the planner is fixed
    again = run_suite(suite, tmp_path / "r", run_id="x", resume=True, retry=["error"], progress=False)
    rows = _rows(again.run_dir)
    assert again.ran == len(failed) and len(rows) == len(statuses) == len({r["case_id"] for r in rows})
    assert {r["case_id"] for r in rows if r["status"] == "error"} == set()
    assert {r["case_id"]: r["status"] for r in rows if r["case_id"] not in failed} == \
        {c: s for c, s in statuses.items() if c not in failed}  # the infeasible rows were not asked for
    assert f"{len(failed)} case(s) with status error run again (--retry)" in again.notes
    assert not any("by an interrupt" in note for note in again.notes)  # a retried error is no interrupt's
    assert read_meta(again.run_dir)["sessions"][-1]["retry"] == ["error"]


def test_retry_leaves_the_failed_rows_of_another_part_of_a_shared_run_alone(tmp_path):
    """The GPU suite's parts share one run folder: retrying one part must not delete another's rows,
    which this suite cannot run again."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    boom = _suite(tmp_path / "a", support.SUITE.format(name="shared").replace("[keep-all, prefix]", "[boom]"))
    run_suite(boom, tmp_path / "r", run_id="x", progress=False)
    other = _suite(tmp_path / "b", support.SUITE.format(name="shared").replace("[keep-all, prefix]", "[keep-all]"))
    outcome = run_suite(other, tmp_path / "r", run_id="x", resume=True, retry=["error", "infeasible"],
                        progress=False)
    rows = _rows(outcome.run_dir)
    assert len(rows) == len(boom.cases()) + len(other.cases())
    assert sum(r["status"] == "error" for r in rows) == sum(r["status"] == "error" for r in rows
                                                               if r["planner"] == "boom") > 0


@pytest.mark.parametrize("limit, backend, words", [
    (0, "local", "a number of seconds > 0"), (-1.5, "local", "a number of seconds > 0"),
    (float("inf"), "local", "a number of seconds > 0"), (True, "ray", "a number of seconds > 0"),
])
def test_a_case_time_limit_that_cannot_hold_is_refused_before_the_run(tmp_path, limit, backend, words):
    from harness.errors import MembudgetError

    with pytest.raises(MembudgetError, match=words):
        run_suite(_suite(tmp_path), tmp_path / "r", case_timeout=limit, backend=backend, progress=False)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("value", ["0", "-3", "inf", "nan", "soon"])
def test_the_suite_refuses_a_case_time_limit_that_is_not_positive_seconds(tmp_path, value):
    from harness.suite import SuiteError

    with pytest.raises(SuiteError, match="case_timeout_s"):
        _suite(tmp_path, support.SUITE.format(name="t") + f"case_timeout_s: {value}\n")


@pytest.mark.parametrize("run_id", ["../../escape", "a/b", "..", ".", "", "{tmp}/abs", ".hidden", "a\\b"])
def test_a_run_id_is_one_plain_folder_name(tmp_path, run_id):
    from harness.errors import MembudgetError

    run_id = run_id.format(tmp=tmp_path)
    suite = _suite(tmp_path)
    with pytest.raises(MembudgetError, match="--run-id"):
        run_suite(suite, tmp_path / "out" / "r", run_id=run_id, progress=False)
    assert not any(p.name in ("out", "escape", "abs") for p in tmp_path.iterdir())


def test_resume_and_overwrite_together_are_refused(tmp_path):
    from harness.errors import MembudgetError

    suite = _suite(tmp_path)
    run_suite(suite, tmp_path / "r", run_id="x", progress=False)
    with pytest.raises(MembudgetError, match="--resume or --overwrite"):
        run_suite(suite, tmp_path / "r", run_id="x", resume=True, overwrite=True, progress=False)
    assert len(_rows(tmp_path / "r" / "synth" / "x")) == len(suite.cases())


def test_resume_refuses_a_run_folder_whose_case_has_two_rows_and_changes_nothing(tmp_path):
    """A row copied by hand (two runs' rows.csv joined) was kept by --resume, and only publish or compare
    refused the folder later: resume refuses it first, naming the case and its rows."""
    from harness.errors import MembudgetError

    suite = _suite(tmp_path)
    run_dir = tmp_path / "r" / "synth" / "x"
    run_suite(suite, tmp_path / "r", run_id="x", progress=False)
    text = (run_dir / "rows.csv").read_text().splitlines(keepends=True)
    (run_dir / "rows.csv").write_text("".join([*text, text[2]]))  # the second row, again at the end
    before, meta = (run_dir / "rows.csv").read_text(), (run_dir / "meta.json").read_text()
    case = read_rows_csv(run_dir / "rows.csv")[1]["case_id"]
    with pytest.raises(MembudgetError) as exc:
        run_suite(suite, tmp_path / "r", run_id="x", resume=True, progress=False)
    assert str(exc.value) == (f"{run_dir / 'rows.csv'}: the case {case!r} has 2 rows (rows 2 and {len(text)} after the "
                              "header); a run has one row per case: delete all but one and resume again")
    assert (run_dir / "rows.csv").read_text() == before and (run_dir / "meta.json").read_text() == meta


def test_resume_drops_a_torn_row_in_the_middle_and_runs_its_case_again(tmp_path):
    """QA: a torn last line that a later write ended (a newline after it) was kept by --resume as a case of
    its own, empty but for a cut case id, and publish showed it. Resume drops it, says so, runs the case again;
    publish and compare, which read the same table, refuse it naming its line."""
    from harness.results import ResultsError, load_rows

    suite = _suite(tmp_path)
    run_dir = tmp_path / "r" / "synth" / "x"
    run_suite(suite, tmp_path / "r", run_id="x", progress=False)
    lines = (run_dir / "rows.csv").read_text().splitlines(keepends=True)
    torn_case = read_rows_csv(run_dir / "rows.csv")[2]["case_id"]
    (run_dir / "rows.csv").write_text("".join([*lines[:3], lines[3][:60] + "\n", *lines[4:]]))
    with pytest.raises(ResultsError, match=r"rows.csv:4: a row of \d+ cell\(s\), the header has \d+"):
        load_rows(run_dir)
    notes = []
    outcome = run_suite(suite, tmp_path / "r", run_id="x", resume=True, progress=False, on_note=notes.append)
    assert outcome.ran == 1 and notes == [f"1 torn row(s) of {run_dir / 'rows.csv'} (line 4: fewer or more cells "
                                          "than the header) dropped; their cases run again"]
    rows = read_rows_csv(run_dir / "rows.csv")
    ids = [r["case_id"] for r in rows]
    assert len(ids) == len(set(ids)) == len(suite.cases()) and torn_case in ids


def test_resume_drops_a_last_row_torn_inside_its_last_cell_says_so_and_runs_its_case_again(tmp_path):
    """QA: a kill inside the last cell of the last row (``weight_bytes`` 10000 cut to 10) leaves a record with
    every cell but no newline. The writer ends every record with one, so it is torn: resume drops it, says so
    as it does for a torn row in the middle, and runs its case again."""
    suite = _suite(tmp_path)
    run_dir = tmp_path / "r" / "synth" / "x"
    run_suite(suite, tmp_path / "r", run_id="x", progress=False)
    text = (run_dir / "rows.csv").read_text()
    last = read_rows_csv(run_dir / "rows.csv")[-1]
    assert len(last["weight_bytes"]) > 3  # the cut below stays inside the last cell
    (run_dir / "rows.csv").write_text(text[:-4])
    assert last["case_id"] not in {r["case_id"] for r in read_rows_csv(run_dir / "rows.csv")}
    notes = []
    outcome = run_suite(suite, tmp_path / "r", run_id="x", resume=True, progress=False, on_note=notes.append)
    assert outcome.ran == 1 and notes == [f"the last row of {run_dir / 'rows.csv'} was torn (a write cut short: no "
                                          "newline at its end) and dropped; its case runs again"]
    rows = read_rows_csv(run_dir / "rows.csv")
    assert sorted(r["case_id"] for r in rows) == sorted(c.case_id for c in suite.cases())
    assert {k: v for k, v in rows[-1].items() if k not in TIMING} == {k: v for k, v in last.items() if k not in TIMING}


@pytest.mark.parametrize("cut", ["after a line of the message", "within a line of the message"])
def test_a_last_record_cut_inside_a_message_of_several_lines_is_the_torn_tail(tmp_path, cut):
    """Review: an error message spans lines; a kill that cut the last record after one of them left a short
    record with an open quote, which the strict reading took for a torn row in the middle and refused."""
    from harness.results import drop_malformed_rows, format_row, header_line

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [format_row({"suite": "s", "case_id": f"c{k}", "status": "error", "message": f"Boom: line one,\nline {k}"})
            for k in range(3)]
    last = rows[2][: rows[2].index("line one,\n") + len("line one,\n")]
    if cut == "within a line of the message":
        last = last[:-3]
    (run_dir / "rows.csv").write_text(header_line() + rows[0] + rows[1] + last)
    assert [r["case_id"] for r in read_rows_csv(run_dir / "rows.csv")] == ["c0", "c1"]
    assert drop_malformed_rows(run_dir) == ([], True)  # no row in the middle is malformed; the tail goes
    assert (run_dir / "rows.csv").read_text() == header_line() + rows[0] + rows[1]


def test_a_message_of_any_length_is_cut_so_that_the_run_folder_reads(tmp_path, monkeypatch):
    """QA: a planner's message of 200000 characters, over csv's field limit (131072), made the run's own
    reading of rows.csv fail (meta.json stayed 'running'), and resume, publish and compare after it. A row keeps
    the message's head and tail (where it was raised) and says how many characters were cut."""
    from harness.results import MESSAGE_LIMIT, load_rows

    def loud(self, profile, budget_bytes, **options):
        raise ValueError("Z" * 200_000 + " the end")

    monkeypatch.setattr(support.Boom, "plan", loud)
    suite = _suite(tmp_path, support.SUITE.format(name="loud").replace("[keep-all, prefix]", "[prefix, boom]"))
    outcome = run_suite(suite, tmp_path / "r", progress=False)
    assert read_meta(outcome.run_dir)["status"] == "complete"
    loud_rows = [r for r in _rows(outcome.run_dir) if r["planner"] == "boom"]
    for message in (r["message"] for r in loud_rows):
        cut = len("ValueError: ") + 200_000 + len(" the end") + len(re.search(r" \(at [^)]*\)$", message)[0]) \
            - MESSAGE_LIMIT
        assert message.startswith("ValueError: ZZZ") and f" [... {cut} characters cut ...] " in message
        assert re.search(r"Z the end \(at tests\.test_runner:\d+ in loud\)$", message), message[-80:]
        assert len(message) == MESSAGE_LIMIT + len(f" [... {cut} characters cut ...] ")
    assert loud_rows and len(load_rows(outcome.run_dir)) == len(suite.cases())
    assert run_suite(suite, tmp_path / "r", resume=True, progress=False).ran == 0


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_executors_numpy_metrics_are_written_as_the_values_they_hold(tmp_path, monkeypatch, jobs):
    """QA: an executor whose Run.metrics held a numpy.int64 crashed the whole run ('Object of type int64 is not
    JSON serializable' writing its row), and every resume again. A NumPy value is written as the Python value it
    holds (a NumPy float was 'np.float64(0.25)'), an array as a list, an object JSON cannot write as its str."""
    monkeypatch.setenv("MEMBUDGET_TEST_RUN", "numpy")
    suite = _suite(tmp_path, support.SUITE.format(name="np").replace("[keep-all, prefix]", "[prefix]")
                   .replace("[simulate]", "[quirky]").replace("[1, 2]", "[1]"))
    outcome = run_suite(suite, tmp_path / "r", jobs=jobs, progress=False)
    rows = _rows(outcome.run_dir)
    assert read_meta(outcome.run_dir)["status"] == "complete" and len(rows) == len(suite.cases())
    for row in rows:
        assert (row["status"], row["stall_s"], row["iterations"]) == ("ok", "0.25", "3"), row["message"]
        metrics = json.loads(row["metrics"])
        assert metrics["stalls"] == 3 and metrics["per_stage"] == [0, 1, 2]
        assert metrics["handle"].startswith("<object object at ")


@pytest.mark.parametrize("slip, jobs, raised", [
    ("cancel", 1, "planner 'sloppy' raised CancelledError: its solver's task was cancelled"),
    ("cancel", 2, "planner 'sloppy' raised CancelledError: its solver's task was cancelled"),
    ("ctrl-c", 2, "planner 'sloppy' raised KeyboardInterrupt in a worker process, which Ctrl-C does not reach: "
                  "pressed by the plugin"),
])
def test_a_plugins_base_exception_is_an_error_row_naming_it(tmp_path, monkeypatch, slip, jobs, raised):
    """QA: a planner's asyncio.CancelledError (a BaseException, no Exception) ended the run with a traceback, and
    so did a KeyboardInterrupt a plugin raised in a pool worker, where Ctrl-C does nothing (the main process
    stops the run): each is an error row naming the planner and where it raised, a result resume keeps."""
    monkeypatch.setenv("MEMBUDGET_TEST_SLIP", slip)
    suite = _suite(tmp_path, support.SUITE.format(name="base").replace("[keep-all, prefix]", "[prefix, sloppy]")
                   .replace("[1, 2]", "[1]").replace("[0, 0.5, 1.0]", "[1.0]"))
    outcome = run_suite(suite, tmp_path / "r", jobs=jobs, progress=False)
    rows = _rows(outcome.run_dir)
    assert read_meta(outcome.run_dir)["status"] == "complete" and len(rows) == len(suite.cases())
    sloppy = [r for r in rows if r["planner"] == "sloppy"]
    assert sloppy and all(r["status"] == "error" for r in sloppy)
    assert all(re.fullmatch(re.escape(raised) + r" \(at tests\.test_suite_support:\d+ in plan\)", r["message"])
               for r in sloppy), sloppy[0]["message"]
    assert {r["status"] for r in rows if r["planner"] == "prefix"} == {"ok"}
    assert run_suite(suite, tmp_path / "r", resume=True, jobs=jobs, progress=False).ran == 0


def test_an_executors_base_exception_is_an_error_row_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMBUDGET_TEST_RUN", "cancel")
    suite = _suite(tmp_path, support.SUITE.format(name="base").replace("[keep-all, prefix]", "[prefix]")
                   .replace("[simulate]", "[quirky]").replace("[1, 2]", "[1]").replace("[0, 0.5, 1.0]", "[1.0]"))
    rows = _rows(run_suite(suite, tmp_path / "r", progress=False).run_dir)
    assert rows and all(r["status"] == "error" and re.fullmatch(
        r"executor 'quirky' raised CancelledError: its device's stream was cancelled \(at tests\.test_suite_support:"
        r"\d+ in run\)", r["message"]) for r in rows), rows[0]["message"]


@pytest.mark.parametrize("slip, words", [
    ("negative", "executor 'quirky' returned a makespan of -1.0 s, peak_bytes -100 (an ok run's time is a finite "
                 "number of seconds >= 0, a number of bytes is never below 0)"),
    ("nan", "executor 'quirky' returned a makespan of nan s (an ok run's time"),
    ("memory", "the host ran out of memory in executor 'quirky': MemoryError: no host memory for the trace (at "
               "tests.test_suite_support:"),
])
def test_an_executors_implausible_run_or_host_memory_error_is_an_error_row(tmp_path, monkeypatch, slip, words):
    """QA: an executor's run with a makespan of -1 s and a peak of -100 bytes was an ok, valid row, and publish
    showed negative times; a MemoryError it raised (the host's) was an oom row, the device's verdict, and never
    retried as an error. Each is an error row naming the executor, none of the run's figures kept."""
    monkeypatch.setenv("MEMBUDGET_TEST_RUN", slip)
    suite = _suite(tmp_path, support.SUITE.format(name="odd").replace("[keep-all, prefix]", "[prefix]")
                   .replace("[simulate]", "[quirky]").replace("[1, 2]", "[1]").replace("[0, 0.5, 1.0]", "[1.0]"))
    rows = _rows(run_suite(suite, tmp_path / "r", progress=False).run_dir)
    assert rows and all(r["status"] == "error" and r["message"].startswith(words) for r in rows), rows[0]["message"]
    assert all(r[c] == "" for r in rows for c in ("makespan_s", "peak_bytes", "valid", "throughput"))


def test_only_a_device_out_of_memory_is_an_oom():
    """A MemoryError is the host's (Python's own); a device's is torch's OutOfMemoryError, whatever raised it."""
    from harness.case import classify

    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError, without importing torch
        pass

    assert classify(OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")) == (
        "oom", "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
    assert classify(MemoryError("x"), "the allocator") == ("error", "the host ran out of memory in the allocator: "
                                                                    "MemoryError: x")


def _ctrl_c_from_the_unit(_task):
    raise KeyboardInterrupt("raised by the unit's code")


def test_a_unit_that_raises_keyboard_interrupt_in_its_worker_fails_alone():
    """What a worker's unit raises outside a case's guard (a KeyboardInterrupt included: Ctrl-C does not reach
    a worker) fails that unit; the pool took it for Ctrl-C and stopped the run."""
    from harness.workers import run_in_workers

    assert list(run_in_workers([0], 1, _ctrl_c_from_the_unit, lambda task, why: why)) == [
        "could not run in a worker process: KeyboardInterrupt: raised by the unit's code"]


@pytest.mark.slow
def test_ctrl_c_of_the_main_process_still_stops_a_run_in_workers(tmp_path):
    """SIGINT to the main process (what Ctrl-C sends it) stops a --jobs 2 run, its workers' planners hanging."""
    import signal
    import threading

    suite = _suite(tmp_path, support.SUITE.format(name="stop").replace("[keep-all, prefix]", "[hang]"))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal has it
    timer = threading.Timer(8.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_suite(suite, tmp_path / "r", run_id="x", jobs=2, progress=False)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert read_meta(tmp_path / "r" / "stop" / "x")["status"] == "interrupted"


def test_publish_refuses_a_row_whose_status_is_none_it_knows(tmp_path):
    """QA: a status edited to 'okay' was published, its rows in no column of the pages' counts."""
    from harness.results import ResultsError, load_rows

    run_dir = run_suite(_suite(tmp_path), tmp_path / "r", run_id="x", progress=False).run_dir
    text = (run_dir / "rows.csv").read_text()
    (run_dir / "rows.csv").write_text(text.replace(",ok,", ",okay,", 1))
    with pytest.raises(ResultsError, match="has the status 'okay', none of ok, infeasible, oom, error"):
        load_rows(run_dir)
    before = (run_dir / "rows.csv").read_text()
    with pytest.raises(ResultsError, match="'okay'"):  # review: resume said so only after running every case
        run_suite(_suite(tmp_path), tmp_path / "r", run_id="x", resume=True, progress=False)
    assert (run_dir / "rows.csv").read_text() == before


def test_an_executor_that_returns_a_status_of_its_own_makes_an_error_row(tmp_path):
    """Review: Run.status is a Literal nothing checked; a plugin executor's 'timeout' reached rows.csv and
    only the tables, at the end of the run, refused it."""
    from dataclasses import replace

    from harness.case import execute_plan, plan_case
    from harness.simulate.executor import Simulator
    from tests.test_suite_support import chain

    class Odd(Simulator):
        name = "odd"

        def run(self, schedule, profile, workload=None):
            return replace(super().run(schedule, profile, workload), status="timeout", message="took long")

    profile = chain("synthetic:chain4", 2)
    budget = peak_memory(profile)
    fields = execute_plan(plan_case(support.Prefix(), profile, budget), profile, budget, Odd(), None).fields
    assert fields["status"] == "error" and fields["message"] == (
        "executor 'odd' returned the status 'timeout', none of ok, infeasible, oom, error: took long")


@pytest.mark.parametrize("jobs", [0, -2])
def test_jobs_must_be_at_least_one(tmp_path, jobs):
    from harness.errors import MembudgetError

    with pytest.raises(MembudgetError, match="jobs"):
        run_suite(_suite(tmp_path), tmp_path / "r", jobs=jobs, progress=False)
    assert not (tmp_path / "r").exists()


def test_ray_backend_without_ray_fails_before_making_a_run_folder(tmp_path, monkeypatch):
    from harness.errors import MembudgetError

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MembudgetError, match=r"pip install 'membudget\[ray\]'"):
        run_suite(_suite(tmp_path), tmp_path / "r", backend="ray", progress=False)
    assert not (tmp_path / "r").exists()


def test_a_failure_before_the_first_case_does_not_leave_the_run_running(tmp_path, monkeypatch):
    import harness.runner

    def broken(*args, **kwargs):
        raise RuntimeError("cannot open the profile cache")

    monkeypatch.setattr(harness.runner, "ProfileCache", broken)
    with pytest.raises(RuntimeError):
        run_suite(_suite(tmp_path), tmp_path / "r", run_id="x", progress=False)
    meta = read_meta(tmp_path / "r" / "synth" / "x")
    assert meta["status"] == "interrupted" and meta["sessions"][-1]["status"] == "interrupted"


def test_an_interrupt_before_meta_json_names_no_run_folder_to_resume(tmp_path, monkeypatch):
    """Ctrl-C after the folder is made but before its meta.json is written: the interrupt carries no run folder
    (the command then says that nothing was written), since that folder holds nothing to resume."""
    import harness.runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(harness.runner, "write_meta", interrupted)
    with pytest.raises(KeyboardInterrupt) as caught:
        run_suite(_suite(tmp_path), tmp_path / "r", run_id="x", progress=False)
    assert (tmp_path / "r" / "synth" / "x").is_dir() and caught.value.run_dir is None


def test_two_runs_started_in_the_same_second_get_two_folders(tmp_path, monkeypatch):
    """Run ids are the second a run started: the second run of that second gets a folder of its own
    instead of appending to the first's."""
    import harness.runner

    monkeypatch.setattr(harness.runner, "new_run_id", lambda: "20240131-142501")
    suite = _suite(tmp_path)
    first = run_suite(suite, tmp_path / "r", progress=False)
    second = run_suite(suite, tmp_path / "r", progress=False)
    assert (first.run_dir.name, second.run_dir.name) == ("20240131-142501", "20240131-142501-1")
    assert second.ran == len(_rows(first.run_dir)) == len(_rows(second.run_dir)) == len(suite.cases())


def test_resuming_a_run_written_with_fewer_columns_keeps_every_row(tmp_path):
    """A run folder from an older version (the committed GPU run has none of the newer columns)
    resumed by this one: its rows are rewritten under today's header, none is lost, and the
    new rows read back."""
    import csv

    suite = _suite(tmp_path)
    outcome = run_suite(suite, tmp_path / "results", run_id="old", progress=False)
    rows = _rows(outcome.run_dir)
    old_columns = list(STABLE_COLUMNS) + ["run_id", "planner_label", "budget_label"]
    kept = rows[: len(rows) // 2]
    with open(outcome.run_dir / "rows.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=old_columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(kept)
    resumed = run_suite(suite, tmp_path / "results", run_id="old", resume=True, progress=False)
    assert resumed.ran == len(rows) - len(kept)
    again = _rows(outcome.run_dir)
    assert sorted(r["case_id"] for r in again) == sorted(r["case_id"] for r in rows)
    header = (outcome.run_dir / "rows.csv").read_text().splitlines()[0].split(",")
    assert tuple(header) == COLUMNS


def test_a_suite_passes_allocator_options_and_rows_say_what_the_allocator_proved(tmp_path):
    """``allocators: [{name: exact, time_limit: 5}]``: the option reaches ``place``, the case id and the
    allocator column carry it, and the row records the proved optimum and bound (issue #18)."""
    pytest.importorskip("ortools")
    text = support.SUITE.format(name="alloc").replace("[keep-all, prefix]", "[prefix]")
    text += "allocators: [{name: exact, time_limit: 5}, first-fit]\n"
    suite = _suite(tmp_path, text)
    assert {c.allocator for c in suite.cases()} == {"exact[time_limit=5]", "first-fit"}
    outcome = run_suite(suite, tmp_path / "results", progress=False)
    rows = [r for r in _rows(outcome.run_dir) if r["status"] == "ok"]
    exact = [r for r in rows if r["allocator"] == "exact[time_limit=5]"]
    assert exact and all(r["case_id"].endswith("/exact[time_limit=5]") for r in exact)
    for row in exact:  # tiny traces: CP-SAT proves its arena within the time limit
        assert row["placement_optimal"] == "true"
        assert int(row["max_live_bytes"]) <= int(row["placement_lower_bound_bytes"]) <= int(row["arena_bytes"])
    assert all(r["placement_lower_bound_bytes"] == "" for r in rows if r["allocator"] == "first-fit")


def test_an_allocator_option_it_does_not_take_is_a_suite_error(tmp_path):
    from harness.suite import SuiteError

    text = support.SUITE.format(name="alloc") + "allocators: [{name: first-fit, time_limit: 5}]\n"
    with pytest.raises(SuiteError, match=r"allocators\[0\]: allocator 'first-fit' has no option 'time_limit'"):
        _suite(tmp_path, text)


def _ctrl_c_in_a_worker(_task):
    """Send this worker SIGINT; then what a program it starts does with SIGINT."""
    import os
    import signal
    import subprocess
    import sys
    import time

    os.kill(os.getpid(), signal.SIGINT)  # raised KeyboardInterrupt here before
    time.sleep(0.1)
    child = subprocess.run([sys.executable, "-c", "import signal; "
                            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"],
                           capture_output=True, text=True, check=True)
    return ("survived", child.stdout.strip())


def test_a_worker_leaves_ctrl_c_to_the_main_process_and_what_it_starts_does_not():
    """Ctrl-C reaches the whole process group; a worker that took it died printing "Process
    SpawnProcess-2:" above the main process's one line (QA, 2 tries in 3 under --jobs 2). The main
    process stops the run and terminates the workers, so a worker lets it pass; a program it starts
    (the planned process) still stops on Ctrl-C, instead of outliving the run (SIG_IGN would be inherited)."""
    from harness.workers import run_in_workers

    assert list(run_in_workers([0], 1, _ctrl_c_in_a_worker, lambda task, why: why)) == [("survived", "True")]


def test_a_cuda_suite_on_a_machine_without_cuda_is_refused_before_a_run_folder_exists(tmp_path, monkeypatch):
    """QA (2026-11-28): every case became an error row (exit 1), the message repeated per case."""
    from harness import environment
    from harness.errors import MembudgetError

    suite = _suite(tmp_path, support.SUITE.format(name="synth").replace("device: synthetic", "device: cuda"))
    monkeypatch.setattr(environment, "cuda_device", lambda: None)
    with pytest.raises(MembudgetError, match=r"suite synth runs on a CUDA GPU \(device: cuda\) and this machine has "
                                             r"none that torch can use"):
        run_suite(suite, tmp_path / "r", run_id="x", progress=False)
    assert not (tmp_path / "r").exists()


def test_a_run_measured_on_one_gpu_resumes_only_on_the_same_gpu(tmp_path, monkeypatch):
    """GPU sessions are lent an H100 or an H200 by chance: a run folder carried from one to the other
    would mix two GPUs' profiles and rows. Refused before anything is written, with both names."""
    from harness import environment
    from harness.errors import MembudgetError

    suite = _suite(tmp_path, support.SUITE.format(name="synth").replace("device: synthetic", "device: cuda"))
    monkeypatch.setattr(environment, "cuda_device", lambda: "NVIDIA H100 80GB HBM3")
    run_suite(suite, tmp_path / "r", run_id="x", progress=False)
    run_dir = tmp_path / "r" / "synth" / "x"
    rows, sessions = _rows(run_dir), len(read_meta(run_dir)["sessions"])
    monkeypatch.setattr(environment, "cuda_device", lambda: "NVIDIA H200")
    with pytest.raises(MembudgetError, match=r"measured on the GPU 'NVIDIA H100 80GB HBM3', this machine's is "
                                             r"'NVIDIA H200': resume it on that GPU, or start another --run-id"):
        run_suite(suite, tmp_path / "r", run_id="x", resume=True, progress=False)
    assert _rows(run_dir) == rows and len(read_meta(run_dir)["sessions"]) == sessions
    monkeypatch.setattr(environment, "cuda_device", lambda: "NVIDIA H100 80GB HBM3")
    run_suite(suite, tmp_path / "r", run_id="x", resume=True, progress=False)
    assert len(read_meta(run_dir)["sessions"]) == sessions + 1
