"""How many cases of a suite a run folder still lacks (benchmarks/gpu/session.sh asks before each job).

    python benchmarks/gpu/pending.py SUITE.yaml RUN_ID [RESULTS_ROOT]
    python benchmarks/gpu/pending.py --forget-errors SUITE.yaml RUN_ID [RESULTS_ROOT]

prints ``<pending> <total> <run folder> <measured> <errors>``: the suite's cases that ``--resume``
would run (not in the run's ``rows.csv``, or recorded there as an interrupt), all of them, the
run folder, the finished cases sent to the device (any executor but ``simulate``, less the
``infeasible`` ones, which never got there) and how many of those are ``error`` rows (session.sh stops a call whose slice measured nothing but errors). Nothing is profiled or run, so asking costs a second where
resuming a finished part would build the harness's tasks first.

An ``error`` row counts as finished, as it does for ``--resume``. After a fix (on the development
machine, where a CUDA suite cannot run), ``--forget-errors`` removes the suite's error rows from
the run (not those of other suites sharing its folder, as the GPU table's parts do) so that the
next GPU call runs those cases again, and says how many it removed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.results import ROWS_CSV, drop_rows, finished_case_ids, is_interrupt_row, read_rows_csv
from harness.same_schedule import took_earlier_run
from harness.suite import load_suite


PREDICTED = "simulate"  # the executor that predicts; every other one measures on the device (summary.py)


def pending(suite_path: str, run_id: str, root: str = "results",
            forget_errors: bool = False) -> tuple[int, int, Path, int, int]:
    """Of ``suite_path``'s run ``run_id``: (cases not finished, cases in all, the run folder, finished
    cases sent to the device (any executor but ``simulate``; not ``infeasible``, which no planner
    planned), and how many of those are errors). ``forget_errors``: first remove this suite's error
    rows from the run (others' stay: the GPU table's parts share one run folder), saying how many."""
    suite = load_suite(suite_path, check_option_values=False)  # plans nothing: no kernel to compile
    run_dir = Path(root) / suite.name / run_id
    ids = {case.case_id for case in suite.cases()}
    if not (run_dir / ROWS_CSV).is_file():
        return len(ids), len(ids), run_dir, 0, 0
    if forget_errors:
        gone = drop_rows(run_dir, lambda row: _is_error(row) and row["case_id"] in ids)
        print(f"pending: {len(gone)} error row(s) removed from {run_dir}: the next call runs them again",
              file=sys.stderr)
    done = finished_case_ids(run_dir) & ids
    # a torn row (a killed write) is no finished case: --resume drops it and runs its case, so it is pending
    # a row that took an earlier run's figures (same_schedule: reuse) sent nothing to the device
    measured = {row["case_id"]: _is_error(row) for row in read_rows_csv(run_dir / ROWS_CSV, strict=False)
                if row["case_id"] in done and row.get("executor") != PREDICTED and row.get("status") != "infeasible"
                and not took_earlier_run(row)}
    return len(ids - done), len(ids), run_dir, len(measured), sum(measured.values())


def _is_error(row) -> bool:
    return row.get("status") == "error" and not is_interrupt_row(row)


def main(argv: list[str]) -> int:
    forget = argv[:1] == ["--forget-errors"]
    args = argv[1:] if forget else argv
    if len(args) not in (2, 3) or any(a.startswith("-") for a in args):
        print("usage: pending.py [--forget-errors] SUITE.yaml RUN_ID [RESULTS_ROOT]", file=sys.stderr)
        return 2
    print(*pending(*args, forget_errors=forget))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
