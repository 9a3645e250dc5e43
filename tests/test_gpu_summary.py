"""benchmarks/gpu/summary.py, the summary a GPU slice prints and commits, run on a CPU suite so
that a GPU session never finds it broken: issue #16's checks and the throughput against keep-all."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from tests.test_suite_support import gpu_script, run_yaml

torch = pytest.importorskip("torch")

summary = gpu_script("summary", "gpu_summary")
TITLE = "builtin:tiny-cnn, batch 4, 3x16x16"  # the published pages' group title
TABLE = f"{TITLE}, torch executor"  # and the title of its measured table


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A CPU run of the torch executor beside the simulator, keep-all also at an unconstrained budget."""
    text = """
        name: summary-cpu
        profiler: analytic
        device: V100-PCIe
        models:
          - model: builtin:tiny-cnn
            batch_sizes: [4]
            input_size: [3, 16, 16]
        budgets: {fractions: [0.0, 0.5, 1.0], bytes: [1GiB]}
        planners: [keep-all, greedy, torch-checkpoint]
        executors: [torch, simulate]
        excludes: [{budget: 1GiB, planner: [greedy, torch-checkpoint]}]
    """
    with pytest.MonkeyPatch.context() as mp:  # the CPU path, also on a CUDA machine
        mp.setattr(torch.cuda, "is_available", lambda: False)
        return run_yaml(tmp_path_factory.mktemp("gpu-summary"), text)


def test_throughput_is_keep_all_measured_time_over_each_planners(run_dir):
    from harness.results import load_rows

    rows = load_rows(run_dir)
    tables = summary.throughput_against_keep_all(rows)
    assert list(tables) == [TABLE]
    basis, table = tables[TABLE]
    real = rows[(rows["executor"] == "torch") & (rows["status"] == "ok")]
    keep_all = float(real[real["planner"] == "keep-all"]["makespan_s"].min())
    assert basis.startswith("keep-all measured") and f"{keep_all * 1e3:.2f} ms" in basis
    assert table.loc["keep-all", "f0"].startswith("infeasible (needs ")  # what the planner said it needs
    for _, row in real.iterrows():  # every measured cell, from the rows themselves
        assert table.loc[row["planner_label"], row["budget_label"]] == f"{keep_all / row['makespan_s']:.2f}"
    assert table.loc["greedy", "1GiB"] == ""  # not run there (excluded)


def test_the_checks_hold_on_a_clean_cpu_run_and_the_files_are_written(run_dir, tmp_path):
    assert summary.main([str(run_dir), str(tmp_path)]) == 0
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["checks"]["oom_among_planned"] == 0 and data["checks"]["errors"] == 0
    assert data["passed"]["zero oom among planned cases"]
    assert data["checks"]["grad_error_max"] <= 1e-6  # every schedule trained the unmodified network
    text = (tmp_path / "summary.md").read_text()
    assert "throughput against keep-all (keep-all measured" in text and "| keep-all |" in text


def test_each_failed_check_is_reported(run_dir):
    from harness.results import load_rows

    rows = load_rows(run_dir)
    real = rows.index[(rows["executor"] == "torch") & (rows["status"] == "ok")]
    assert len(real) >= 4  # one to fail, and a median of the others that the largest does not move
    doctored = rows.copy()
    doctored.loc[real[0], "status"] = "oom"
    doctored.loc[real[1], "max_memory_reserved"] = int(doctored.loc[real[1], "budget_bytes"]) + 1
    doctored["prediction_error"] = doctored["prediction_error"].astype(float)
    doctored.loc[real[1:], "prediction_error"] = 0.05
    doctored.loc[real[-1], "prediction_error"] = -0.3
    found = summary.checks(doctored)
    assert found.oom_among_planned == 1 and found.over_budget == 1
    assert math.isclose(found.error_max, 0.3)
    assert math.isclose(found.error_median, 0.05)
    passed = found.passed
    assert not passed["zero oom among planned cases"] and not passed["reserved within the budget"]
    assert passed["median |prediction_error| <= 10%"] and not passed["largest |prediction_error| <= 25%"]
    text, _ = summary.report(doctored)
    assert "- FAIL: zero oom among planned cases" in text and "- PASS: median" in text


def test_a_row_that_took_an_earlier_run_is_that_run_counted_once(run_dir):
    """Under same_schedule: reuse a planner whose schedule ran already takes that row (no run_time_s):
    issue #16's checks count each run once, and the summary says how many rows took one."""
    from harness.results import load_rows

    rows = load_rows(run_dir)
    real = rows[(rows["executor"] == "torch") & (rows["status"] == "ok")]
    before = summary.checks(rows)
    taken = real.iloc[[0]].assign(planner="twin", planner_label="twin", case_id="twin", run_time_s=float("nan"),
                                  prediction_error=9.0)
    after = summary.checks(pd.concat([rows, taken], ignore_index=True))
    assert after.taken == 1 and after.status == before.status and after.error_max == before.error_max
    text, _ = summary.report(pd.concat([rows, taken], ignore_index=True))
    assert "(1 more took an earlier run of their schedule: same_schedule: reuse)" in text
    assert "took an earlier run" not in summary.report(rows)[0]


