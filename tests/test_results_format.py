"""The results format (harness.results): its version, and the types a reader of rows.parquet gets."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from harness.publish import compare, publish
from harness.results import FORMAT_VERSION, ResultsError, load_rows, read_meta, read_rows_csv
from harness.runner import run_suite
from tests import test_suite_support as support


@pytest.fixture(autouse=True)
def _plugin():
    """The test plugin, for the tests that run its suites again (tests/conftest.py removes it after each)."""
    support.install()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished run with allocator rows (flags true and false) and rows without allocators (flags empty)."""
    folder = tmp_path_factory.mktemp("format")
    suite, (run_dir,) = support.runs_with_allocators(folder, "fmt", "[caching]", ("a",))
    return folder, suite, run_dir


def test_a_run_says_its_format_version(run):
    _, _, run_dir = run
    assert read_meta(run_dir)["format_version"] == FORMAT_VERSION


def test_parquet_readers_get_booleans_and_numbers_not_text(run):
    """rows.parquet's flags are nullable booleans (NA: not checked), so ``rows[rows.valid]`` selects the valid
    rows; in format 1 they were the strings 'true'/'false'/'' and that selection raised."""
    pytest.importorskip("pyarrow")  # the 'parquet' extra: without it a run writes rows.csv alone
    _, _, run_dir = run
    table = pd.read_parquet(run_dir / "rows.parquet")
    text = {r["case_id"]: r for r in read_rows_csv(run_dir / "rows.csv")}
    for column in ("valid", "arena_fits_budget", "placement_optimal"):
        assert str(table[column].dtype) == "boolean", column
        for case_id, value in zip(table["case_id"], table[column]):
            assert {"true": True, "false": False, "": None}[text[case_id][column]] == (None if pd.isna(value)
                                                                                       else bool(value))
    valid = table[table["valid"].fillna(False)]
    assert len(valid) == sum(r["valid"] == "true" for r in text.values()) > 0
    assert table.loc[table["status"] != "ok", "valid"].isna().all()  # a failed case was never validated
    assert str(table["iterations"].dtype) == "Int64" and str(table["held_max_bytes"].dtype) == "Int64"


def test_the_published_table_writes_flags_as_rows_csv_does(run, tmp_path):
    folder, suite, run_dir = run
    publish([run_dir], tmp_path / "site")
    table = read_rows_csv(run_dir / "rows.csv")
    published = pd.read_csv(tmp_path / "site" / suite.name / f"{suite.name}.csv", dtype=str, keep_default_na=False)
    assert sorted(published["valid"]) == sorted(r["valid"] for r in table)
    assert set(published["arena_fits_budget"]) <= {"true", "false", ""}


def _newer(run_dir, folder, version=FORMAT_VERSION + 1):
    copy = folder / "results" / "fmt" / f"v{version}"
    shutil.copytree(run_dir, copy)
    meta = json.loads((copy / "meta.json").read_text())
    (copy / "meta.json").write_text(json.dumps({**meta, "format_version": version, "run_id": copy.name}))
    return copy


def test_a_run_of_a_newer_format_is_refused_by_name_and_left_untouched(run, tmp_path):
    """Resume would rewrite rows.csv into this version's columns (losing the newer ones), publish and compare
    would read columns they do not know: each refuses, naming the file and both versions."""
    folder, suite, run_dir = run
    newer = _newer(run_dir, folder)
    before = {p.name: p.read_bytes() for p in newer.iterdir() if p.is_file()}
    words = rf"meta.json: results format {FORMAT_VERSION + 1}, newer than the {FORMAT_VERSION} this membudget"
    with pytest.raises(ResultsError, match=words):
        run_suite(suite, folder / "results", run_id=newer.name, resume=True, progress=False)
    with pytest.raises(ResultsError, match=words):
        publish([newer], tmp_path / "site")
    with pytest.raises(ResultsError, match=words):
        compare(run_dir, newer)
    with pytest.raises(ResultsError, match=words):
        load_rows(newer)
    assert {p.name: p.read_bytes() for p in newer.iterdir() if p.is_file()} == before
    shutil.rmtree(newer)


@pytest.mark.parametrize("version", [0, "2", 1.5, True])
def test_a_format_version_that_is_not_one_is_refused(run, version, tmp_path):
    folder, _, run_dir = run
    odd = _newer(run_dir, folder, version)
    try:
        with pytest.raises(ResultsError, match="is not a results format version"):
            load_rows(odd)
    finally:
        shutil.rmtree(odd)


def test_a_run_written_before_the_version_reads_as_format_1_and_resumes_into_the_current_one(run):
    """The committed results predate the version: they read as they are, and a resumed run says the version
    it now is."""
    folder, suite, run_dir = run
    old = folder / "results" / "fmt" / "old"
    shutil.copytree(run_dir, old)
    meta = json.loads((old / "meta.json").read_text())
    del meta["format_version"]
    (old / "meta.json").write_text(json.dumps({**meta, "run_id": "old"}))
    assert len(load_rows(old)) == len(suite.cases())
    assert run_suite(suite, folder / "results", run_id="old", resume=True, progress=False).ran == 0
    assert read_meta(old)["format_version"] == FORMAT_VERSION
    shutil.rmtree(old)


