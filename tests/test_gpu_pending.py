"""benchmarks/gpu/pending.py on the CPU: what a GPU call still has to run of a suite, what it sent to
the GPU and got back as errors, and ``--forget-errors`` removing only the named suite's error rows
(the GPU table's parts share one run folder) and never an interrupt row's case twice."""

from __future__ import annotations

import textwrap
from pathlib import Path

from harness.results import format_row, header_line, read_rows_csv
from harness.suite import load_suite

from tests.test_suite_support import gpu_script

pending = gpu_script("pending")

PART = """\
    name: parts
    profiler: analytic
    device: V100-PCIe
    models: [{{model: builtin:tiny-cnn, batch_sizes: [{batch}], input_size: [3, 16, 16]}}]
    budgets: {{fractions: [0.5, 1.0]}}
    planners: [keep-all]
    executors: [torch, simulate]
"""


def _rows(suite_path: Path, statuses: dict[str, str]) -> list[str]:
    """One row per case of the suite: status by executor (``statuses``), an error's message."""
    out = []
    for case in load_suite(suite_path).cases():
        status = statuses[case.executor]
        message = {"error": "RuntimeError: CUDA error", "interrupt": "KeyboardInterrupt"}.get(status, "")
        out.append(format_row({"suite": "parts", "case_id": case.case_id, "executor": case.executor,
                               "status": "error" if status == "interrupt" else status, "message": message}))
    return out


def test_the_counts_and_forgetting_one_suites_errors_in_a_shared_run_folder(tmp_path, capsys):
    p1, p2 = tmp_path / "p1.yaml", tmp_path / "p2.yaml"
    p1.write_text(textwrap.dedent(PART.format(batch=4)))
    p2.write_text(textwrap.dedent(PART.format(batch=8)))
    run_dir = tmp_path / "results" / "parts" / "r1"
    run_dir.mkdir(parents=True)
    assert pending.pending(str(p1), "r1", str(tmp_path / "results")) == (4, 4, run_dir, 0, 0)  # no rows yet

    # p1: its torch cases failed on the GPU (and one budget is infeasible: never sent to the GPU);
    # p2: one torch case failed, the other was interrupted
    lines = _rows(p1, {"torch": "error", "simulate": "ok"})[:2] + _rows(p1, {"torch": "infeasible",
                                                                            "simulate": "ok"})[2:]
    lines += _rows(p2, {"torch": "error", "simulate": "ok"})[:2] + _rows(p2, {"torch": "interrupt",
                                                                             "simulate": "ok"})[2:]
    (run_dir / "rows.csv").write_text(header_line() + "".join(lines))
    root = str(tmp_path / "results")
    assert [c.executor for c in load_suite(p1).cases()] == ["torch", "simulate"] * 2  # what the slices assume
    assert pending.pending(str(p1), "r1", root) == (0, 4, run_dir, 1, 1)
    assert pending.pending(str(p2), "r1", root) == (1, 4, run_dir, 1, 1)  # the interrupt runs again

    assert pending.main(["--forget-errors", str(p1), "r1", root]) == 0
    assert "1 error row(s) removed" in capsys.readouterr().err
    assert pending.pending(str(p1), "r1", root) == (1, 4, run_dir, 0, 0)
    assert pending.pending(str(p2), "r1", root) == (1, 4, run_dir, 1, 1)  # p2's error is p2's to keep
    assert sum("KeyboardInterrupt" in r["message"] for r in read_rows_csv(run_dir / "rows.csv")) == 1
    assert pending.main(["--forget-errors", str(p2), "r1", root]) == 0
    assert "1 error row(s) removed" in capsys.readouterr().err  # its error: the interrupt row is resume's to drop
    assert pending.pending(str(p2), "r1", root) == (2, 4, run_dir, 0, 0)


def test_a_torn_row_is_a_pending_case_not_a_failed_question(tmp_path):
    """Review: pending.py read rows.csv strictly and failed on a row torn by a killed write, so session.sh
    skipped the job on every call and never ran the --resume that repairs it; the torn row's case is pending."""
    p1 = tmp_path / "p1.yaml"
    p1.write_text(textwrap.dedent(PART.format(batch=4)))
    run_dir = tmp_path / "results" / "parts" / "r1"
    run_dir.mkdir(parents=True)
    lines = _rows(p1, {"torch": "ok", "simulate": "ok"})
    lines[1] = lines[1][:40] + "\n"  # torn, then the next rows appended after it
    (run_dir / "rows.csv").write_text(header_line() + "".join(lines))
    assert pending.pending(str(p1), "r1", str(tmp_path / "results")) == (1, 4, run_dir, 2, 0)  # the torch rows
    # --forget-errors reads it as leniently (no error row here to remove: the file stays, the torn case pending)
    assert pending.pending(str(p1), "r1", str(tmp_path / "results"), forget_errors=True) == (1, 4, run_dir, 2, 0)


def test_asking_plans_nothing(tmp_path, monkeypatch):
    """session.sh asks before each job, in a fresh process: reading the suite's option values planned a toy
    chain per planner entry with options, compiling their kernels (16 s more with an empty Numba cache)."""
    import harness.case

    def planned(*args, **kwargs):
        raise AssertionError("pending.py planned a chain")

    monkeypatch.setattr(harness.case, "option_value_refusal", planned)
    p1 = tmp_path / "p1.yaml"
    p1.write_text(textwrap.dedent(PART.format(batch=4)).replace("planners: [keep-all]",
                                                                "planners: [keep-all, {name: torch-checkpoint, every: 2}]"))
    assert pending.pending(str(p1), "r1", str(tmp_path / "results"))[:2] == (8, 8)


def test_a_row_that_took_an_earlier_run_was_sent_to_no_device(tmp_path):
    """Under same_schedule: reuse a case may take an earlier run's row (a fingerprint, no run_time_s):
    counted as sent, a call whose real runs all failed beside such rows would not stop (session.sh)."""
    p1 = tmp_path / "p1.yaml"
    p1.write_text(textwrap.dedent(PART.format(batch=4)))
    run_dir = tmp_path / "results" / "parts" / "r1"
    run_dir.mkdir(parents=True)
    lines = []
    for k, case in enumerate(load_suite(p1).cases()):
        ran = case.executor == "simulate" or k == 0  # the second torch case took the first's run
        lines.append(format_row({"suite": "parts", "case_id": case.case_id, "executor": case.executor,
                                 "status": "ok", "schedule_fingerprint": "abc", "run_time_s": 1.0 if ran else None}))
    (run_dir / "rows.csv").write_text(header_line() + "".join(lines))
    assert pending.pending(str(p1), "r1", str(tmp_path / "results")) == (0, 4, run_dir, 1, 0)
