"""How many cases of a suite a run folder still lacks (benchmarks/gpu/session.sh asks before each job).

    python benchmarks/gpu/pending.py SUITE.yaml RUN_ID [RESULTS_ROOT]

prints ``<pending> <total> <run folder>``: the suite's cases that ``--resume`` would run
(not in the run's ``rows.csv``, or recorded there as an interrupt) and all of them. Nothing
is profiled or run, so asking costs a second where resuming a finished part would build the
harness's tasks first.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.results import finished_case_ids
from harness.suite import load_suite


def pending(suite_path: str, run_id: str, root: str = "results") -> tuple[int, int, Path]:
    """(cases not finished, cases in all, the run folder) of ``suite_path``'s run ``run_id``."""
    suite = load_suite(suite_path)
    run_dir = Path(root) / suite.name / run_id
    done = finished_case_ids(run_dir) if run_dir.is_dir() else set()
    ids = [case.case_id for case in suite.cases()]
    return sum(1 for i in ids if i not in done), len(ids), run_dir


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: pending.py SUITE.yaml RUN_ID [RESULTS_ROOT]", file=sys.stderr)
        return 2
    left, total, run_dir = pending(*argv)
    print(left, total, run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