def test_file_names_of_long_models_fit_a_file_system_and_stay_distinct():
    """QA: a profile path of 250 characters as the model (the file profiler) failed every case with
    'OSError: File name too long' when the run cached its profile."""
    from harness.results import file_stem, profile_file

    assert profile_file("torchvision:resnet18", 32, "3x224x224", "float32") == \
        "torchvision_resnet18-b32-3x224x224-float32.json"  # the names of existing run folders do not move
    long = "/data/" + "a-very-deep-folder/" * 14
    names = {profile_file(long + end, 32, "3x224x224", "float32") for end in ("x.json", "y.json")}
    assert len(names) == 2 and all(len(n.encode()) <= 255 for n in names)
    assert all(len(file_stem(long + end + "/b32/f0.5/simulate")) <= 240 for end in ("x", "y"))


def test_a_folder_without_meta_json_is_published_under_its_rows_suite(run, tmp_path):
    _, suite, run_dir = run
    bare = tmp_path / "copied-rows"
    bare.mkdir()
    shutil.copy(run_dir / "rows.csv", bare / "rows.csv")
    publish([bare], tmp_path / "site")
    page = (tmp_path / "site" / suite.name / "index.md").read_text()
    assert "copied-rows has no meta.json" in page and "profiles of synthetic" in page


def test_a_run_written_with_a_message_over_csvs_field_limit_reads(tmp_path):
    """QA: a message of 200000 characters (before rows cut them) is over csv's field limit of 131072: the
    folder could not be read, resumed, published or compared again."""
    import csv

    from harness.results import COLUMNS, header_line

    run_dir = tmp_path / "huge"
    run_dir.mkdir()
    with open(run_dir / "rows.csv", "w", newline="") as f:
        f.write(header_line())
        row = {"suite": "s", "case_id": "c", "status": "error", "message": "ValueError: " + "Z" * 200_000}
        csv.writer(f, lineterminator="\n").writerow([row.get(c, "") for c in COLUMNS])
    assert len(read_rows_csv(run_dir / "rows.csv")[0]["message"]) == 200_012
    assert list(load_rows(run_dir)["case_id"]) == ["c"]


def test_a_message_as_long_as_the_limit_is_kept_whole_and_one_character_more_is_cut():
    from harness.results import MESSAGE_LIMIT, cut_message

    assert cut_message("m" * MESSAGE_LIMIT) == "m" * MESSAGE_LIMIT
    longer = cut_message("m" * MESSAGE_LIMIT + "!")
    assert " [... 1 characters cut ...] " in longer and longer.endswith("m!")


def test_a_blank_line_in_rows_csv_is_no_row(run, tmp_path):
    """A blank line (an edit by hand) is skipped, not refused as a row of no cells."""
    _, _, run_dir = run
    copy = tmp_path / "blank"
    shutil.copytree(run_dir, copy)
    lines = (copy / "rows.csv").read_text().splitlines(keepends=True)
    (copy / "rows.csv").write_text("".join(lines[:2] + ["\n"] + lines[2:]))
    assert len(load_rows(copy)) == len(lines) - 1


@pytest.mark.parametrize("status, message, interrupt", [
    ("error", "KeyboardInterrupt: ", True),
    ("error", "allocator caching: KeyboardInterrupt: ", True),  # the prefixes the runner puts before it
    ("error", "profiling failed: KeyboardInterrupt", True),
    ("error", "SystemError: CPUDispatcher(<function f at 0x7f>) returned a result with an exception set", True),
    ("error", "planner 'x' raised KeyboardInterrupt in a worker process, which Ctrl-C does not reach", False),
    ("error", "ValueError: no KeyboardInterrupts here", False),
    ("ok", "KeyboardInterrupt: ", False),
])
def test_the_rows_that_record_an_interrupt_are_told_from_results(status, message, interrupt):
    """The rows written before interrupts were recognised: --resume drops them and runs their cases again; a
    plugin's own KeyboardInterrupt in a worker is a result (harness.case.classify's error row)."""
    from harness.results import is_interrupt_row

    assert is_interrupt_row({"status": status, "message": message}) is interrupt


def test_a_value_that_is_not_a_number_is_an_empty_cell():
    """An oom row's iteration time (NaN) is an empty cell in rows.csv, as every missing value is
    (docs/results.md), not the text nan."""
    from harness.results import row_cells

    cells = row_cells({"case_id": "c", "status": "oom", "makespan_s": float("nan"), "ratio_to_lb": 1.5})
    assert (cells["makespan_s"], cells["ratio_to_lb"], cells["peak_bytes"]) == ("", "1.5", "")


def test_the_row_writer_cuts_a_torn_last_line_before_it_appends(tmp_path):
    """``RowWriter`` on a rows.csv whose last line a kill cut short: the torn line goes, whole rows stay, and
    the appended row is a row of its own (not glued to the torn one)."""
    from harness.results import RowWriter, format_row, header_line

    path = tmp_path / "rows.csv"
    whole = format_row({"suite": "s", "case_id": "a", "status": "ok"})
    torn = format_row({"suite": "s", "case_id": "b", "status": "ok", "message": "cut"})[:-9]
    path.write_text(header_line() + whole + torn)
    RowWriter(path).append([{"suite": "s", "case_id": "c", "status": "error", "message": "m"}])
    rows = read_rows_csv(path)
    assert [(r["case_id"], r["status"]) for r in rows] == [("a", "ok"), ("c", "error")]


def test_a_run_whose_rows_csv_is_empty_resumes(tmp_path):
    """A run killed as it began leaves a rows.csv of no bytes, not even the header: resume runs every case."""
    from harness.suite import load_suite

    suite = load_suite(support.write_suite(tmp_path))
    run_dir = run_suite(suite, tmp_path / "r", run_id="x", progress=False).run_dir
    (run_dir / "rows.csv").write_text("")
    outcome = run_suite(suite, tmp_path / "r", run_id="x", resume=True, progress=False)
    assert outcome.ran == len(suite.cases()) == len(load_rows(run_dir))
