"""benchmarks/gpu/session.sh rehearsed on the CPU: the one line every call of a GPU session runs.

Three calls on a checkout with CPU suites and stand-ins for tox and the planned-placement
script, the jobs in session.sh's own order: the first call runs the planned job within its cap,
then is cut by its deadline inside the first suite job; the second starts from nothing but the
first call's ``results.tgz`` (as the next call's fresh working tree would), finishes that job,
then two parts that share one run folder; the third finds every job done. Checked: what comes
back under $OUT (at most 8 plain files), that the archive alone resumes the work, that no case
runs twice, the CUDA tests only in the call that starts the first suite job's run (beside the
planned job, the suite waiting for them), and one summary per run folder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path


from tests.test_gpu_slice import SUITE, checkout, pytestmark  # noqa: F401 (pytestmark: slow, bash)

PART = """
    name: cpu-parts
    profiler: analytic
    device: V100-PCIe
    models: [{{model: builtin:tiny-cnn, batch_sizes: [{batch}], input_size: [3, 16, 16]}}]
    budgets: {{fractions: [0.5]}}
    planners: [keep-all]
    executors: [torch, simulate]
"""
# the planned job's script: writes its folder's summary.json, complete, and its log
PLANNED = """\
    #!/usr/bin/env bash
    mkdir -p "$PLANNED_DIR" "$OUT"
    echo "$PLANNED_SECONDS $GPU_PYTHON" >"$PLANNED_DIR/called"
    echo '{"complete": true, "rows": [{"planner": "keep-all", "status": "ok"}]}' >"$PLANNED_DIR/summary.json"
    echo "keep-all  arena 1.00 GiB" | tee "$OUT/planned.txt"
