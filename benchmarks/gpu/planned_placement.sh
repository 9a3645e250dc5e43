#!/usr/bin/env bash
# Planned placement on a real GPU (issue #18), in one call on the GPU machine (docs/gpu.md):
#   bash benchmarks/gpu/planned_placement.sh
# builds the offline gpu-suite environment, runs the planned path's GPU tests, then
# benchmarks/gpu/planned_placement.py: rows.csv and summary.json under $OUT (written after
# every run), arena vs the caching allocator's reserved bytes printed for each schedule.
# The logs go to $OUT too (tox.txt, planned-tests.txt, planned.txt); their tails are printed.
# Each step has a time limit, so the whole stays under the device tool's 600 s per call.
set -uo pipefail
out=${OUT:-/tmp/planned-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
command -v tox >/dev/null || python -m pip install -q tox >/dev/null 2>&1 || true
if ! tox -e gpu-suite -q -- --help >"$out/tox.txt" 2>&1; then
    tail -30 "$out/tox.txt"
    exit 1
fi
py=.tox/gpu-suite/bin/python
timeout -s INT 180 $py -m pytest -q -s -p no:cacheprovider tests/test_torch_executor_gpu.py -k planned \
    >"$out/planned-tests.txt" 2>&1
tail -15 "$out/planned-tests.txt"
timeout -s INT 300 $py benchmarks/gpu/planned_placement.py "$out" >"$out/planned.txt" 2>&1
tail -20 "$out/planned.txt"
