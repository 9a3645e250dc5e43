"""Result folders: ``results/<suite>/<run-id>/`` with ``rows.csv``, ``rows.parquet``, ``meta.json``.

One row a case (docs/architecture.md, "Suites and results"). The first columns, ``STABLE_COLUMNS``,
are the ones users script against: never renamed. ``COLUMNS`` adds more after them;
docs/results.md documents every one.

The format carries a version, ``FORMAT_VERSION``, written to every run's ``meta.json``
(docs/results.md, "Format versions"): a run folder of a newer format is refused by name
before anything reads or writes it, since this version would drop the columns it does not know.

Rows are appended to ``rows.csv`` one finished case at a time (one ``write`` and an
``fsync`` each), so a run that is interrupted keeps every case it finished and
``--resume`` can skip them. A torn last line (the process killed mid-write) is dropped
when the file is read back.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from harness.files import not_utf8, replace_atomic, write_text_atomic

STABLE_COLUMNS: tuple[str, ...] = (
    "suite", "case_id", "model", "batch_size", "input_size", "device", "profiler", "planner",
    "executor", "allocator", "budget_bytes", "status", "message", "makespan_s", "ideal_s",
    "lower_bound_s", "ratio_to_lb", "throughput", "peak_bytes", "moved_bytes", "min_memory_bytes",
    "max_live_bytes", "arena_bytes", "plan_time_s",
)
EXTRA_COLUMNS: tuple[str, ...] = (
    "run_id", "planner_label", "budget_label", "budget_fraction", "peak_memory_bytes", "idle_s", "fragmentation",
    "place_time_s", "run_time_s", "planner_options", "repeat", "seed", "dtype", "n_stages",
    "offloaded_stages", "sub_batches", "valid", "timeline", "finished_at", "arena_fits_budget",
    # measured by the torch executor (Run.metrics)
    "time_min_s", "time_max_s", "time_iqr_s", "stall_s", "max_memory_allocated", "max_memory_reserved",
    "predicted_s", "predicted_peak_bytes", "prediction_error", "memory_fraction", "iterations", "held_max_bytes",
    "grad_error",
    # the quantities common to every strategy at a budget (what the head-to-head tables rank by)
    "budget_lower_bound_s", "ratio_to_budget_lb", "slowdown",
    # the parts of the device memory (harness.device_memory)
    "planning_budget_bytes", "runtime_bytes", "fragmentation_bytes", "reserved_predicted_bytes",
    # every other metric the executor reported, JSON (an executor plugin's own figures)
    "metrics",
    # what the allocator proved about its arena (None: it does not say)
    "placement_optimal", "placement_lower_bound_bytes",
    # what the schedule does with the iteration's saved data (harness.memory.saved_data), and the weights
    "kept_bytes", "offloaded_bytes", "recomputed_bytes", "recompute_s", "weight_bytes",
    # on a refused budget's row: the bytes the planner said it would need (InfeasibleBudget.needed_bytes)
    "needed_bytes",
    # what the executor ran, hashed (Schedule.fingerprint): rows that share it ran the same iteration
    "schedule_fingerprint",
)
COLUMNS: tuple[str, ...] = STABLE_COLUMNS + EXTRA_COLUMNS
STATUSES: tuple[str, ...] = ("ok", "infeasible", "oom", "error")
# 1: the runs before the version was written (no format_version in meta.json); 2: format_version in
# meta.json, and rows.parquet's flags (valid, arena_fits_budget, placement_optimal) as booleans and
# iterations and held_max_bytes as integers, where 1 had them as text
FORMAT_VERSION = 2

ROWS_CSV, ROWS_PARQUET, META_JSON, TIMELINES = "rows.csv", "rows.parquet", "meta.json", "timelines"
NOTES_MD = "notes.md"  # a person's notes on a run (written by hand, never by membudget), shown on its page

_INT_COLUMNS = ("batch_size", "budget_bytes", "peak_bytes", "moved_bytes", "min_memory_bytes",
                "max_live_bytes", "arena_bytes", "peak_memory_bytes", "repeat", "seed", "n_stages",
                "offloaded_stages", "sub_batches", "max_memory_allocated", "max_memory_reserved",
                "predicted_peak_bytes", "placement_lower_bound_bytes", "planning_budget_bytes", "runtime_bytes",
                "fragmentation_bytes", "reserved_predicted_bytes", "kept_bytes", "offloaded_bytes", "recomputed_bytes",
                "weight_bytes", "iterations", "held_max_bytes", "needed_bytes")
_FLOAT_COLUMNS = ("makespan_s", "ideal_s", "lower_bound_s", "ratio_to_lb", "throughput", "plan_time_s",
                  "budget_fraction", "idle_s", "fragmentation", "place_time_s", "run_time_s", "time_min_s",
                  "time_max_s", "time_iqr_s", "stall_s", "predicted_s", "prediction_error", "memory_fraction",
                  "grad_error", "budget_lower_bound_s", "ratio_to_budget_lb", "slowdown", "recompute_s")
_BOOL_COLUMNS = ("valid", "arena_fits_budget", "placement_optimal")  # true / false / empty (not checked)
# A row's message longer than this many characters keeps its head and its tail (where it was raised) and
# says how many were cut between: a plugin's may be any length, and one over csv's field limit (131072)
# made the run folder unreadable.
MESSAGE_LIMIT, _MESSAGE_TAIL = 4000, 300
# What the readers allow a cell (csv's C long), so that the runs written before messages were cut still read.
_FIELD_LIMIT = 2**31 - 1


class ResultsError(ValueError):
    """A folder or file that is not a membudget result."""


def _cell(value: Any) -> str:
    """A row's value as its CSV cell. An executor's metrics may hold anything: a NumPy scalar or array is
    written as the Python value it holds, an object JSON cannot write as its ``str``."""
    value = _plain(value)
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, sort_keys=True, default=json_value)
        except (TypeError, ValueError):  # keys JSON cannot write, or a structure that holds itself
            return str(value)
    return str(value)


def _plain(value: Any) -> Any:
    """A NumPy scalar or array as the Python value it holds; any other value as it is."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def json_value(value: Any) -> Any:
    """What ``json.dumps`` writes for a value it cannot (its ``default``): a NumPy value's Python value,
    else its ``str`` (a path's, for one)."""
    plain = _plain(value)
    return str(value) if plain is value else plain


