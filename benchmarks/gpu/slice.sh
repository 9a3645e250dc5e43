#!/usr/bin/env bash
# One GPU slice, end to end, on the GPU machine (docs/gpu.md, "The GPU suite in slices"):
#   bash benchmarks/gpu/slice.sh suites/gpu-smoke.yaml [RUN_ID]
# runs the CUDA tests, the suite (resuming RUN_ID, default "published"), prints a summary
# (status counts, oom among feasible, reserved against budget, prediction errors, gradient
# checks) and packs the run folder into $OUT/<suite>.tgz for the session to commit.
set -uo pipefail
suite=${1:?usage: slice.sh SUITE.yaml [RUN_ID]}
run_id=${2:-published}
out=${OUT:-/tmp/slice-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python -m pip install -q tox >/dev/null 2>&1 || true
tox -e gpu-suite --notest -q || exit 1
.tox/gpu-suite/bin/python -m pytest -q -p no:cacheprovider -x tests/test_torch_executor_gpu.py \
    tests/test_profilers.py -k "cuda or gpu" 2>&1 | tail -3 | tee "$out/cuda-tests.txt"
tox -e gpu-suite -- "$suite" -o results --run-id "$run_id" --resume --no-progress 2>&1 | tail -40
name=$(.tox/gpu-suite/bin/python -c "from harness.suite import load_suite; print(load_suite('$suite').name)")
.tox/gpu-suite/bin/python - "$name" "$run_id" <<'PY' | tee "$out/summary.txt"
import sys
from harness.results import load_rows
rows = load_rows(f"results/{sys.argv[1]}/{sys.argv[2]}")
real = rows[rows["executor"] == "torch"]
print("status:", real["status"].value_counts().to_dict())
ok = real[real["status"] == "ok"]
print("oom among feasible:", int((real["status"] == "oom").sum()))
over = ok[ok["max_memory_reserved"] > ok["budget_bytes"]]
print("ok rows reserving more than the budget:", len(over))
err = ok["prediction_error"].abs()
print(f"|prediction_error| median {err.median():.3f} max {err.max():.3f}")
print(f"grad_error max {ok['grad_error'].max():.2e}")
for (model, budget), cell in ok.groupby(["model", "budget_label"]):
    ideal = cell["ideal_s"].iloc[0]
    print(model, budget, ", ".join(f"{p} {ideal / t:.2f}" for p, t in zip(cell["planner_label"], cell["makespan_s"])))
PY
tar czf "$out/$name.tgz" "results/$name/$run_id"
