"""benchmarks/gpu/planned_placement.py's bookkeeping on the CPU (the runs themselves need CUDA):
a second call on the same folder keeps the rows that finished and runs only the others (an error
once more, not forever), and ``summary.json`` says ``complete`` only once every schedule has a
finished row."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tests.test_suite_support import gpu_script

planned = gpu_script("planned_placement")


def _args(out: Path, model: str = "torchvision:resnet50") -> argparse.Namespace:
    return argparse.Namespace(out=out, model=model, batch=32, allocator="bestfit", device_name="H100",
                              torch_version="2.11")


def test_a_second_call_runs_only_the_schedules_without_a_finished_row(tmp_path):
    args = _args(tmp_path / "planned")
    assert planned.resume(args) == ([], list(planned.PLANNERS), {})  # nothing yet: everything to run
    rows = [{"planner": "dynprog", "status": "error", "message": "cudaMalloc failed", "attempts": 1},
            {"planner": "keep-all", "status": "ok", "arena_bytes": 1, "attempts": 1}]
    planned.write(args, rows)
    summary = json.loads((args.out / "summary.json").read_text())
    assert summary["complete"] is False
    assert [r["planner"] for r in summary["rows"]] == ["keep-all", "dynprog"]  # in PLANNERS order
    assert (args.out / "rows.csv").read_text().splitlines()[0].startswith("planner,status,")

    kept, todo, attempts = planned.resume(args)
    assert [r["planner"] for r in kept] == ["keep-all"] and todo == ["greedy", "dynprog"]  # the error runs again
    assert attempts == {"dynprog": 1}  # the next row of dynprog is its second attempt
    assert planned.verdict(kept) == 0 and planned.verdict([{"planner": "keep-all", "status": "oom"}]) == 1

    # another model in the same folder: nothing of the earlier call is kept
    assert planned.resume(_args(args.out, model="torchvision:vgg16")) == ([], list(planned.PLANNERS), {})

    # greedy has its result; dynprog failed a second time: kept as it is, the folder is complete
    planned.write(args, kept + [{"planner": "greedy", "status": "infeasible", "attempts": 1},
                                {"planner": "dynprog", "status": "error", "attempts": 2}])
    assert json.loads((args.out / "summary.json").read_text())["complete"] is True
    assert planned.resume(args)[1] == []


def test_a_torn_summary_from_an_older_call_runs_everything_again(tmp_path):
    args = _args(tmp_path / "planned")
    args.out.mkdir()
    (args.out / "summary.json").write_text('{"model": "torchvision:resnet50", "rows": [{"plan')
    assert planned.resume(args) == ([], list(planned.PLANNERS), {})
    planned.write(args, [{"planner": "keep-all", "status": "ok"}])  # and the next write replaces it whole
    assert json.loads((args.out / "summary.json").read_text())["rows"][0]["status"] == "ok"
    assert sorted(p.name for p in args.out.iterdir()) == ["rows.csv", "summary.json"]  # no temporary left


def test_a_folder_measured_on_another_gpu_is_not_resumed(tmp_path):
    """Sessions are lent an H100 or an H200 by chance: the rows of one are not completed on the other."""
    import pytest

    args = _args(tmp_path / "planned")
    planned.write(args, [{"planner": "keep-all", "status": "ok", "attempts": 1}])
    other = _args(args.out)
    other.device_name = "H200"
    with pytest.raises(SystemExit, match="measured on the GPU 'H100', this machine's is 'H200'"):
        planned.resume(other)
    assert [r["planner"] for r in planned.resume(args)[0]] == ["keep-all"]
