"""``membudget publish`` pages and plots, and ``compare`` of two runs."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import html.parser
import shutil
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from harness.publish import compare, fill_common_columns, fmt_bytes, publish
from harness.publish.cells import Cell, ExecutorTable, fastest, model_groups, slower_with_more_memory
from harness.results import ResultsError, find_runs, load_rows, read_rows_csv, to_frame
from harness.runner import run_suite
from harness.suite import load_suite
from tests import test_suite_support as support

PNG = b"\x89PNG\r\n\x1a\n"
XHTML = "{http://www.w3.org/1999/xhtml}"


@pytest.fixture(autouse=True)
def _plugin():
    """The test plugin, for the tests that run its suites again (tests/conftest.py removes it after each)."""
    support.install()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Two runs of a synthetic suite with allocators and a failing planner."""
    folder = tmp_path_factory.mktemp("publish")
    suite, (first, second) = support.runs_with_allocators(folder, "pub", "[caching, first-fit]", ("run-a", "run-b"))
    return folder, suite, first, second


def test_a_page_says_which_plugin_and_version_brought_each_strategy(tmp_path):
    """A third party's planner is compared with the bundled ones: the page names, for each planner,
    executor and allocator of its rows, the distribution and version that registered it (meta.json),
    an allocator under a label of its own and one with options included."""
    _, (run,) = support.runs_with_allocators(
        tmp_path, "lab", "[caching, {name: first-fit, label: mine}, {name: minisearch, time_limit: 1}]", ("x",))
    publish([run], tmp_path / "site")
    brought = {(e["kind"], e["name"]): f"{e['plugin']} {e['version']}"
               for e in json.loads((run / "meta.json").read_text())["environment"]["plugins"]}
    line = next(li for li in (tmp_path / "site" / "lab" / "index.md").read_text().splitlines()
                if li.startswith("Plugins (distribution and version): "))
    rows = read_rows_csv(run / "rows.csv")
    for kind in ("planner", "executor"):
        for name in {r[kind] for r in rows if r[kind]}:
            assert f"{name} ({brought[(kind, name)]})" in line, (name, line)
    assert {r["allocator"] for r in rows} == {"caching", "mine", "minisearch[time_limit=1]"}
    for shown, name in (("caching", "caching"), ("mine", "first-fit"), ("minisearch[time_limit=1]", "minisearch")):
        assert f"{shown} ({brought[('allocator', name)]})" in line, (shown, line)
    assert "prefix (" in line and "simulate (membudget " in line