def cut_message(message: str) -> str:
    """``message``, or, when longer than ``MESSAGE_LIMIT`` characters, that many of its head and tail and
    how many were cut between them."""
    if len(message) <= MESSAGE_LIMIT:
        return message
    head = MESSAGE_LIMIT - _MESSAGE_TAIL
    cut = len(message) - MESSAGE_LIMIT
    return f"{message[:head]} [... {cut} characters cut ...] {message[-_MESSAGE_TAIL:]}"


def row_cells(row: Mapping[str, Any]) -> dict[str, str]:
    """``row`` as the cells ``rows.csv`` holds, what ``read_rows_csv`` gives back: every column of
    ``COLUMNS``, a missing one empty, the message cut to ``MESSAGE_LIMIT`` characters."""
    cells = {c: _cell(row.get(c)) for c in COLUMNS}
    cells["message"] = cut_message(cells["message"])
    return cells


def format_row(row: Mapping[str, Any]) -> str:
    """One CSV line (with its newline) of ``row`` in ``COLUMNS`` order (``row_cells``)."""
    cells = row_cells(row)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cells.values())
    return buf.getvalue()


def header_line() -> str:
    """The CSV header line."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(COLUMNS)
    return buf.getvalue()


class RowWriter:
    """Appends rows to ``rows.csv``, each group of rows in one durable write."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._repair()

    def _repair(self) -> None:
        """Start the file with a header, cut a torn last line left by a killed run, and bring the
        rows of an older version of the columns to this one (a resumed run appends in this order)."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            self.path.write_text(header_line())
            return
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as f:
                f.truncate(cut)
        if data.split(b"\n", 1)[0].decode("utf-8").rstrip("\r") != header_line().rstrip("\n"):
            rows = read_rows_csv(self.path)  # by column name: cells of columns since gone are dropped
            write_text_atomic(self.path, header_line() + "".join(format_row(r) for r in rows))

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append ``rows`` at once and flush them to disk."""
        text = "".join(format_row(r) for r in rows)
        if not text:
            return
        with open(self.path, "a", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def read_rows_csv(path: Path, *, strict: bool = True) -> list[dict[str, str]]:
    """The complete rows of a ``rows.csv`` as dicts of strings (a torn last record is dropped: a line cut
    short, or a message cut after one of its lines).

    A row with fewer or more cells than the header before the last (a torn write that a later run
    appended after, or an edit by hand) is refused, naming its line (``strict``, what publish and compare
    read), or left out (``strict=False``: what finds the cases still to run, which then include its case);
    ``--resume`` drops such rows from the file and runs their cases again (:func:`drop_malformed_rows`).
    """
    rows, malformed, _ = _read_rows(Path(path))
    if malformed and strict:
        line, cells, width = malformed[0]
        more = f" (and {len(malformed) - 1} more)" if len(malformed) > 1 else ""
        raise ResultsError(f"{path}:{line}: a row of {cells} cell(s), the header has {width}{more}: a write torn by "
                           "a crash, or an edit? membudget run SUITE --resume on this run drops such rows and runs "
                           "their cases again")
    return rows


def _read_rows(path: Path) -> tuple[list[dict[str, str]], list[tuple[int, int, int]], bool]:
    """The complete rows; the (line, cells, header's cells) of every row before the last with another number
    of cells; and whether the last record is torn (cut within a line, or within a message of several lines)."""
    if not path.exists():
        return [], [], False
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _not_text(path, exc) from None
    torn = bool(text) and not text.endswith("\n")
    if torn:
        text = text[: text.rfind("\n") + 1]
    reader = _csv_reader(io.StringIO(text))
    header = next(reader, [])
    _check_columns(path, header)
    rows, malformed = [], []
    for cells in reader:
        if len(cells) == len(header):
            rows.append(dict(zip(header, cells)))
        elif cells:  # a blank line is no row
            malformed.append((reader.line_num, len(cells), len(header)))
    if malformed and malformed[-1][0] == reader.line_num and (torn or _open_quote(text)):
        malformed.pop()  # the last record, cut inside a message's lines: the torn tail
        torn = True
    return rows, malformed, torn


def _csv_reader(lines: Iterable[str]) -> Any:
    """A ``csv.reader`` of ``lines`` that reads cells longer than csv's default limit of 131072 characters
    (a message written before messages were cut, ``MESSAGE_LIMIT``)."""
    csv.field_size_limit(max(csv.field_size_limit(), _FIELD_LIMIT))  # process-wide: only ever raised
    return csv.reader(lines)


def _open_quote(text: str) -> bool:
    """Whether ``text`` ends inside a quoted CSV cell (an odd number of quotes: ``""`` inside a cell is two)."""
    return text.count('"') % 2 == 1


def drop_malformed_rows(run_dir: Path) -> tuple[list[int], bool]:
    """Remove from a run's ``rows.csv`` the rows with another number of cells than the header, and a torn
    last record (see :func:`read_rows_csv`), atomically; return the malformed rows' line numbers and whether
    a torn last record went (nothing is written when there is nothing to remove).

    The writer ends every record with a newline, so a last record without one is torn even when it has
    every cell (a kill inside its last one, ``weight_bytes`` cut from 123456 to 123): its case runs again."""
    path = Path(run_dir) / ROWS_CSV
    rows, malformed, torn = _read_rows(path)
    if malformed or torn:
        _write_rows_atomic(path, rows)
    return [line for line, _, _ in malformed], torn


def check_statuses(path: Path, rows: list[Mapping[str, Any]]) -> None:
    """``ResultsError`` naming the first row whose status is none of :data:`STATUSES` (the pages and
    comparisons count rows by status: an unknown one would be silently miscounted)."""
    for number, row in enumerate(rows, start=1):
        if row.get("status") not in STATUSES:
            raise ResultsError(f"{path}: row {number} after the header ({row.get('case_id')!r}) has the status "
                               f"{row.get('status')!r}, none of {', '.join(STATUSES)}")


def _not_text(path: Path, exc: UnicodeDecodeError) -> ResultsError:
    return ResultsError(f"{path}: not a membudget results table (not UTF-8 text: {exc.reason} at byte {exc.start})")


def _check_columns(path: Path, header: list[str]) -> None:
    missing = [c for c in STABLE_COLUMNS if c not in header]
    if header and missing:
        raise ResultsError(f"{path}: not a membudget results table: no column(s) {', '.join(missing)} "
                           f"(docs/results.md lists the columns of rows.csv)")


def check_results_table(run_dir: Path) -> None:
    """Raise ``ResultsError`` naming the missing columns when a run's ``rows.csv`` is not a results table."""
    path = Path(run_dir) / ROWS_CSV
    try:
        with open(path, encoding="utf-8", newline="") as f:
            header = next(csv.reader(f), [])
    except UnicodeDecodeError as exc:
        raise _not_text(path, exc) from None
    if not header:
        raise ResultsError(f"{path}: empty, not a membudget results table (a run writes its header first)")
    _check_columns(path, header)


# What an ``error`` row says when an interrupt was recorded as a result (before the runner
# recognised them): the interrupt itself (its name first, after an allocator's or the profiling's
# prefix), or the SystemError CPython raises when Ctrl-C lands inside a compiled (Numba) function.
# A plugin's own KeyboardInterrupt in a worker ("planner 'x' raised KeyboardInterrupt ...") is a result.
INTERRUPT_ROW = re.compile(r"(?:^|: )KeyboardInterrupt\b|returned a result with an exception set")


def is_interrupt_row(row: Mapping[str, Any]) -> bool:
    """True for an ``error`` row that records an interrupt, not a result: ``--resume`` runs it again."""
    message = str(row.get("message") or "")
    return row.get("status") == "error" and INTERRUPT_ROW.search(message) is not None


def finished_case_ids(run_dir: Path) -> set[str]:
    """The case ids already written to a run's ``rows.csv``, less the rows that record an interrupt."""
    return {row["case_id"] for row in read_rows_csv(Path(run_dir) / ROWS_CSV, strict=False)
            if not is_interrupt_row(row)}


def drop_rows(run_dir: Path, which: Callable[[Mapping[str, Any]], bool] = is_interrupt_row) -> set[str]:
    """Remove the rows that record an interrupt (or those ``which`` picks) from a run's ``rows.csv``,
    atomically; return their case ids. Nothing is written when no row is picked."""
    path = Path(run_dir) / ROWS_CSV
    rows = read_rows_csv(path, strict=False)  # a malformed row goes too: its case is no finished one
    stale = {row["case_id"] for row in rows if which(row)}
    if stale:
        _write_rows_atomic(path, [row for row in rows if row["case_id"] not in stale])
    return stale


def _write_rows_atomic(path: Path, rows: list[dict[str, str]]) -> None:
    """Rewrite ``rows.csv`` with ``rows`` under its own header, beside itself and renamed over it, so that
    a crash leaves the old file or the new one."""
    header = next(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(header)
            writer.writerows([row[c] for c in header] for row in rows)
            f.flush()
            os.fsync(f.fileno())

    replace_atomic(path, write)


def to_frame(rows: list[Mapping[str, Any]]) -> pd.DataFrame:
    """A typed DataFrame of rows: ints as nullable Int64, floats as float (NaN when empty), the flags
    as nullable booleans (NA: not checked), the rest as text ("" when empty)."""
    frame = pd.DataFrame(list(rows), columns=list(COLUMNS))
    for col in _INT_COLUMNS:
        frame[col] = pd.to_numeric(frame[col].replace("", None), errors="coerce").astype("Int64")
    for col in _FLOAT_COLUMNS:
        frame[col] = pd.to_numeric(frame[col].replace("", None), errors="coerce").astype(float)
    for col in _BOOL_COLUMNS:
        text = frame[col].astype(object).where(frame[col].notna(), "").astype(str).str.lower()
        frame[col] = text.map({"true": True, "false": False}).astype("boolean")
    text_cols = [c for c in COLUMNS if c not in _INT_COLUMNS and c not in _FLOAT_COLUMNS and c not in _BOOL_COLUMNS]
    for col in text_cols:
        frame[col] = frame[col].astype(object).where(frame[col].notna(), "").astype(str)
    return frame


def write_frame_csv(frame: pd.DataFrame, path: Path) -> None:
    """Write a frame of rows (``to_frame``'s, columns added or not) as CSV in ``rows.csv``'s conventions:
    the flags as true/false, an empty cell for a missing value."""
    flags = {c: frame[c].map({True: "true", False: "false"}).fillna("") for c in _BOOL_COLUMNS if c in frame}
    frame.assign(**flags).to_csv(path, index=False)


def load_rows(run_dir: Path) -> pd.DataFrame:
    """The rows of one run folder as a typed DataFrame (a run of a newer format is refused)."""
    run_dir = Path(run_dir)
    if not (run_dir / ROWS_CSV).exists():
        raise ResultsError(f"{run_dir}: no {ROWS_CSV} here; is this a run folder (results/<suite>/<run-id>)?")
    read_meta(run_dir)
    rows = read_rows_csv(run_dir / ROWS_CSV)
    check_statuses(run_dir / ROWS_CSV, rows)
    return to_frame(rows)


def write_parquet(run_dir: Path) -> Path | None:
    """Write ``rows.parquet`` beside ``rows.csv`` when pyarrow is installed (else None)."""
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        return None
    from harness.files import replace_atomic

    run_dir = Path(run_dir)
    out = run_dir / ROWS_PARQUET
    frame = load_rows(run_dir)
    replace_atomic(out, lambda tmp: frame.to_parquet(tmp, index=False))  # a full disk left it unreadable
    return out


def slug(text: str) -> str:
    """A file-name-safe form of a case id or model name."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_")


def file_stem(text: str, limit: int = 240) -> str:
    """``slug(text)``, or, when that is longer than ``limit`` bytes (a case id or model that is a long
    profile path), its start and a hash of the whole: file names stay under the 255 bytes file systems
    allow and still differ."""
    name = slug(text)
    if len(name.encode()) <= limit:
        return name
    import hashlib

    return f"{name[: limit - 17]}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def profile_file(model: str, batch_size: int, input_label: str, dtype: str) -> str:
    """The file name of a workload's profile in a run folder's ``profiles/``."""
    return file_stem(f"{model}-b{batch_size}-{input_label}-{dtype}") + ".json"


class RunProfiles:
    """The profiles a run folder stored (``profiles/``), each read once, looked up by a row."""

    def __init__(self, run_dir: Path) -> None:
        self.folder = Path(run_dir) / "profiles"
        self._read: dict[str, Any] = {}

    def of(self, row: Mapping[str, Any]) -> Any:
        """The ``Profile`` of ``row``'s workload, or None when the run did not store it."""
        from harness.model import Profile, load

        name = profile_file(row["model"], int(row["batch_size"]), str(row["input_size"]), row["dtype"] or "float32")
        if name not in self._read:
            path = self.folder / name
            self._read[name] = load(Profile, path) if path.exists() else None
        return self._read[name]


def read_meta(run_dir: Path) -> dict[str, Any]:
    """A run's ``meta.json`` ({} when missing); a ``ResultsError`` when it is not JSON, or says a
    format this version cannot read (``format_version`` above ``FORMAT_VERSION``)."""
    path = Path(run_dir) / META_JSON
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{path}: not valid JSON: {not_utf8(exc)}") from None
    if not isinstance(meta, dict):
        raise ResultsError(f"{path}: not a run's meta.json (a JSON object)")
    version = meta.get("format_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ResultsError(f"{path}: format_version {version!r} is not a results format version (1, 2, ...)")
    if version > FORMAT_VERSION:
        raise ResultsError(f"{path}: results format {version}, newer than the {FORMAT_VERSION} this membudget "
                           "reads (and would write over): upgrade membudget to read or resume it")
    return meta


def read_notes(run_dir: Path) -> str:
    """A run's ``notes.md`` (Markdown a person wrote about the run: what it is, what is known to be wrong
    in it), stripped; '' when there is none."""
    path = Path(run_dir) / NOTES_MD
    try:
        return path.read_text(encoding="utf-8").strip() if path.is_file() else ""
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{path}: {not_utf8(exc)}; a run's notes are Markdown") from None


def write_meta(run_dir: Path, meta: Mapping[str, Any]) -> None:
    """Write ``meta.json`` atomically (a crash leaves the old one or the new one)."""
    write_text_atomic(Path(run_dir) / META_JSON, json.dumps(meta, indent=1, sort_keys=True, default=str))


@dataclass(frozen=True)
class RunFolder:
    """A run folder found on disk: its suite name, run id and path."""

    suite: str
    run_id: str
    path: Path


def is_run_folder(path: Path) -> bool:
    """True when ``path`` holds a ``rows.csv``."""
    return (Path(path) / ROWS_CSV).is_file()


def runs_of_suite(suite_dir: Path) -> list[RunFolder]:
    """The run folders of one suite folder, oldest first: by when a run last started (meta.json).

    Run ids are names (``published``, a timestamp, anything given with ``--run-id``), so
    their order says nothing; a folder without sessions counts by its modification time. Two runs
    started within the same second (``started`` is in seconds) go by when their ``meta.json`` was
    last written: the run written last is taken as the later one.
    """
    suite_dir = Path(suite_dir)
    runs = [p for p in suite_dir.iterdir() if p.is_dir() and is_run_folder(p)] if suite_dir.is_dir() else []
    return [RunFolder(suite_dir.name, p.name, p) for p in sorted(runs, key=_last_started)]


def _last_started(run_dir: Path) -> tuple[str, int, str]:
    try:
        sessions = read_meta(run_dir).get("sessions") or []
    except ResultsError:
        sessions = []
    started = max((str(s.get("started", "")) for s in sessions), default="")
    if not started:
        from datetime import datetime, timezone

        started = datetime.fromtimestamp(run_dir.stat().st_mtime, timezone.utc).isoformat(timespec="seconds")
    meta = run_dir / META_JSON
    return started, meta.stat().st_mtime_ns if meta.is_file() else 0, run_dir.name


def _not_a_run(path: Path) -> str:
    """What a file given in place of a run folder is, and the command that reads it."""
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return (f"a suite, not a run: membudget run {path} runs it; publish and compare read the run folder it "
                "writes (results/<suite>/<run-id>)")
    if suffix == ".json":
        return "a JSON file (a profile or a schedule), not a run: membudget plan and simulate read a profile"
    if suffix == ".csv":
        return "a CSV file that is no run's rows.csv: membudget place reads an allocation trace (id,lower,upper,size)"
    return f"a file, not a run folder (expected results/<suite>/<run-id>/{ROWS_CSV})"


def find_runs(paths: Iterable[str | Path]) -> list[RunFolder]:
    """Resolve publish/compare arguments to run folders.

    Each path is a run folder (has ``rows.csv``), a suite folder (its latest run), or a
    results root (the latest run of every suite in it).
    """
    found: list[RunFolder] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ResultsError(f"{path}: no such file or folder")
        if path.name == ROWS_CSV and path.is_file():  # a run's rows: its run folder
            path = path.parent
        if path.is_file():
            raise ResultsError(f"{path}: {_not_a_run(path)}")
        if is_run_folder(path):
            meta = read_meta(path)
            found.append(RunFolder(meta.get("suite", path.parent.name), path.name, path))
            continue
        runs = runs_of_suite(path)
        if runs:
            found.append(runs[-1])
            continue
        suites = [runs_of_suite(p) for p in sorted(path.iterdir()) if p.is_dir()] if path.is_dir() else []
        latest = [r[-1] for r in suites if r]
        if not latest:
            rows = path / ROWS_CSV
            if rows.is_symlink() and not rows.exists():
                raise ResultsError(f"{rows}: a link to {os.readlink(rows)}, which does not exist")
            if rows.is_dir():
                raise ResultsError(f"{rows}: a folder, not the run's table (a CSV file)")
            raise ResultsError(f"{path}: no results here (expected results/<suite>/<run-id>/{ROWS_CSV})")
        found.extend(latest)
    return found