"""
JOBS = "planned:results/gpu-planned/r1 suite:a.yaml:r1 suite:p1.yaml:r1 suite:p2.yaml:r1"  # session.sh's order


def _checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    work, env = checkout(tmp_path, ("session.sh", "slice.sh", "summary.py", "pending.py", "warm_kernels.py"),
                         {"a.yaml": SUITE.replace("cpu-slice", "cpu-a"), "p1.yaml": PART.format(batch=4),
                          "p2.yaml": PART.format(batch=8)})
    (work / "benchmarks" / "gpu" / "planned_placement.sh").write_text(textwrap.dedent(PLANNED))
    # no Numba warm-up beside the jobs (it would take a CPU from these timed calls) but where a test asks
    return work, {**env, "SESSION_JOBS": JOBS, "SESSION_WARM": "0"}


def _call(work: Path, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess:
    shutil.rmtree(env["OUT"], ignore_errors=True)  # the device tool empties $OUT before each command
    done = subprocess.run(["bash", "benchmarks/gpu/session.sh"], cwd=work, env={**env, **extra},
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(p.name for p in Path(env["OUT"]).iterdir())
    assert len(files) <= 8 and all(p.is_file() for p in Path(env["OUT"]).iterdir()), files
    return done


def _archive(env: dict[str, str]) -> list[str]:
    with tarfile.open(Path(env["OUT"]) / "results.tgz") as tgz:
        return tgz.getnames()


def _logs(env: dict[str, str]) -> dict[str, str]:
    with tarfile.open(Path(env["OUT"]) / "logs.tgz") as tgz:
        return {m.name: tgz.extractfile(m).read().decode() for m in tgz.getmembers() if m.isfile()}


def _case_ids(run_dir: Path) -> list[str]:
    return [line.split(",")[1] for line in (run_dir / "rows.csv").read_text().splitlines()[1:]]


def test_every_call_of_a_session_runs_one_line_and_takes_up_where_the_last_one_stopped(tmp_path):
    work, env = _checkout(tmp_path)
    out = Path(env["OUT"])
    run_a, parts = work / "results" / "cpu-a" / "r1", work / "results" / "cpu-parts" / "r1"

    # 1: the planned job within its cap, then the deadline cuts the first suite job; nothing after it
    # starts; both come back packed (240 s: 210 s for the jobs, and a job starts with 150 s or more
    # left after the CUDA tests, which ended 24 s into the call on a loaded CI machine: 60 s to spare;
    # 36 s a case: the suite's 180 s or less cannot run all six)
    first = _call(work, env, SESSION_SECONDS="240", SLICE_TEST_CASE_SLEEP="36", SESSION_PLANNED_SECONDS="100")
    assert sorted(p.name for p in out.iterdir()) == ["logs.tgz", "results.tgz", "session.txt", "summary.md"]
    assert (work / "results" / "gpu-planned" / "r1" / "called").read_text().split()[0] == "100"  # the cap
    assert "suite:a.yaml:r1: 6 of 6 cases to run" in first.stdout
    assert "cases left for the next call" in first.stdout, first.stdout
    assert not (work / "results" / "cpu-parts").exists()
    assert {n.split("/")[1] for n in _archive(env)} == {"cpu-a", "gpu-planned"}
    assert "results/cpu-a/r1/rows.csv" in _archive(env) and "results/gpu-planned/r1/summary.json" in _archive(env)
    logs = _logs(env)  # the CUDA tests ran beside the first job (the checkout has no tests: pytest says so)
    assert "test_torch_executor_gpu.py" in logs["./0-tests/cuda-tests.txt"], logs.keys()
    assert all("CUDA tests not run" in v for k, v in logs.items() if k.endswith("cuda-tests.txt") and "0-tests" not in k)
    assert "CUDA tests: " in first.stdout  # the suite waited for them
    assert "- PASS: no errors" in (out / "summary.md").read_text()
    assert "## Planned placement" in (out / "summary.md").read_text()
    done = len(_case_ids(run_a))
    assert 0 < done < 6 and json.loads((run_a / "meta.json").read_text())["status"] == "interrupted"

    # 2: a fresh tree with only what came back: the job resumes, the others run after it
    shutil.rmtree(work / "results")
    with tarfile.open(out / "results.tgz") as tgz:
        tgz.extractall(work, filter="data")
    second = _call(work, env)
    assert "planned:results/gpu-planned/r1: done" in second.stdout
    assert f"suite:a.yaml:r1: {6 - done} of 6 cases to run" in second.stdout, second.stdout
    ids = _case_ids(run_a)
    assert len(ids) == len(set(ids)) == 6
    assert (work / "results" / "gpu-planned" / "r1" / "called").read_text().split()[1] == \
        ".tox/gpu-suite/bin/python"  # the session's environment, built once
    assert len(_case_ids(parts)) == 4 and json.loads((parts / "meta.json").read_text())["status"] == "complete"
    names = _archive(env)
    for folder in ("results/cpu-a/r1", "results/cpu-parts/r1"):
        assert f"{folder}/rows.csv" in names, (folder, names)
    cuda_logs = [v for k, v in _logs(env).items() if k.endswith("cuda-tests.txt")]  # a's run had them: not again
    assert len(cuda_logs) == 3 and all("CUDA tests not run" in v for v in cuda_logs)  # a's slice, the parts' two
    summary = (out / "summary.md").read_text()
    assert summary.count("- PASS: no errors") == 2  # one per run folder: cpu-a, cpu-parts (not one per part)

    # 3: every job done: nothing runs, nothing to pack
    third = _call(work, env)
    assert third.stdout.count(": done (") == 4, third.stdout
    assert not (out / "results.tgz").exists()
    assert len(_case_ids(run_a)) == 6 and len(_case_ids(parts)) == 4
    assert (tmp_path / "tox-calls").read_text().count("tox") == 3  # once per call, by the session


def test_a_job_that_finishes_no_case_in_a_whole_call_is_skipped_by_the_calls_after_it(tmp_path):
    work, env = _checkout(tmp_path)
    env["SESSION_JOBS"] = "suite:a.yaml suite:a.yaml:r1"  # the first word has no run id: refused, not run
    run_a = work / "results" / "cpu-a" / "r1"

    # every case sleeps longer than the suite's share of the call: nothing finishes (the call leaves 230 s
    # for its jobs, so that a loaded machine's slow start, 24 s on CI, still leaves the 150 s a job needs)
    first = _call(work, env, SESSION_SECONDS="260", SESSION_STALL_SECONDS="60", SLICE_TEST_CASE_SLEEP="300")
    assert "suite:a.yaml: not a job (suite:SUITE.yaml:RUN_ID)" in first.stdout
    assert "suite:a.yaml:r1: no case finished in this call: later calls skip it" in first.stdout, first.stdout
    assert "no case finished in" in (run_a / "no-progress").read_text()
    assert "results/cpu-a/r1/no-progress" in _archive(env)  # the mark travels with the run folder

    second = _call(work, env, SESSION_SECONDS="240")  # (a job is looked at only with 150 s left)
    assert "suite:a.yaml:r1: skipped: no case finished in" in second.stdout, second.stdout
    assert "cases to run" not in second.stdout
    assert not (run_a / "rows.csv").exists() or _case_ids(run_a) == []  # no case ran, in either call


def test_a_job_whose_gpu_cases_all_fail_ends_the_call_and_its_errors_can_be_run_again(tmp_path):
    """An error row counts as finished, so a fault common to the GPU cases (the 2026-11-28 call's
    gradient check on CUDA) would make every later job "done" with errors: the call stops at the
    first job whose measured cases are all errors, and pending.py --forget-errors (on the
    development machine, after the fix) makes the next call run them again."""
    work, env = _checkout(tmp_path)
    env["SESSION_JOBS"] = "suite:a.yaml:r1 suite:p1.yaml:r1"
    run_a = work / "results" / "cpu-a" / "r1"

    first = _call(work, env, SESSION_SECONDS="240", SLICE_TEST_CASE_SLEEP="0", SLICE_TEST_TORCH_FAULT="1",
                  SESSION_WARM="1")
    warm = next(v for k, v in _logs(env).items() if k.endswith("0-env/warm.txt"))
    assert warm.startswith("warm: planner ") or warm == "", warm  # started beside the jobs (killed at the end)
    # (keep-all at half the span is infeasible: planned by nobody, it never reaches the GPU)
    assert "suite:a.yaml:r1: every case this call measured on the GPU (2) is an error row" in first.stdout, \
        first.stdout
    assert not (work / "results" / "cpu-parts").exists()  # the job after it never started
    assert "results/cpu-a/r1/rows.csv" in _archive(env)  # what it found comes back
    rows = (run_a / "rows.csv").read_text().splitlines()[1:]
    faulty = [r for r in rows if "stand-in for a fault" in r]
    assert len(rows) == 6 and len(faulty) == 2 and all(r.split(",")[1].endswith("/torch") for r in faulty)

    pending = [sys.executable, "benchmarks/gpu/pending.py"]
    counted = subprocess.run([*pending, "a.yaml", "r1"], cwd=work, env=env, capture_output=True, text=True)
    assert counted.stdout.split() == ["0", "6", "results/cpu-a/r1", "2", "2"], counted
    forgot = subprocess.run([*pending, "--forget-errors", "a.yaml", "r1"], cwd=work, env=env, capture_output=True,
                            text=True)
    assert "2 error row(s) removed" in forgot.stderr and forgot.stdout.split()[:2] == ["2", "6"], forgot
    second = _call(work, env, SESSION_SECONDS="240")
    assert "suite:a.yaml:r1: 2 of 6 cases to run" in second.stdout, second.stdout
    rows = (run_a / "rows.csv").read_text().splitlines()[1:]
    assert len(_case_ids(run_a)) == 6 and not any(",error," in r for r in rows), rows