def test_without_keep_all_the_ideal_iteration_is_the_basis_and_says_so(run_dir):
    from harness.results import load_rows

    rows = load_rows(run_dir)
    rows = rows[rows["planner"] != "keep-all"]
    basis, table = summary.throughput_against_keep_all(rows)[TABLE]
    ideal = float(rows["ideal_s"].dropna().iloc[0])
    assert basis.startswith("no keep-all run: the simulated ideal iteration") and f"{ideal * 1e3:.2f} ms" in basis
    ok = rows[(rows["executor"] == "torch") & (rows["status"] == "ok")].iloc[0]
    assert table.loc[ok["planner_label"], ok["budget_label"]] == f"{ideal / ok['makespan_s']:.2f}"


def test_where_the_time_went_has_a_line_per_measured_row(run_dir):
    from harness.results import load_rows

    rows = load_rows(run_dir)
    gaps = summary.time_gaps(rows, run_dir)[TITLE]
    real = rows[(rows["executor"] == "torch") & (rows["status"] == "ok")]
    assert len(gaps) == len(real)  # the torch executor saved every timeline, the simulator its twin's
    for line, (_, row) in zip(gaps.to_dict(orient="records"), real.iterrows()):
        assert (line["planner"], line["budget"]) == (row["planner_label"], row["budget_label"])
        assert line["measured ms"] == f"{row['makespan_s'] * 1e3:.2f}"
        twin = rows[(rows["executor"] == "simulate") & (rows["planner_label"] == row["planner_label"])
                    & (rows["budget_label"] == row["budget_label"])]
        assert line["predicted ms"] == f"{float(twin['makespan_s'].iloc[0]) * 1e3:.2f}"
        assert line["compute F"].endswith("%") and line["idle"].endswith("%")
        # a row that moved data has its copies' median speed against the model, one that moved none no speed
        assert (float(line["copy speed"]) > 0) if row["moved_bytes"] > 0 else line["copy speed"] == ""
        # the row's own prediction (the executor's offload rule) against the twin's (the paper's)
        assert line["executor's rule"] == f"{float(row['predicted_s']) / float(twin['makespan_s'].iloc[0]) - 1:+.1%}"


def test_a_run_whose_profiling_failed_is_summarised(run_dir, tmp_path):
    """Profiling failed (e.g. a model that does not trace on the GPU's torch): every row is an error
    without bounds or times. The summary still comes, says the checks fail and why the table has no
    reference, instead of a traceback that loses the whole slice's summary."""
    from harness.results import load_rows

    rows = load_rows(run_dir)
    rows["status"], rows["message"], rows["timeline"] = "error", "profiling failed: RuntimeError: x", ""
    for column in ("ideal_s", "makespan_s", "prediction_error", "grad_error"):
        rows[column] = math.nan
    text, data = summary.report(rows, run_dir)
    assert "- FAIL: no errors" in text and "- FAIL: zero oom among planned cases" not in text
    basis, table = summary.throughput_against_keep_all(rows)[TABLE]
    assert basis == "no keep-all run and no profile: no reference"
    assert set(table.to_numpy().ravel()) <= {"error", ""}
    json.dumps(data, default=str)


def test_a_check_with_nothing_to_judge_does_not_hold(run_dir):
    from harness.results import load_rows

    rows = load_rows(run_dir)
    nothing = summary.checks(rows[rows["executor"] != "torch"]).passed
    assert not any(nothing.values())
    infeasible = rows[(rows["executor"] == "torch") & (rows["status"] == "infeasible")]
    assert len(infeasible)
    passed = summary.checks(infeasible).passed
    assert not passed["zero oom among planned cases"]  # nothing was planned: no oom proves nothing
    assert passed["no errors"]


def test_a_missing_timeline_costs_its_line_not_the_summary(run_dir, tmp_path):
    from harness.results import load_rows

    rows = load_rows(run_dir)
    real = rows.index[(rows["executor"] == "torch") & (rows["status"] == "ok")]
    rows.loc[real[0], "timeline"] = "timelines/not-there.json"
    gaps = summary.time_gaps(rows, run_dir)[TITLE]
    assert len(gaps) == len(real) - 1


def test_reserved_memory_holds_only_where_every_ok_row_reports_it(run_dir):
    """The CPU reports no max_memory_reserved: the check cannot pass on nothing. With every ok row
    reporting one within its budget it passes; with one row's missing it does not."""
    from harness.results import load_rows

    rows = load_rows(run_dir)
    assert not summary.checks(rows).passed["reserved within the budget"]
    ok = rows.index[(rows["executor"] == "torch") & (rows["status"] == "ok")]
    rows["max_memory_reserved"] = rows["max_memory_reserved"].astype(float)
    rows.loc[ok, "max_memory_reserved"] = rows.loc[ok, "budget_bytes"].astype(float)
    assert summary.checks(rows).passed["reserved within the budget"]
    rows.loc[ok[0], "max_memory_reserved"] = math.nan
    assert not summary.checks(rows).passed["reserved within the budget"]
