#!/usr/bin/env bash
# Planned placement on a real GPU (issue #18), on the GPU machine (docs/gpu.md):
#   bash benchmarks/gpu/planned_placement.sh
# builds the offline gpu-suite environment, runs the planned path's GPU tests, then
# benchmarks/gpu/planned_placement.py: rows.csv and summary.json under PLANNED_DIR (default $OUT;
# benchmarks/gpu/session.sh: results/gpu-planned/published-2), written after every run; a second
# call on the same folder runs only the schedules without a row. Arena vs the caching
# allocator's reserved bytes is printed for each schedule. The logs go to $OUT (env.txt,
# planned-tests.txt, planned.txt); their tails are printed. Everything ends within
# PLANNED_SECONDS (default 540) of the start, inside the device tool's 600 s per call. The GPU
# tests run in the call that starts the folder (PLANNED_TESTS=1 always, 0 never). The offline Python is
# benchmarks/gpu/env.sh's, or GPU_PYTHON when the caller has just made it.
set -uo pipefail
out=${OUT:-/tmp/planned-out}
dest=${PLANNED_DIR:-$out}
deadline=$((SECONDS + ${PLANNED_SECONDS:-540} - 10))
mkdir -p "$out" "$dest"
export PYTHONUNBUFFERED=1
py=$(bash benchmarks/gpu/env.sh "$out/env.txt") || { tail -30 "$out/env.txt"; exit 1; }
tests=${PLANNED_TESTS:-}
[[ -z $tests ]] && { [[ -s $dest/summary.json ]] && tests=0 || tests=1; }
left=$((deadline - SECONDS - 120))  # the tests leave at least two minutes to the runs
if [[ $tests == 1 ]] && ((left > 30)); then
    timeout -s INT -k 10 $((left < 180 ? left : 180)) $py -m pytest -q -s -p no:cacheprovider \
        tests/test_torch_executor_gpu.py -k planned >"$out/planned-tests.txt" 2>&1
    tail -15 "$out/planned-tests.txt"
elif [[ ${PLANNED_TESTS:-} == 0 ]]; then
    echo "planned: GPU tests not run (PLANNED_TESTS=0: the rows' problems column carries their checks)" \
        | tee "$out/planned-tests.txt"
else
    echo "planned: GPU tests not run (run in the call that started $dest, or too little time)" \
        | tee "$out/planned-tests.txt"
fi
left=$((deadline - SECONDS))
if ((left < 30)); then
    echo "planned: $left s left before the deadline: the runs do not start"
    exit 0
fi
timeout -s INT -k 10 "$left" $py benchmarks/gpu/planned_placement.py "$dest" >"$out/planned.txt" 2>&1
status=$?
tail -20 "$out/planned.txt"
exit $status
