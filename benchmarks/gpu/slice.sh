#!/usr/bin/env bash
# One GPU slice, end to end, on the GPU machine (docs/gpu.md, "The GPU suite in slices"):
#   bash benchmarks/gpu/slice.sh suites/gpu-smoke.yaml [RUN_ID]
# runs the CUDA tests, the suite (resuming RUN_ID, default "published"), packs the run folder
# into $OUT/<suite>.tgz for the session to commit and writes a summary beside it
# (benchmarks/gpu/summary.py: the checks of issue #16 and each planner's measured throughput
# against keep-all). Under $OUT: env.txt, cuda-tests.txt, run.txt (the logs), <suite>.tgz,
# summary.md, summary.json. Printed: the tails of the logs and the summary's checks.
#
# The device tool kills a command after 600 s (or sooner, when the session's device time runs
# out), and what is then under $OUT comes back, but the rows on the machine's disk do not: so the
# suite is interrupted (SIGINT: finished cases are on disk, the run says "interrupted") once
# SLICE_SECONDS (default 540) have passed since the start, leaving time to pack and summarise.
# Unpack the .tgz at the repository root (its paths start with results/) and run the same line
# again: --resume skips the finished cases. The CUDA tests (benchmarks/gpu/cuda_tests.sh) run once
# per run: a slice that resumes a run skips them (SLICE_TESTS=1 runs them anyway, SLICE_TESTS=0
# never; session.sh gives 0 and runs them itself, beside its first job).
set -uo pipefail
suite=${1:?usage: slice.sh SUITE.yaml [RUN_ID]}
run_id=${2:-published}
out=${OUT:-/tmp/slice-out}
deadline=$((SECONDS + ${SLICE_SECONDS:-540} - 30))  # 30 s kept for the archive and the summary
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# the offline Python (benchmarks/gpu/env.sh; GPU_PYTHON when benchmarks/gpu/session.sh has just made it)
py=$(bash benchmarks/gpu/env.sh "$out/env.txt") || { tail -30 "$out/env.txt"; exit 1; }
name=$($py -c "from harness.suite import load_suite; print(load_suite('$suite').name)") || exit 1
run_dir="results/$name/$run_id"
tests=${SLICE_TESTS:-}
[[ -z $tests ]] && { [[ -s $run_dir/rows.csv ]] && tests=0 || tests=1; }
if [[ $tests == 1 ]]; then
    GPU_PYTHON=$py bash benchmarks/gpu/cuda_tests.sh "$out/cuda-tests.txt"
    tail -3 "$out/cuda-tests.txt"
elif [[ ${SLICE_TESTS:-} == 0 ]]; then
    echo "slice: CUDA tests not run (SLICE_TESTS=0: benchmarks/gpu/session.sh runs them beside its first job)" \
        | tee "$out/cuda-tests.txt"
else
    echo "slice: CUDA tests not run: $run_dir was started by an earlier slice (SLICE_TESTS=1 runs them)" \
        | tee "$out/cuda-tests.txt"
fi
left=$((deadline - SECONDS))
if ((left < 60)); then  # (timeout 0 would mean no limit at all)
    echo "slice: $left s left before the deadline: the suite does not start"
else
    echo "slice: $left s for the suite"
    timeout -s INT -k 20 "$left" $py -m harness.cli run "$suite" -o results --run-id "$run_id" --resume \
        --no-progress >"$out/run.txt" 2>&1
    tail -15 "$out/run.txt"
fi
if [[ -d $run_dir ]]; then
    tar czf "$out/$name.tgz" "$run_dir"
    $py benchmarks/gpu/summary.py "$run_dir" "$out" >/dev/null && sed '/^###/,$d' "$out/summary.md"
fi
