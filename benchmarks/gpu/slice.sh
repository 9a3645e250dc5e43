#!/usr/bin/env bash
# One GPU slice, end to end, on the GPU machine (docs/gpu.md, "The GPU suite in slices"):
#   bash benchmarks/gpu/slice.sh suites/gpu-smoke.yaml [RUN_ID]
# runs the CUDA tests, the suite (resuming RUN_ID, default "published"), prints a summary
# (benchmarks/gpu/summary.py: the checks of issue #16 and each planner's measured throughput
# against keep-all) and packs the run folder into $OUT/<suite>.tgz for the session to commit.
#
# The device tool kills a command after 600 s and then nothing under $OUT comes back, so the
# suite is interrupted (SIGINT: finished cases are on disk, the run says "interrupted") once
# SLICE_SECONDS (default 540) have passed since the start, leaving time to summarise and pack.
# Unpack the .tgz under results/ and run the same line again: --resume skips the finished cases.
set -uo pipefail
suite=${1:?usage: slice.sh SUITE.yaml [RUN_ID]}
run_id=${2:-published}
out=${OUT:-/tmp/slice-out}
deadline=$((SECONDS + ${SLICE_SECONDS:-540} - 30))  # 30 s kept for the summary and the archive
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python -m pip install -q tox >/dev/null 2>&1 || true
# builds the offline environment and installs the checkout into it (commands_pre), runs nothing
tox -e gpu-suite -q -- --help >/dev/null || exit 1
py=.tox/gpu-suite/bin/python
name=$($py -c "from harness.suite import load_suite; print(load_suite('$suite').name)") || exit 1
timeout -s INT 120 $py -m pytest -q -p no:cacheprovider -x tests/test_torch_executor_gpu.py \
    tests/test_profilers.py -k "(cuda or gpu) and not planned" 2>&1 | tail -3 | tee "$out/cuda-tests.txt"
left=$((deadline - SECONDS))
echo "slice: $left s for the suite"
timeout -s INT -k 20 "$left" $py -m harness.cli run "$suite" -o results --run-id "$run_id" --resume --no-progress \
    2>&1 | tail -40
$py benchmarks/gpu/summary.py "results/$name/$run_id" "$out"
tar czf "$out/$name.tgz" "results/$name/$run_id"