def test_publish_writes_wellformed_pages_with_every_case_and_plots(results, tmp_path):
    folder, suite, _, run_b = results
    written = publish([folder / "results"], tmp_path / "site")
    page = tmp_path / "site" / "pub" / "index.html"
    assert page in written and (tmp_path / "site" / "index.html") in written
    published = read_rows_csv(tmp_path / "site" / "pub" / "pub.csv")
    original = read_rows_csv(run_b / "rows.csv")  # the latest run
    assert [(r["case_id"], r["status"]) for r in published] == [(r["case_id"], r["status"]) for r in original]
    for html_file in (page, tmp_path / "site" / "index.html"):
        root = ET.fromstring(html_file.read_text())  # well-formed XHTML or this raises
        assert root.tag == f"{XHTML}html"
    root = ET.fromstring(page.read_text())
    text = "".join(root.itertext())
    markdown = (tmp_path / "site" / "pub" / "index.md").read_text()
    for case in suite.cases():
        assert case.case_id in text and case.case_id in markdown
    images = [img.get("src") for img in root.iter(f"{XHTML}img")]
    kinds = {name.split("-", 1)[0] for name in images}
    assert kinds == {"ratio", "throughput", "time", "timeline"}
    assert len(images) == 3 * 4  # three model groups, four plots each
    for name in images:
        data = (page.parent / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
        assert f"]({name})" in markdown
    link = next(root.iter(f"{XHTML}a"), None)
    assert link is None or (page.parent / link.get("href")).exists()
    index = ET.fromstring((tmp_path / "site" / "index.html").read_text())
    hrefs = [a.get("href") for a in index.iter(f"{XHTML}a")]
    assert hrefs == ["pub/index.html"] and all((tmp_path / "site" / h).exists() for h in hrefs)


def _tables(page) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(the heading before it, header, body, the model group's heading) of every table of an XHTML page."""
    root = ET.fromstring(page.read_text())
    body = next(root.iter(f"{XHTML}body"))
    out, heading, group = [], "", ""
    for element in body:
        if element.tag in (f"{XHTML}h2", f"{XHTML}h3"):
            heading = element.text or ""
            if element.tag == f"{XHTML}h2":
                group = heading
        elif element.tag == f"{XHTML}table":
            header = [th.text or "" for th in element.iter(f"{XHTML}th")]
            rows = [[td.text or "" for td in tr.iter(f"{XHTML}td")] for tr in element.iter(f"{XHTML}tr")][1:]
            out.append((heading, header, rows, group))
    return out


def test_time_tables_rank_by_iteration_time_and_mark_the_fastest(results, tmp_path):
    """Every cell of a head-to-head table is the case's own iteration time; the common ratios follow."""
    folder, suite, _, run_b = results
    publish([run_b], tmp_path / "site")
    tables = _tables(tmp_path / "site" / "pub" / "index.html")
    times = [t for t in tables if "iteration time, ms" in t[0]]
    bounds = [t for t in tables if "the budget's lower bound" in t[0]]
    assert len(times) == len(bounds) == 3 and all("simulate executor (simulated)" in t[0] for t in times)
    rows = {r["case_id"]: r for r in read_rows_csv(run_b / "rows.csv") if r["allocator"] == "caching"}
    for (_, header, body, group), (_, lb_header, lb_body, _) in zip(times, bounds):
        assert [h.split(" ")[0] for h in header[1:]] == ["f0", "f0.5", "f1"]
        assert all("LB " in h and " ms" in h for h in lb_header[1:])
        assert [line[0] for line in body] == ["keep-all", "prefix", "boom"]
        name, batch, size = group.split(", ")
        model = f"{name}/b{batch.split()[1]}/{size}"
        for j, label in enumerate(["f0", "f0.5", "f1"], start=1):
            ran = {}
            for line, lb_line in zip(body, lb_body):
                row = rows[f"{model}/{line[0]}/{label}/simulate/caching"]
                cell = line[j]
                if row["status"] != "ok":  # with the bytes its planner said it needs (keep-all: the peak)
                    said = f" (needs {fmt_bytes(int(row['needed_bytes']))})" if row["needed_bytes"] else ""
                    assert bool(said) == (row["status"] == "infeasible"), row
                    assert cell == row["status"] + said and lb_line[j] == row["status"] + said
                    continue
                makespan = float(row["makespan_s"])
                ran[line[0]] = makespan
                assert f"{makespan * 1e3:.2f} ({makespan / float(row['ideal_s']):.2f}x)" in cell
                assert lb_line[j] == f"{makespan / float(row['budget_lower_bound_s']):.3f}"
            best = min(ran.values())
            marked = {line[0] for line in body if line[j].startswith("★")}
            assert marked == {p for p, t in ran.items() if t <= best * (1 + 1e-9)}


def test_a_strategy_that_trained_a_different_network_is_flagged_and_not_ranked(results, tmp_path):
    """A row whose gradients are 50% off the unmodified model's (grad_error) may be the fastest, yet it
    did not train the same network: its cell carries the flag instead of the star, which goes to the
    fastest strategy that did; the note under the table gives the largest error."""
    from harness.publish import GRAD_FLAG

    _, _, _, run_b = results
    run = tmp_path / "results" / "pub" / "wrong"
    shutil.copytree(run_b, run)
    frame = pd.read_csv(run / "rows.csv", keep_default_na=False)
    first = frame["case_id"].iloc[0].rsplit("/", 4)[0]  # model/batch/input size
    ok = frame[(frame["status"] == "ok") & frame["case_id"].str.startswith(first + "/")
               & (frame["budget_label"] == "f1") & (frame["allocator"] == "caching")]
    times = ok.set_index("planner_label")["makespan_s"].astype(float)
    assert len(times) >= 2
    wrong, honest = times.idxmin(), times.drop(times.idxmin()).idxmin()
    frame["grad_error"] = frame["grad_error"].astype(object)
    frame.loc[frame["status"] == "ok", "grad_error"] = 1e-7
    frame.loc[frame["planner_label"].eq(wrong) & frame["budget_label"].eq("f1")
              & frame["case_id"].str.startswith(first + "/"), "grad_error"] = 0.5
    frame.to_csv(run / "rows.csv", index=False)
    publish([run], tmp_path / "site")
    page = tmp_path / "site" / "pub" / "index.html"
    _, header, body, _ = next(t for t in _tables(page) if "iteration time, ms" in t[0])
    column = next(j for j, h in enumerate(header) if h.startswith("f1"))
    cells = {line[0]: line[column] for line in body}
    assert cells[wrong].endswith(GRAD_FLAG) and not cells[wrong].startswith("★")
    assert cells[honest].startswith("★")
    _, _, lines, _ = next(t for t in _tables(page) if "the fastest strategy per budget" in t[0])
    f1 = next(line for line in lines if line[0].startswith("f1"))
    names = [cell.split(" ")[0] for cell in f1]  # a name carries its marks: "prefix †"
    assert names[1] == honest and wrong not in names  # neither the winner nor the runner-up
    text = "".join(ET.fromstring(page.read_text()).itertext())
    assert "is 5.0e-01" in text and f"{GRAD_FLAG} 1 differ by more than 5%" in text


def test_placement_tables_compare_allocators_on_the_same_trace(results, tmp_path):
    """One line per schedule that ran: each allocator's arena for that trace, against its max-live,
    the smallest marked; no average over budgets whose sets differ between strategies."""
    folder, suite, _, run_b = results
    publish([run_b], tmp_path / "site")
    tables = [t for t in _tables(tmp_path / "site" / "pub" / "index.html") if t[0].startswith("Placement")]
    assert len(tables) == 3
    rows = read_rows_csv(run_b / "rows.csv")
    for _, header, body, group in tables:
        assert header == ["strategy", "budget", "max-live", "caching", "first-fit"]
        name, batch, size = group.split(", ")
        model = f"{name}/b{batch.split()[1]}/{size}"
        ran = {(r["planner_label"], r["budget_label"]) for r in rows
               if r["status"] == "ok" and r["case_id"].startswith(model + "/")}
        assert {(line[0], line[1]) for line in body} == ran
        for line in body:
            arena = {}
            for j, allocator in enumerate(["caching", "first-fit"], start=3):
                row = next(r for r in rows if r["case_id"] == f"{model}/{line[0]}/{line[1]}/simulate/{allocator}")
                arena[allocator] = float(row["arena_bytes"])
                assert f"({float(row['arena_bytes']) / float(row['max_live_bytes']):.3f})" in line[j]
            smallest = min(arena.values())
            marked = {a for j, a in enumerate(["caching", "first-fit"], start=3) if line[j].startswith("★")}
            assert marked == {a for a, v in arena.items() if v == smallest}


def _write_rows(folder, rows):
    """A run folder holding ``rows`` (dicts of strings, every row with the same keys) as its rows.csv."""
    folder.mkdir(parents=True)
    with open(folder / "rows.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return folder


def test_mixed_executors_get_a_table_and_plots_each(results, tmp_path):
    """Rows of two executors at one budget are two tables, each named, never one cell hiding the other."""
    folder, _, _, run_b = results
    src = tmp_path / "results" / "pub" / "mixed"
    rows = read_rows_csv(run_b / "rows.csv")
    measured = []
    for r in rows:
        m = dict(r, executor="torch", case_id=r["case_id"].replace("/simulate/", "/torch/"))
        if m["status"] == "ok":
            m["makespan_s"] = repr(float(r["makespan_s"]) * 2)
            m["time_iqr_s"] = repr(float(r["makespan_s"]) * 0.02)
        measured.append(m)
    _write_rows(src, rows + measured)
    publish([src], tmp_path / "site")
    page = tmp_path / "site" / "pub" / "index.html"
    tables = [t for t in _tables(page) if "iteration time, ms" in t[0]]
    assert [t[0].split(" executor")[0] for t in tables] == ["simulate", "torch"] * 3
    assert "torch executor (measured)" in tables[1][0] and "simulate executor (simulated)" in tables[0][0]
    ok_cell = next(c for line in tables[1][2] for c in line[1:] if "x)" in c)
    assert "±" in ok_cell  # the measured spread is shown
    assert not any("±" in c for line in tables[0][2] for c in line[1:])
    markdown = (page.parent / "index.md").read_text()
    assert markdown.splitlines()[2].startswith("Measured: the torch executor's rows were timed")
    images = [img.get("src") for img in ET.fromstring(page.read_text()).iter(f"{XHTML}img")]
    for kind in ("ratio", "throughput", "time"):
        assert {n.rsplit("-", 1)[1] for n in images if n.startswith(kind)} == {"simulate.png", "torch.png"}


def test_an_executor_that_finished_no_case_is_called_neither_measured_nor_simulated(results, tmp_path):
    """Every torch case failed (no GPU, a model it could not run): its tables were headed "simulated"
    and the page blamed old rows for its missing 'fastest strategy' table."""
    _, _, _, run_b = results
    rows = read_rows_csv(run_b / "rows.csv")
    failed = [dict(r, executor="torch", case_id=r["case_id"].replace("/simulate/", "/torch/"), status="error",
                   message="profiling failed: no CUDA GPU", makespan_s="", kept_bytes="", offloaded_bytes="",
                   recomputed_bytes="") for r in rows]
    publish([_write_rows(tmp_path / "results" / "pub" / "failed-torch", rows + failed)], tmp_path / "site")
    page = tmp_path / "site" / "pub" / "index.html"
    headings = [t[0] for t in _tables(page) if "iteration time, ms" in t[0]]
    kinds = ("simulate executor (simulated)", "torch executor (no case finished)")
    assert headings and all(h.startswith(kinds) for h in headings)
    markdown = (page.parent / "index.md").read_text()
    first = markdown.splitlines()[2]
    assert first.startswith("Simulations: every iteration time is the simulate executor's event simulation")
    assert first.endswith("The torch executor finished no case (its rows say why).")
    assert "written before the saved-data columns" not in markdown
    index = (tmp_path / "site" / "index.md").read_text()
    assert "pub (simulated, run failed-torch" in index
    publish([_write_rows(tmp_path / "results" / "pub" / "only-torch", failed)], tmp_path / "site2")
    lines = (tmp_path / "site2" / "pub" / "index.md").read_text().splitlines()
    assert lines[2] == ("Nothing finished: no case of this run has an iteration time. The torch executor finished "
                        "no case (its rows say why).")
    assert "pub (no case finished, run only-torch" in (tmp_path / "site2" / "index.md").read_text()


def test_a_run_resumed_at_other_code_says_which_rows_each_code_computed(tmp_path, monkeypatch):
    """The failed cases are run again after a fix, at another commit with another version of the test
    plugin: the page said the latest commit computed every row, and credited every row to the latest
    plugin versions."""
    import time

    import harness.environment
    from harness.results import read_meta

    text = support.SUITE.format(name="resumed").replace("[keep-all, prefix]", "[keep-all, prefix, boom]")
    suite = load_suite(support.write_suite(tmp_path, text))
    first = run_suite(suite, tmp_path / "results", run_id="x", progress=False)
    failed = sum(r["status"] == "error" for r in read_rows_csv(first.run_dir / "rows.csv"))
    assert failed and read_meta(first.run_dir)["sessions"][0]["git"] == read_meta(first.run_dir)["environment"]["git"]
    real = harness.environment.environment

    def moved_on():
        env = real()
        plugins = [dict(e, version="0.1") if e["plugin"] == "membudget-test-support" else e for e in env["plugins"]]
        return dict(env, git={"commit": "f" * 40, "dirty": False}, plugins=plugins)

    monkeypatch.setattr(harness.environment, "environment", moved_on)
    monkeypatch.setattr(support.Boom, "plan", support.Prefix.plan)  # the fix
    time.sleep(1.1)  # sessions and rows are stamped to the second
    again = run_suite(suite, tmp_path / "results", run_id="x", resume=True, retry=["error"], progress=False)
    total = len(read_rows_csv(again.run_dir / "rows.csv"))
    publish([again.run_dir], tmp_path / "site")
    line = next(li for li in (tmp_path / "site" / "resumed" / "index.md").read_text().splitlines()
                if li.startswith("Rows from sessions at different code: "))
    old = _commit_of(read_meta(first.run_dir)["sessions"][0]["git"])
    assert f"{total - failed} at commit {old} with membudget-test-support 0.0 (now 0.1) (started " in line
    assert f"; {failed} at commit ffffffffffff (started " in line
    assert line.endswith("The Plugins line names the latest session's versions.")
    page = (tmp_path / "site" / "resumed" / "index.md").read_text()
    assert "; the latest session computed at commit ffffffffffff;" in page
    single = run_suite(suite, tmp_path / "results", run_id="y", progress=False)  # one code throughout
    publish([single.run_dir], tmp_path / "same")
    assert "Rows from sessions" not in (tmp_path / "same" / "resumed" / "index.md").read_text()


def _commit_of(git):
    return git["commit"][:12] + (" plus uncommitted changes" if git.get("dirty") else "")


def test_simulated_pages_say_so_first_and_name_the_commit(results, tmp_path):
    folder, _, _, run_b = results
    publish([run_b], tmp_path / "site")
    lines = (tmp_path / "site" / "pub" / "index.md").read_text().splitlines()
    assert lines[2].startswith("Simulations: every row is the simulate executor's event simulation")
    assert "synthetic" in lines[2]  # the profiler
    assert "this page built from commit" in lines[4]


def test_git_state_ignores_what_runs_write_under_results(tmp_path):
    """``tox -e publish`` rewrites results/ while it runs: that is output, not uncommitted code."""
    import subprocess

    from harness.environment import git_state

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "x")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "rows.csv").write_text("a\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "-m", "y")
    (tmp_path / "results" / "rows.csv").write_text("b\n")
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_state(tmp_path)["dirty"] is True


def test_repeats_are_summarised_by_the_suites_statistic():
    """MLPerf's rule: with three or more repeats the fastest and the slowest are dropped."""
    from harness.publish import central

    assert central([5.0, 1.0, 2.0, 3.0, 100.0])[0] == pytest.approx(10 / 3)
    assert central([1.0, 3.0])[0] == pytest.approx(2.0)  # too few to trim
    assert central([5.0, 1.0, 2.0, 3.0, 100.0], "median")[0] == pytest.approx(3.0)
    assert central([1.0, 2.0, 6.0], "mean")[0] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="unknown statistic"):
        central([1.0], "max")


def test_a_repeated_suite_publishes_the_trimmed_mean_and_its_spread(tmp_path):
    support.install()
    text = support.SUITE.format(name="rep") + "repeats: 3\n"
    suite = load_suite(support.write_suite(tmp_path, text))
    run = run_suite(suite, tmp_path / "results", run_id="r", progress=False)
    rows = read_rows_csv(run.run_dir / "rows.csv")
    times = [1.0, 2.0, 9.0]
    target = [r for r in rows if r["planner"] == "prefix" and r["budget_label"] == "f0.5"
              and r["model"] == "synthetic:chain4"]
    assert len(target) == 3
    for r, t in zip(target, times):
        r["makespan_s"], r["time_iqr_s"] = repr(t), "0.0"  # as if measured
    with open(run.run_dir / "rows.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    publish([run.run_dir], tmp_path / "site")
    tables = [t for t in _tables(tmp_path / "site" / "rep" / "index.html") if "iteration time, ms" in t[0]]
    line = next(line for line in tables[0][2] if line[0] == "prefix")
    assert line[2].split(" (")[0].lstrip("★ ") == "2000.00 ±0.00"  # 1 and 9 dropped: 2 s, one kept


def test_time_chart_gives_each_strategy_one_colour():
    """A bare RGB tuple given to ``bar`` with three bars was read as three colours (issue #14)."""
    from harness.publish import ExecutorTable, Group, time_figure
    from harness.results import to_frame

    rows = []
    for k, planner in enumerate(["a", "b", "c", "d"]):
        for j, budget in enumerate(["f0", "f0.5", "f1"]):
            rows.append({"case_id": f"{planner}/{budget}", "model": "m", "batch_size": "1", "input_size": "1",
                         "planner_label": planner, "budget_label": budget, "budget_bytes": str(100 + j),
                         "executor": "simulate", "allocator": "", "status": "ok",
                         "makespan_s": repr(1.0 + k + j), "ideal_s": "1.0"})
    frame = to_frame(rows)
    fig = time_figure(ExecutorTable.of(Group("m", 1, "1", frame), "simulate"))
    bars = [p for p in fig.axes[0].patches]
    colours = [tuple(b.get_facecolor()) for b in bars]
    assert len(bars) == 12
    per_planner = [set(colours[3 * k: 3 * k + 3]) for k in range(4)]
    assert all(len(c) == 1 for c in per_planner)
    assert len(set().union(*per_planner)) == 4
    # a strategy that never ran keeps its own colour in the legend (not matplotlib's default blue)
    rows = [dict(r, status="infeasible", makespan_s="") if r["planner_label"] == "d" else r for r in rows]
    fig = time_figure(ExecutorTable.of(Group("m", 1, "1", to_frame(rows)), "simulate"))
    handles, labels = fig.axes[0].get_legend_handles_labels()
    legend = {label: tuple(h.patches[0].get_facecolor()) for h, label in zip(handles, labels) if label in "abcd"}
    assert len(set(legend.values())) == 4


def test_html_escapes_messages(results, tmp_path):
    folder, _, _, run_b = results
    src = tmp_path / "results" / "pub" / "escaped"  # outside the shared fixture's suite folder
    src.mkdir(parents=True)
    rows = read_rows_csv(run_b / "rows.csv")
    rows[0]["message"] = "<b>bad & worse</b>"
    with open(src / "rows.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    publish([src], tmp_path / "site")
    page = (tmp_path / "site" / "pub" / "index.html").read_text()
    ET.fromstring(page)
    assert "&lt;b&gt;bad &amp; worse&lt;/b&gt;" in page


def test_html_parses_with_the_html_parser_too(results, tmp_path):
    folder, *_ = results
    publish([folder / "results" / "pub" / "run-a"], tmp_path / "site")

    class Counter(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.open: list[str] = []

        def handle_starttag(self, tag, attrs):
            if tag not in ("meta", "img", "br"):
                self.open.append(tag)

        def handle_startendtag(self, tag, attrs):
            pass

        def handle_endtag(self, tag):
            assert self.open.pop() == tag

    parser = Counter()
    parser.feed((tmp_path / "site" / "pub" / "index.html").read_text())
    assert parser.open == []


def test_compare_finds_changes_and_missing_cases(results, tmp_path):
    _, suite, run_a, run_b = results
    same = compare(run_a, run_b)
    assert same["summary"]["common"] == len(suite.cases()) and same["summary"]["changed"] == 0
    assert same["only_in_a"] == same["only_in_b"] == []
    edited = tmp_path / "edited"
    edited.mkdir()
    rows = read_rows_csv(run_b / "rows.csv")
    target = next(r for r in rows if r["status"] == "ok" and r["planner"] == "prefix")
    target["makespan_s"] = repr(float(target["makespan_s"]) * 1.10)
    flipped = next(r for r in rows if r["planner"] == "keep-all" and r["status"] == "ok")
    flipped["status"] = "error"
    dropped = rows.pop()
    with open(edited / "rows.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    result = compare(run_a, edited)
    changed = {c["case_id"]: c for c in result["cases"] if c["changed"]}
    assert set(changed) == {target["case_id"], flipped["case_id"]}
    assert changed[target["case_id"]]["makespan_change"] == pytest.approx(0.10)
    assert result["summary"]["status_changed"] == 1
    assert result["only_in_a"] == [dropped["case_id"]] and result["only_in_b"] == []


def _edited_copy(run_dir, folder, edit):
    """A copy of ``run_dir``'s rows.csv in ``folder`` after ``edit(rows)`` (which may drop rows)."""
    folder.mkdir()
    rows = read_rows_csv(run_dir / "rows.csv")
    rows = edit(rows) or rows
    with open(folder / "rows.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return folder


def _scale(rows, planner, column, factor):
    target = next(r for r in rows if r["status"] == "ok" and r["planner"] == planner)
    value = float(target[column]) * factor
    target[column] = str(int(value)) if column.endswith("_bytes") else repr(value)
    return target["case_id"]


def test_compare_judges_makespan_peak_and_moved_changes_against_the_tolerance(results, tmp_path):
    _, _, run_a, run_b = results
    assert compare(run_a, run_b, tolerance=0.0)["beyond_tolerance"] == []
    changed = {}
    slower = _edited_copy(run_b, tmp_path / "slower", lambda rows: changed.update(
        makespan=_scale(rows, "prefix", "makespan_s", 1.10), moved=_scale(rows, "keep-all", "moved_bytes", 1.0)))
    result = compare(run_a, slower, tolerance=0.05)
    assert result["tolerance"] == 0.05 and result["beyond_tolerance"] == [changed["makespan"]]
    assert compare(run_a, slower, tolerance=0.2)["beyond_tolerance"] == []
    faster = _edited_copy(run_b, tmp_path / "faster", lambda rows: changed.update(
        peak=_scale(rows, "prefix", "peak_bytes", 0.8)))
    assert compare(run_a, faster, tolerance=0.1)["beyond_tolerance"] == [changed["peak"]]


def test_compare_counts_status_changes_and_missing_cases_whatever_the_tolerance(results, tmp_path):
    _, _, run_a, run_b = results
    dropped = []

    def edit(rows):
        next(r for r in rows if r["status"] == "ok")["status"] = "error"
        dropped.append(rows.pop()["case_id"])

    edited = _edited_copy(run_b, tmp_path / "edited", edit)
    flipped = [c["case_id"] for c in compare(run_a, edited)["cases"] if c["status_a"] != c["status_b"]]
    assert compare(run_a, edited, tolerance=10.0)["beyond_tolerance"] == flipped + dropped
    assert compare(edited, run_a, tolerance=10.0)["beyond_tolerance"] == flipped + dropped


def test_publish_refuses_rows_that_are_not_a_results_table(tmp_path):
    run = tmp_path / "other" / "run"
    run.mkdir(parents=True)
    (run / "rows.csv").write_text("name,score\nalice,3\n")
    with pytest.raises(ResultsError, match=r"not a membudget results table: no column\(s\) suite, case_id"):
        publish([run], tmp_path / "site")
    assert not (tmp_path / "site").exists()


def test_find_runs_resolves_roots_suites_and_runs(results, tmp_path):
    folder, _, run_a, run_b = results
    assert [r.path for r in find_runs([folder / "results"])] == [run_b]
    assert [r.path for r in find_runs([folder / "results" / "pub"])] == [run_b]
    assert [r.path for r in find_runs([run_a])] == [run_a]
    with pytest.raises(ResultsError, match="no results here"):
        find_runs([tmp_path])
    publish([run_a], tmp_path / "site")
    with pytest.raises(ResultsError, match="no results here"):  # a published folder is not a run
        find_runs([tmp_path / "site"])
    with pytest.raises(ResultsError, match="no such file"):
        find_runs([tmp_path / "nope"])


def test_the_latest_run_is_the_last_started_not_the_last_by_name(results, tmp_path):
    """``published`` sorts after timestamps by name; resume and publish must still take the newest run."""
    import shutil

    folder, _, run_a, run_b = results
    suite_dir = tmp_path / "pub"
    shutil.copytree(run_b, suite_dir / "zzz-old")
    shutil.copytree(run_a, suite_dir / "aaa-new")
    meta = json.loads((suite_dir / "aaa-new" / "meta.json").read_text())
    meta["sessions"][-1]["started"] = "2999-01-01T00:00:00+00:00"
    # its first session started before the other run's: a run counts by its last session (a resume)
    meta["sessions"].insert(0, {**meta["sessions"][-1], "started": "1999-01-01T00:00:00+00:00"})
    (suite_dir / "aaa-new" / "meta.json").write_text(json.dumps(meta))
    assert [r.path for r in find_runs([suite_dir])] == [suite_dir / "aaa-new"]


def test_strategies_with_equal_values_stay_visible_in_line_plots():
    """greedy and capacity often give the same times: each line keeps its own marker, the later smaller
    and drawn on top, so neither hides the other."""
    from harness.publish.figures import _styles

    styles = _styles(["greedy", "dynprog", "capacity"])
    markers = [s["marker"] for s in styles.values()]
    sizes = [s["markersize"] for s in styles.values()]
    layers = [s["zorder"] for s in styles.values()]
    assert len(set(markers)) == 3 and len({s["color"] for s in styles.values()}) == 3
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3
    assert layers == sorted(layers) and len(set(layers)) == 3


COMMON = ("budget_lower_bound_s", "ratio_to_budget_lb", "slowdown")


def _old_run(run_dir, folder, with_profiles=True):
    """A copy of ``run_dir`` as a run written before the common columns existed: its rows.csv has no
    such columns; its profiles are copied unless ``with_profiles`` is false."""
    rows = [{k: v for k, v in row.items() if k not in COMMON} for row in read_rows_csv(run_dir / "rows.csv")]
    _edited_copy(run_dir, folder, lambda _: rows)
    if with_profiles:
        shutil.copytree(run_dir / "profiles", folder / "profiles")
    return folder


def test_an_old_run_gets_the_common_columns_its_runner_would_have_written(results, tmp_path):
    """From the run's own profiles: every row's budget bound, and for the rows that ran the time over
    it and over the ideal iteration, as the runner writes them today; rows that did not run get no ratio."""
    _, _, _, run_b = results
    old = _old_run(run_b, tmp_path / "old")
    assert "slowdown" not in (old / "rows.csv").read_text().splitlines()[0]
    filled, today = fill_common_columns(load_rows(old), old), load_rows(run_b)
    assert today["budget_lower_bound_s"].notna().all() and today["makespan_s"].isna().any()
    for column in COMMON:
        pd.testing.assert_series_equal(filled[column], today[column], rtol=1e-12)


def test_an_old_run_without_its_profiles_gets_only_the_slowdown(results, tmp_path):
    """No profile, no bound: the bound and the ratio to it stay empty rather than guessed; the slowdown
    needs only the row's own makespan and ideal time."""
    _, _, _, run_b = results
    old = _old_run(run_b, tmp_path / "old", with_profiles=False)
    filled, today = fill_common_columns(load_rows(old), old), load_rows(run_b)
    assert filled["budget_lower_bound_s"].isna().all() and filled["ratio_to_budget_lb"].isna().all()
    pd.testing.assert_series_equal(filled["slowdown"], today["slowdown"], rtol=1e-12)


def test_rows_that_have_the_common_columns_keep_them(results, tmp_path):
    """Whatever a row already says is kept (here values no profile gives, so that a recomputation would
    show); only the rows that lack the columns are filled. A run whose rows all have them is unchanged."""
    _, _, _, run_b = results
    marked = {"budget_lower_bound_s": "1.0", "ratio_to_budget_lb": "2.0", "slowdown": "3.0"}

    def mark_keep_all(rows):
        for row in rows:
            row.update(marked if row["planner"] == "keep-all" else dict.fromkeys(COMMON, ""))

    mixed = _edited_copy(run_b, tmp_path / "mixed", mark_keep_all)
    shutil.copytree(run_b / "profiles", mixed / "profiles")
    filled, today = fill_common_columns(load_rows(mixed), mixed), load_rows(run_b)
    keep_all, others = filled["planner"] == "keep-all", filled["planner"] != "keep-all"
    assert keep_all.any() and others.any()
    for column, value in marked.items():
        assert (filled.loc[keep_all, column] == float(value)).all()
        pd.testing.assert_series_equal(filled.loc[others, column], today.loc[others, column], rtol=1e-12)

    full = _edited_copy(run_b, tmp_path / "full", lambda rows: [{**row, **marked} for row in rows])
    shutil.copytree(run_b / "profiles", full / "profiles")
    frame = load_rows(full)
    pd.testing.assert_frame_equal(fill_common_columns(frame, full), frame)


def _copy_with(run_dir, folder, edit):
    """A copy of the run folder (meta.json and profiles too) whose rows went through ``edit(frame)``."""
    shutil.copytree(run_dir, folder)
    frame = pd.read_csv(folder / "rows.csv", dtype=str, keep_default_na=False)
    frame = edit(frame)
    frame.to_csv(folder / "rows.csv", index=False)
    return folder


def _cells(page, table_title):
    _, header, body, _ = next(t for t in _tables(page) if table_title in t[0])
    return header, body


def test_a_schedule_that_splits_the_batch_is_marked_and_explained(results, tmp_path):
    """QA: the winners of moDNN's suite split the batch into 2-19 parts, unmarked; with batch norm that is
    not the same training, and the page said nothing (and vDNN++ looked slower with more memory)."""
    from harness.publish import SPLIT_MARK

    _, _, _, run_b = results

    def split(frame):
        frame.loc[frame["planner"] == "prefix", "sub_batches"] = "3"
        return frame

    run = _copy_with(run_b, tmp_path / "results" / "pub" / "split", split)
    publish([run], tmp_path / "site")
    page = tmp_path / "site" / "pub" / "index.html"
    header, body = _cells(page, "iteration time, ms")
    prefix = next(line for line in body if line[0] == "prefix")
    keep_all = next(line for line in body if line[0] == "keep-all")
    assert all(f"{SPLIT_MARK}3" in c for c in prefix[1:] if "x)" in c)
    assert not any(SPLIT_MARK in c for c in keep_all)
    text = "".join(ET.fromstring(page.read_text()).itertext())
    assert f"{SPLIT_MARK}N: the schedule splits the batch into N sub-batches" in text
    _, lines = _cells(page, "the fastest strategy per budget")
    assert any(line[1].startswith(f"prefix {SPLIT_MARK}3") for line in lines)
    publish([run_b], tmp_path / "plain")
    assert "splits the batch into N" not in (tmp_path / "plain" / "pub" / "index.md").read_text()


def test_a_winner_whose_arena_exceeds_the_budget_gets_the_fastest_that_fits_beside_it(results, tmp_path):
    """QA: every winner of the quick suite was † (its arena in the caching allocator model exceeds the
    budget), yet the 'fastest strategy per budget' table neither marked it nor said what fits."""
    from harness.publish import ARENA_FLAG

    _, _, _, run_b = results
    frame = pd.read_csv(run_b / "rows.csv", dtype=str, keep_default_na=False)
    first = frame["case_id"].iloc[0].rsplit("/", 4)[0]
    at = frame[(frame["status"] == "ok") & frame["case_id"].str.startswith(first + "/")
               & (frame["budget_label"] == "f1") & (frame["allocator"] == "caching")]
    times = at.set_index("planner_label")["makespan_s"].astype(float)
    winner, second = times.idxmin(), times.drop(times.idxmin()).idxmin()

    def over(frame):
        frame.loc[frame["allocator"] != "", "arena_fits_budget"] = "true"  # all fit, but the winner at f1
        target = frame["planner_label"].eq(winner) & frame["budget_label"].eq("f1") \
            & frame["case_id"].str.startswith(first + "/") & frame["allocator"].eq("caching")
        frame.loc[target, "arena_fits_budget"] = "false"
        return frame

    run = _copy_with(run_b, tmp_path / "results" / "pub" / "over", over)
    publish([run], tmp_path / "site")
    header, lines = _cells(tmp_path / "site" / "pub" / "index.html", "the fastest strategy per budget")
    assert header[-1] == f"fastest with its arena in the budget ({ARENA_FLAG} winners)"
    f1 = next(line for line in lines if line[0].startswith("f1"))
    assert times[second] == times[winner]  # at the peak both keep everything: a tie, both named
    assert f1[1] == f"{winner} {ARENA_FLAG}, {second} (tie)" and f1[-1] == f"{second} (1.000x the winner's time)"
    assert all(line[-1] == "-" for line in lines if not line[0].startswith("f1"))


def test_the_allocator_check_counts_the_placed_schedules_not_the_measured_runs(results, tmp_path):
    """QA (2026-12-01): a suite of simulate and torch rows with an allocator read "26 of the 52 schedules
    that ran need a larger arena", where the 26 torch runs were never placed (a measured run records no
    trace): the line counts the placed ones and says the measured runs are not in it."""
    from harness.publish import ARENA_FLAG

    _, _, _, run_b = results

    def measured_twins(frame):
        twins = frame.copy()
        twins["executor"] = "torch"
        twins["case_id"] = twins["case_id"].str.replace("/simulate", "/torch", regex=False)
        twins["arena_bytes"] = twins["arena_fits_budget"] = ""
        twins["time_iqr_s"] = "0.001"  # timed iterations: a measured run
        return pd.concat([frame, twins], ignore_index=True)

    run = _copy_with(run_b, tmp_path / "results" / "pub" / "both", measured_twins)
    publish([run], tmp_path / "site")
    text = (tmp_path / "site" / "pub" / "index.md").read_text()
    rows = [r for r in read_rows_csv(run_b / "rows.csv") if r["status"] == "ok"]
    ran = {(r["model"], r["batch_size"], r["planner_label"], r["budget_label"]) for r in rows}
    line = next(li for li in text.splitlines() if li.startswith("Allocator check"))
    assert f"of the {len(ran)} schedules that ran need a larger arena than their budget ({ARENA_FLAG})" in line
    assert line.endswith("The measured runs are not in it: an executor that runs the model records no memory "
                         "trace to place.")


def test_the_page_explains_the_budget_labels_it_has_and_says_when_no_allocator_checked_the_traces(results,
                                                                                                   tmp_path):
    """QA: every page said 'pN budgets are ...' with only fN budgets, and a suite without allocators showed
    no † at all, which read as 'fits'."""
    from harness.publish import ARENA_FLAG

    folder, _, _, run_b = results
    publish([run_b], tmp_path / "site")
    text = (tmp_path / "site" / "pub" / "index.md").read_text()
    assert "fN budgets are the fraction N" in text and "pN budgets" not in text
    assert "lists no allocator model" not in text
    # the page's allocator line counts the cases (a schedule at a budget) that ran, and those whose arena
    # exceeds the budget in some allocator model, from the rows
    rows = read_rows_csv(run_b / "rows.csv")
    ran = {(r["model"], r["batch_size"], r["planner_label"], r["budget_label"]): r for r in rows if r["status"] == "ok"}
    over = {k for k in ran if any(r["arena_fits_budget"] == "false" and (r["model"], r["batch_size"],
                                  r["planner_label"], r["budget_label"]) == k for r in rows)}
    columns = {(m, b, budget) for m, b, _, budget in ran}
    none_fit = {c for c in columns if all(k in over for k in ran if (k[0], k[1], k[3]) == c)}
    assert over and none_fit
    assert (f"Allocator check (caching, first-fit): {len(over)} of the {len(ran)} schedules that ran need a larger "
            f"arena than their budget ({ARENA_FLAG}), and at {len(none_fit)} of {len(columns)} budgets none fits") in text
    (tmp_path / "bare").mkdir()
    run = support.run_yaml(tmp_path / "bare", support.SUITE.format(name="bare").replace(
        "{fractions: [0, 0.5, 1.0]}", "{peak_fractions: [0.8, 1.0]}"))
    publish([run], tmp_path / "bare-site")
    text = (tmp_path / "bare-site" / "bare" / "index.md").read_text()
    assert "pN budgets are the fraction N of the keep-all peak" in text and "fN budgets" not in text
    assert f"The suite lists no allocator model, so no schedule's memory trace was placed: no {ARENA_FLAG}" in text


def test_publish_refuses_what_would_mislead_and_publishes_a_run_given_twice_once(results, tmp_path):
    """QA: rows of two suites in one rows.csv made a page titled after one, with the other's rows timed 'on'
    the wrong device; a header-only rows.csv made '0 cases: .'; the same run twice made two pages."""
    folder, _, run_a, run_b = results
    mixed = _copy_with(run_b, tmp_path / "mixed", lambda f: pd.concat(
        [f, f.head(2).assign(suite="other", case_id=lambda d: d["case_id"] + "/x")]))
    with pytest.raises(ResultsError, match=r"mixed: rows.csv holds rows of the suites other, pub, and meta.json is "
                                           r"suite pub's: a run folder holds one suite's rows"):
        publish([mixed], tmp_path / "site")
    for pair in ((run_a, mixed), (mixed, run_a)):  # compare refuses them as publish does
        with pytest.raises(ResultsError, match="mixed: rows.csv holds rows of the suites other, pub"):
            compare(*pair)
    empty = _copy_with(run_b, tmp_path / "empty", lambda f: f.head(0))
    with pytest.raises(ResultsError, match="empty: rows.csv has no rows yet: nothing to publish"):
        publish([empty], tmp_path / "site")
    with pytest.raises(ResultsError, match="empty: rows.csv has no rows yet"):
        compare(run_a, empty)
    assert not (tmp_path / "site").exists()
    publish([run_b, run_b.parent / run_b.name, run_b], tmp_path / "site")
    assert sorted(p.name for p in (tmp_path / "site").iterdir() if p.is_dir()) == ["pub"]
    index = (tmp_path / "site" / "index.md").read_text()
    assert index.count("](pub/index.md)") == 1 and "simulated, run run-b" in index


def test_plot_titles_stay_inside_the_figure():
    """QA: a long model name pushed the title past the figure's left edge ('rchvision:resnet18...')."""
    from harness.publish import ExecutorTable, Group, summarise, time_figure

    rows = pd.DataFrame({
        "model": "torchvision:a_model_with_a_rather_long_registered_name", "batch_size": 256,
        "input_size": "3x224x224", "executor": "simulate", "planner_label": ["keep-all", "prefix"],
        "budget_label": "f1", "budget_bytes": 2**30, "status": "ok", "makespan_s": [0.1, 0.12],
        "ideal_s": 0.1, "budget_lower_bound_s": 0.1, "grad_error": math.nan, "sub_batches": 1,
        "allocator": "", "arena_fits_budget": pd.array([pd.NA, pd.NA], dtype="boolean"), "time_iqr_s": math.nan,
    })
    group = Group(rows["model"].iloc[0], 256, "3x224x224", rows)
    table = ExecutorTable(group, "simulate", rows, summarise(rows))
    fig = time_figure(table)  # the other plots title themselves the same way (harness.publish.figures._wrap)
    fig.canvas.draw()
    title = fig.axes[0].title.get_window_extent()
    assert title.x0 >= 0 and title.x1 <= fig.bbox.x1, (title, fig.bbox)


def test_a_tie_names_every_tied_strategy_and_a_small_lead_shows_in_three_decimals(results, tmp_path):
    """QA (2026-11-25): a 0.37% lead and an exact tie both read 1.00x, and a tie named only the strategy
    listed first, so a page called greedy the fastest of three that took the same time."""
    _, _, _, run_b = results
    frame = pd.read_csv(run_b / "rows.csv", dtype=str, keep_default_na=False)
    first = frame["case_id"].iloc[0].rsplit("/", 4)[0]
    at_f1 = frame["case_id"].str.startswith(first + "/") & frame["budget_label"].eq("f1")
    times = frame[at_f1 & frame["status"].eq("ok")].groupby("planner_label")["makespan_s"].first().astype(float)
    assert set(times.index) == {"keep-all", "prefix"} and times["keep-all"] == times["prefix"]

    def slower(frame):
        rows = at_f1 & frame["planner_label"].eq("prefix")
        frame.loc[rows, "makespan_s"] = repr(float(times["prefix"]) * 1.004)
        return frame

    tied = tmp_path / "tied"
    publish([run_b], tied)
    _, lines = _cells(tied / "pub" / "index.html", "the fastest strategy per budget")
    f1 = next(line for line in lines if line[0].startswith("f1"))
    assert f1[1].endswith(" (tie)") and f1[4:6] == ["-", "-"]  # no runner-up outside the tie
    assert [name.split(" ")[0] for name in f1[1].removesuffix(" (tie)").split(", ")] == ["keep-all", "prefix"]
    run = _copy_with(run_b, tmp_path / "results" / "pub" / "lead", slower)
    publish([run], tmp_path / "site")
    _, lines = _cells(tmp_path / "site" / "pub" / "index.html", "the fastest strategy per budget")
    f1 = next(line for line in lines if line[0].startswith("f1"))
    assert f1[1].split(" ")[0] == "keep-all" and "(tie)" not in f1[1]
    # prefix ran keep-all's schedule at the peak: the lead is noise, and says so
    assert f1[4].split(" ")[0] == "prefix" and f1[5] == "1.004x (the same schedule: noise)"


def test_runners_up_a_rounding_error_apart_are_named_as_a_tie(results, tmp_path):
    """Two strategies behind the winner whose times differ only in the last bits (the same schedule summed
    in another order) are a tie for second place, as ``fastest`` has ties for first: both are named."""
    _, _, _, run_b = results
    frame = pd.read_csv(run_b / "rows.csv", dtype=str, keep_default_na=False)
    first = frame["case_id"].iloc[0].rsplit("/", 4)[0]
    at_f1 = frame["case_id"].str.startswith(first + "/") & frame["budget_label"].eq("f1")
    winner_s = float(frame.loc[at_f1 & frame["planner_label"].eq("keep-all"), "makespan_s"].iloc[0])

    def two_behind(frame):
        prefix = at_f1 & frame["planner_label"].eq("prefix")
        frame.loc[prefix, "makespan_s"] = repr(winner_s * 1.004)
        twin = frame[prefix].copy()
        twin["planner_label"] = "prefix-b"
        twin["case_id"] = twin["case_id"].str.replace("/prefix/", "/prefix-b/", regex=False)
        twin["makespan_s"] = repr(winner_s * 1.004 * (1 + 1e-12))
        return pd.concat([frame, twin], ignore_index=True)

    run = _copy_with(run_b, tmp_path / "results" / "pub" / "twins", two_behind)
    publish([run], tmp_path / "site")
    _, lines = _cells(tmp_path / "site" / "pub" / "index.html", "the fastest strategy per budget")
    f1 = next(line for line in lines if line[0].startswith("f1"))
    assert f1[1].split(" ")[0] == "keep-all" and "(tie)" not in f1[1]
    assert [name.split(" ")[0] for name in f1[4].removesuffix(" (tie)").split(", ")] == ["prefix", "prefix-b"]
    assert f1[4].endswith(" (tie)") and f1[5].startswith("1.004x")


def test_the_bound_table_divides_each_time_by_its_columns_lower_bound(results, tmp_path):
    """'iteration time / the budget's lower bound' shares one bound per column (the header's LB), so its
    cells rank within a column; where that bound is above the ideal iteration they are not the slowdown."""
    _, _, _, run_b = results
    frame = pd.read_csv(run_b / "rows.csv", dtype=str, keep_default_na=False)
    first = frame["case_id"].iloc[0].rsplit("/", 4)[0]
    at_f0 = frame["case_id"].str.startswith(first + "/") & frame["budget_label"].eq("f0")
    ran = at_f0 & frame["status"].eq("ok")
    time_s, ideal_s = (float(frame.loc[ran, column].iloc[0]) for column in ("makespan_s", "ideal_s"))
    bound_s = (time_s + ideal_s) / 2  # between the ideal and the time: the budget costs something

    def tighter(frame):
        frame.loc[at_f0, "budget_lower_bound_s"] = repr(bound_s)
        frame.loc[ran, "ratio_to_budget_lb"] = repr(time_s / bound_s)
        return frame

    run = _copy_with(run_b, tmp_path / "results" / "pub" / "bound", tighter)
    publish([run], tmp_path / "site")
    header, lines = next((h, b) for title, h, b, group in _tables(tmp_path / "site" / "pub" / "index.html")
                         if "the budget's lower bound" in title and first.split("/")[0] in group)
    assert header[1].startswith("f0") and f"LB {bound_s * 1e3:.2f} ms" in header[1]
    prefix = next(line for line in lines if line[0] == "prefix")
    assert prefix[1] == f"{time_s / bound_s:.3f}" != f"{time_s / ideal_s:.3f}"


def test_a_page_says_what_its_budgets_count(results, tmp_path):
    """QA (2026-11-25): a simulated page's budgets are the chain model's bytes, a real process needs more
    (the 13 oom rows of the first H100 run); only a footnote said so. The page says it under its counts."""
    _, _, _, run_b = results
    publish([run_b], tmp_path / "site")
    text = "".join(ET.fromstring((tmp_path / "site" / "pub" / "index.html").read_text()).itertext())
    assert "Budgets on this page are bytes of the chain model" in text and "not what a CUDA process reserves" in text


def test_a_run_that_did_not_validate_its_schedules_says_so_on_its_page(tmp_path, monkeypatch):
    """QA: with ``validate: false`` an invalid schedule published as ok and fastest, unmarked. The page says
    its schedules were not validated; a validated run's does not. (A schedule over its budget, ``sloppy``'s slip
    ``over``, is the planner's error when validated, an infeasible row when not.)"""
    from harness.publish import UNVALIDATED

    monkeypatch.setenv("MEMBUDGET_TEST_SLIP", "over")
    pages = {}
    for validate in ("true", "false"):
        (tmp_path / validate).mkdir()
        run = support.run_yaml(tmp_path / validate, support.SUITE.format(name="v").replace(
            "[keep-all, prefix]", "[keep-all, sloppy]") + f"validate: {validate}\n")
        publish([run], tmp_path / validate / "site")
        pages[validate] = (tmp_path / validate / "site" / "v" / "index.md").read_text()
        rows = load_rows(run)
        over = rows[(rows["planner"] == "sloppy") & (rows["budget_label"] == "f0.5")]
        assert set(over["status"]) == ({"error"} if validate == "true" else {"infeasible"})
    assert UNVALIDATED in pages["false"] and UNVALIDATED not in pages["true"]


def test_a_minimum_memory_that_leaner_algorithms_undercut_says_so():
    """QA: the vdnnpp-gtx970 page said VGG-16's minimum memory was 3.65 GiB while vdnn-all with memory-optimal
    algorithms ran in 3.57 GiB: the row's minimum is the default algorithms' (harness.bounds.min_memory)."""
    from dataclasses import replace

    from harness.bounds import min_memory
    from harness.model import Algorithm, Profile, Stage
    from harness.publish.page import leaner_minimum

    mib = 2**20
    wide = Stage("conv0", "conv", 1e-3, 2e-3, 100 * mib, 100 * mib, 100 * mib, fwd_workspace=900 * mib,
                 bwd_workspace=900 * mib, algorithms=(Algorithm("lean", 3e-3, 6e-3, 0, 0),))
    profile = Profile("m", 1, (3, 8, 8), "synthetic", 2**34, 1e10, 1e10, 0, 0, (wide,))
    default = min_memory(profile)
    assert min_memory(profile, memory_optimal=True) < default
    row = {"min_memory_bytes": default}
    assert leaner_minimum(profile, row).startswith(" at the default algorithms (") and "with the leanest" in \
        leaner_minimum(profile, row)
    plain = replace(profile, stages=(replace(wide, algorithms=()),))
    assert leaner_minimum(plain, {"min_memory_bytes": min_memory(plain)}) == ""
    assert leaner_minimum(None, row) == ""


def test_a_strategy_slower_with_more_memory_is_marked_and_its_step_named(results, tmp_path):
    """QA: HYBRID ran GPT-2 24% slower at 15% of the peak than at the minimum memory, and the page starred
    it without a word, though the smaller budget's plan fits the larger one."""
    from harness.publish.tables import MORE_MEMORY_MARK

    _, _, _, run_b = results

    def slower(frame):
        chain4 = frame["model"].str.endswith("chain4") & (frame["planner"] == "prefix")
        at = {label: frame.index[chain4 & (frame["budget_label"] == label)] for label in ("f0", "f0.5")}
        frame.loc[at["f0.5"], "makespan_s"] = str(3 * float(frame.loc[at["f0"], "makespan_s"].iloc[0]))
        return frame

    run = _copy_with(run_b, tmp_path / "results" / "pub" / "slower", slower)
    publish([run], tmp_path / "site")
    page = tmp_path / "site" / "pub" / "index.html"
    tables = [t for t in _tables(page) if "iteration time, ms" in t[0]]
    marked = [(title, line) for title, _, body, _ in tables for line in body if any(MORE_MEMORY_MARK in c for c in line)]
    assert len(marked) == 1 and marked[0][1][0] == "prefix"  # chain4 only: no other table changed
    assert MORE_MEMORY_MARK in marked[0][1][2] and MORE_MEMORY_MARK not in marked[0][1][1]
    text = "".join(ET.fromstring(page.read_text()).itertext())
    assert "the largest step, prefix at f0.5, is 3.00x its time at f0" in text
    publish([run_b], tmp_path / "plain")
    assert MORE_MEMORY_MARK not in (tmp_path / "plain" / "pub" / "index.md").read_text()


def test_a_measured_step_that_the_simulator_times_alike_is_not_marked(results, tmp_path):
    """QA (2026-12-01): measured on a CPU, greedy at f1 was marked slower with more memory than at a smaller
    budget, where the simulator timed the two plans alike: the gap was the machine's noise, not a plan the
    planner missed. A measured pair is marked only if the simulator's times beside them step too."""
    from harness.publish.tables import MORE_MEMORY_MARK

    _, _, _, run_b = results

    def slower(predicted_step):
        def edit(frame):
            chain4 = frame["model"].str.endswith("chain4") & (frame["planner"] == "prefix")
            at = {label: frame.index[chain4 & (frame["budget_label"] == label)] for label in ("f0", "f0.5")}
            fast = float(frame.loc[at["f0"], "makespan_s"].iloc[0])
            frame.loc[at["f0.5"], "makespan_s"] = str(3 * fast)
            frame.loc[at["f0"], "predicted_s"] = str(fast)
            frame.loc[at["f0.5"], "predicted_s"] = str(fast * predicted_step)
            return frame
        return edit

    for step, marked in ((1.0, False), (2.0, True)):
        run = _copy_with(run_b, tmp_path / "results" / "pub" / f"step{step}", slower(step))
        publish([run], tmp_path / f"site{step}")
        assert (MORE_MEMORY_MARK in (tmp_path / f"site{step}" / "pub" / "index.md").read_text()) == marked, step


def test_a_budget_where_strategies_ran_out_of_memory_names_them_under_its_star(results, tmp_path):
    """QA: the gpu-smoke page starred modnn at f0.25 while greedy, dynprog and four others, which the
    simulator ranks faster, had run out of memory there: the star then reads as a verdict on them. The note
    under the time table names the strategies that ran out at each budget, and says the star is the fastest
    of those that trained."""
    _, _, _, run_b = results

    def ran_out(frame):
        prefix_f05 = (frame["planner"] == "prefix") & (frame["budget_label"] == "f0.5")
        frame.loc[prefix_f05, ["status", "message", "makespan_s"]] = ["oom", "CUDA out of memory", ""]
        return frame

    run = _copy_with(run_b, tmp_path / "results" / "pub" / "oom", ran_out)
    publish([run], tmp_path / "site")
    page = (tmp_path / "site" / "pub" / "index.md").read_text()
    notes = [line for line in page.splitlines() if line.startswith("Ran out of memory (oom)")]
    # one note per model group's time table, each naming prefix at f0.5 only
    assert len(notes) == 3 and all("at f0.5, 1 (prefix)." in n and "f0," not in n for n in notes), notes
    publish([run_b], tmp_path / "plain")
    assert "Ran out of memory (oom)" not in (tmp_path / "plain" / "pub" / "index.md").read_text()


def test_a_profile_files_heading_names_the_model_in_it(tmp_path):
    """QA: a suite of profile files (``profiler: file``) published headings, plot titles and the claims
    table under the file's path alone (``results/profiles/resnet50-b32-h100-measured.json, batch 256``),
    never the model it profiles; the heading names both."""
    from harness.model import save

    profile = support.chain("synthetic:chain8", 2)
    save(profile, tmp_path / "measured-b2.json")
    run = support.run_yaml(tmp_path, f"""\
        name: files
        profiler: file
        device: synthetic
        models:
          - model: {tmp_path / 'measured-b2.json'}
            batch_sizes: [2]
        budgets: {{fractions: [0.5]}}
        planners: [keep-all, prefix]
        executors: [simulate]
        """)
    publish([run], tmp_path / "site")
    headings = [line for line in (tmp_path / "site" / "files" / "index.md").read_text().splitlines()
                if line.startswith("## ") and "batch" in line]
    assert headings == [f"## synthetic:chain8 (profile {tmp_path / 'measured-b2.json'}), batch 2, 3x32x32"], headings


def test_a_lead_within_the_timings_spreads_is_said_not_to_tell_the_two_apart(results, tmp_path):
    """QA: a CPU torch page starred seg-recompute at 35.94 ±56.12 ms over keep-all at 147.36 ±115.95 ms, the
    same schedule: a lead smaller than the spreads is noise. The note under the time table and the lead of the
    strategy table say so; a lead beyond the spreads is not flagged."""
    _, _, _, run_b = results

    def timed(spread):
        def edit(frame):
            at_peak = (frame["budget_label"] == "f1") & frame["planner"].isin(["keep-all", "prefix"])
            for model in frame.loc[at_peak, "model"].unique():
                rows = at_peak & (frame["model"] == model)
                base = float(frame.loc[rows & (frame["planner"] == "keep-all"), "makespan_s"].iloc[0])
                frame.loc[rows & (frame["planner"] == "prefix"), "makespan_s"] = repr(base * 1.05)
                frame.loc[rows, "time_iqr_s"] = repr(base * spread)
            frame["schedule_fingerprint"] = ""  # two schedules, as far as the page knows (see the next test)
            return frame
        return edit

    pages = {}
    for spread in (0.2, 0.01):
        run = _copy_with(run_b, tmp_path / "results" / str(spread) / "pub" / "timed", timed(spread))
        publish([run], tmp_path / str(spread))
        pages[spread] = (tmp_path / str(spread) / "pub" / "index.md").read_text()
    notes = [line for line in pages[0.2].splitlines() if line.startswith("Within the spreads: at f1, keep-all ")]
    assert notes and all(" against prefix " in n for n in notes), notes
    assert "1.050x (within the spreads)" in pages[0.2]
    assert "Within the spreads" not in pages[0.01] and "(within the spreads)" not in pages[0.01]
    assert "1.050x" in pages[0.01]


def test_strategies_that_ran_one_schedule_and_were_timed_apart_are_said_to_differ_by_noise(results, tmp_path):
    """QA: on a CPU page, keep-all, dynprog, recompute and hybrid all ran keep-all's schedule at the peak,
    yet hybrid was starred 3.3x ahead of dynprog. Rows carry the schedule's fingerprint; where strategies
    of one fingerprint were timed apart, a note says it is noise and the strategy table's lead says so."""
    _, _, _, run_b = results
    rows = read_rows_csv(run_b / "rows.csv")

    def prints(label):
        return {(r["model"], r["batch_size"], r["planner"]): r["schedule_fingerprint"] for r in rows
                if r["budget_label"] == label}

    at_peak, lower = prints("f1"), prints("f0.5")
    assert all(len(v) == 12 for v in at_peak.values() if v)
    same = [(m, b) for (m, b, p), v in at_peak.items() if p == "prefix" and v == at_peak[m, b, "keep-all"]]
    assert len(same) == 3, at_peak  # the prefix planner offloads nothing at the peak: keep-all's schedule
    assert all(lower[m, b, "prefix"] != lower[m, b, "keep-all"] for m, b in same if lower[m, b, "keep-all"])

    def slower_prefix(frame):
        chosen = (frame["budget_label"] == "f1") & (frame["planner"] == "prefix")
        frame.loc[chosen, "makespan_s"] = (frame.loc[chosen, "makespan_s"].astype(float) * 3).map(repr)
        return frame

    run = _copy_with(run_b, tmp_path / "results" / "pub" / "noisy", slower_prefix)
    publish([run], tmp_path / "site")
    page = (tmp_path / "site" / "pub" / "index.md").read_text()
    notes = [line for line in page.splitlines() if line.startswith("One schedule, timed apart: at f1, keep-all and "
                                                                   "prefix (")]
    assert len(notes) == len(same), notes
    # keep-all wins, prefix (3x slower) is the runner-up: the lead says what it is
    leads = [line for line in page.splitlines() if line.startswith("| f1 (")]
    assert len(leads) == len(same) and all("| prefix † | 3.000x (the same schedule: noise) |" in line
                                           for line in leads), leads
    untouched = tmp_path / "site-b"
    publish([run_b], untouched)  # the same schedules timed alike (simulated): no note
    assert "One schedule, timed apart" not in (untouched / "pub" / "index.md").read_text()


def test_a_budget_below_the_weights_shows_no_bound_that_reads_as_reachable(tmp_path, capsys):
    """QA: a budget below the weights alone (mlp6: 352 MiB against 671 MiB of weights) was headed
    "LB 60.46 ms", as if some schedule could come near it; none runs there. The headers say so, and
    the every-case list and ``membudget run``'s table show no bound; the others keep theirs."""
    from harness.cli import main

    weights = support.chain("synthetic:chain4", 2).weight_bytes
    text = support.SUITE.format(name="tiny").replace("budgets: {fractions: [0, 0.5, 1.0]}",
                                                     f"budgets: {{fractions: [0.5], bytes: [{weights // 2}]}}")
    suite = support.write_suite(tmp_path, text)
    assert main(["run", str(suite), "-o", str(tmp_path / "r"), "--run-id", "x"]) == 0
    printed = capsys.readouterr().out.splitlines()
    below = [line.split() for line in printed if f" {weights // 2} " in f" {line} "]
    assert below and all(cells[cells.index("infeasible") + 3] == "-" for cells in below), printed
    fraction = [line for line in printed if "f0.5 (" in line]  # a fraction's label gets its bytes
    assert fraction and all(re.search(r"f0\.5 \([0-9.]+ (KiB|MiB|B)\)", line) for line in fraction), printed
    publish([tmp_path / "r" / "tiny" / "x"], tmp_path / "site")
    page = (tmp_path / "site" / "tiny" / "index.md").read_text()
    headers = [line for line in page.splitlines() if line.startswith("| planner |")]
    assert headers and all(f"{weights // 2} (" in h and "below the weights: no schedule runs" in h for h in headers)
    assert all("f0.5 (" in h and "below the weights" not in h.split("f0.5")[1] for h in headers)
    assert any("LB " in h.split("f0.5")[1] for h in headers)  # the bound table's header keeps f0.5's bound
    listed = [line.split(" | ") for line in page.splitlines() if f"/{weights // 2}/simulate" in line]
    assert listed and all(cells[4] == "-" for cells in listed), listed


def test_runners_up_that_tie_are_all_named(tmp_path):
    """QA: at a budget where dynprog, capacity and modnn tied behind the winner, the strategy table named
    greedy alone as the runner-up."""
    run = support.run_yaml(tmp_path, support.SUITE.format(name="ties").replace(
        "[keep-all, prefix]", "[keep-all, prefix, {name: prefix, label: prefix-again}]"))

    def faster_keep_all(frame):
        chosen = frame["budget_label"].eq("f1") & frame["planner_label"].eq("keep-all")
        frame.loc[chosen, "makespan_s"] = (frame.loc[chosen, "makespan_s"].astype(float) * 0.5).map(repr)
        return frame

    edited = _copy_with(run, tmp_path / "results" / "ties" / "edited", faster_keep_all)
    publish([edited], tmp_path / "site")
    _, lines = _cells(tmp_path / "site" / "ties" / "index.html", "the fastest strategy per budget")
    at_peak = [line for line in lines if line[0].startswith("f1")]
    assert at_peak and all(line[1].split(" ")[0] == "keep-all" for line in at_peak)
    assert all([n.split(" ")[0] for n in line[4].removesuffix(" (tie)").split(", ")] == ["prefix", "prefix-again"]
               and line[4].endswith(" (tie)") and line[5].startswith("2.000x") for line in at_peak), at_peak


def _one_budget_table(times: dict[str, float]) -> ExecutorTable:
    """One budget, one simulated row per planner."""
    rows = [dict(suite="s", case_id=f"m/{p}/b", model="m", batch_size=8, input_size="1", device="d",
                 profiler="analytic", planner=p, planner_label=p, executor="simulate", allocator="",
                 budget_label="b", budget_bytes=100, status="ok", makespan_s=t, ideal_s=1.0,
                 peak_memory_bytes=110, weight_bytes=10, time_iqr_s=None) for p, t in times.items()]
    return ExecutorTable.of(model_groups(to_frame(rows))[0], "simulate")


def test_times_within_the_tie_tolerance_are_all_named_fastest():
    """Two strategies whose times differ only in the last bits (not exactly equal) are a tie."""
    cells = {("a", "b"): Cell("ok", 1.0), ("c", "b"): Cell("ok", 1.0 * (1 + 1e-12)), ("d", "b"): Cell("ok", 1.1)}
    assert fastest(cells, "b") == {"a", "c"}


def test_the_fastest_is_ranked_by_iteration_time_not_by_slowdown():
    """The column's common quantity decides: a faster strategy whose row carries another ideal time (a larger
    slowdown) is still the fastest."""
    cells = {("a", "b"): Cell("ok", 1.0, slowdown=2.0), ("c", "b"): Cell("ok", 1.5, slowdown=1.5)}
    assert fastest(cells, "b") == {"a"}


def test_a_gradient_error_at_the_tolerance_is_the_same_training():
    """Only an error *above* GRAD_TOLERANCE disqualifies a strategy from being named the fastest."""
    from harness.publish.cells import GRAD_TOLERANCE

    cells = {("a", "b"): Cell("ok", 1.0, grad_error=GRAD_TOLERANCE), ("c", "b"): Cell("ok", 2.0)}
    assert fastest(cells, "b") == {"a"}
    worse = {**cells, ("a", "b"): Cell("ok", 1.0, grad_error=GRAD_TOLERANCE * 1.01)}
    assert fastest(worse, "b") == {"c"}


def test_more_memory_names_the_fastest_smaller_budget_and_keeps_comparing_with_it():
    """1.0 at b1, 3.0 at b2, 2.0 at b3: both b2 and b3 ran slower than at b1, and b1 is named for both."""
    cells = {("p", "b1"): Cell("ok", 1.0), ("p", "b2"): Cell("ok", 3.0), ("p", "b3"): Cell("ok", 2.0)}
    assert slower_with_more_memory(cells, ["b1", "b2", "b3"]) == {("p", "b2"): "b1", ("p", "b3"): "b1"}


def test_a_runner_up_exactly_at_the_edge_of_the_spreads_is_a_close_call():
    """Runner-up minus its spread equal to the winner plus its spread: the timings do not tell them apart."""
    table = _one_budget_table({"a": 1.0, "c": 2.0})
    cells = {k: dataclasses.replace(c, spread_s=0.5) for k, c in table.cells.items()}
    table = dataclasses.replace(table, cells=cells)
    assert table.close_calls == {"b": ("a", "c")}


def test_one_schedule_timed_within_the_tie_tolerance_is_not_called_noise():
    """Two strategies that ran one schedule with times a tie apart are a tie, not a noise note."""
    table = _one_budget_table({"a": 1.0, "c": 1.0 * (1 + 1e-12)})
    cells = {k: dataclasses.replace(c, schedule="same") for k, c in table.cells.items()}
    assert dataclasses.replace(table, cells=cells).same_schedules == {}
    apart = _one_budget_table({"a": 1.0, "c": 1.001})
    cells = {k: dataclasses.replace(c, schedule="same") for k, c in apart.cells.items()}
    assert dataclasses.replace(apart, cells=cells).same_schedules == {"b": [["a", "c"]]}
