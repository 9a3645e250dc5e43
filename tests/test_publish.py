"""``membudget publish`` pages and plots, and ``compare`` of two runs."""

from __future__ import annotations

import csv
import json
import html.parser
import xml.etree.ElementTree as ET

import pytest

from harness.publish import compare, publish
from harness.results import ResultsError, find_runs, read_rows_csv
from harness.runner import run_suite
from harness.suite import load_suite
from tests import test_suite_support as support

PNG = b"\x89PNG\r\n\x1a\n"
XHTML = "{http://www.w3.org/1999/xhtml}"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Two runs of a synthetic suite with allocators and a failing planner."""
    support.install()
    folder = tmp_path_factory.mktemp("publish")
    text = support.SUITE.format(name="pub").replace("[keep-all, prefix]", "[keep-all, prefix, boom]")
    text += "allocators: [caching, first-fit]\n"
    suite = load_suite(support.write_suite(folder, text))
    first = run_suite(suite, folder / "results", run_id="run-a", progress=False)
    second = run_suite(suite, folder / "results", run_id="run-b", progress=False)
    return folder, suite, first.run_dir, second.run_dir


def test_publish_writes_wellformed_pages_with_every_case_and_plots(results, tmp_path):
    folder, suite, _, run_b = results
    written = publish([folder / "results"], tmp_path / "site")
    page = tmp_path / "site" / "pub" / "index.html"
    assert page in written and (tmp_path / "site" / "index.html") in written
    assert read_rows_csv(tmp_path / "site" / "pub" / "pub.csv") == read_rows_csv(run_b / "rows.csv")  # latest run
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


def test_ratio_tables_hold_every_planner_and_budget(results, tmp_path):
    folder, suite, _, run_b = results
    publish([run_b], tmp_path / "site")
    root = ET.fromstring((tmp_path / "site" / "pub" / "index.html").read_text())
    tables = list(root.iter(f"{XHTML}table"))
    ratio_tables = [t for t in tables if next(t.iter(f"{XHTML}th")).text == "planner"]
    assert len(ratio_tables) == 3
    rows = {r["case_id"]: r for r in read_rows_csv(run_b / "rows.csv") if r["allocator"] == "caching"}
    first = ratio_tables[0]
    header = [th.text for th in first.iter(f"{XHTML}th")]
    assert [h.split(" ")[0] for h in header[1:]] == ["f0", "f0.5", "f1"]
    body = [[td.text or "" for td in tr.iter(f"{XHTML}td")] for tr in first.iter(f"{XHTML}tr")][1:]
    assert [line[0] for line in body] == ["keep-all", "prefix", "boom"]
    for line in body:
        for label, cell in zip(["f0", "f0.5", "f1"], line[1:]):
            row = rows[f"synthetic:chain4/b2/3x32x32/{line[0]}/{label}/simulate/caching"]
            expected = f"{float(row['ratio_to_lb']):.3f}" if row["status"] == "ok" else row["status"]
            assert cell == expected


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
    (suite_dir / "aaa-new" / "meta.json").write_text(json.dumps(meta))
    assert [r.path for r in find_runs([suite_dir])] == [suite_dir / "aaa-new"]
