#!/usr/bin/env bash
# Planned placement on a real GPU (issue #18), in one call on the GPU machine (docs/gpu.md):
#   bash benchmarks/gpu/planned_placement.sh
# builds the offline gpu-suite environment, runs the planned path's GPU tests, then
# benchmarks/gpu/planned_placement.py: rows.csv and summary.json under $OUT, arena vs the
# caching allocator's reserved bytes printed for each schedule.
set -uo pipefail
out=${OUT:-/tmp/planned-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python -m pip install -q tox >/dev/null 2>&1 || true
tox -e gpu-suite --notest -q || exit 1
.tox/gpu-suite/bin/python -m pytest -q -s -p no:cacheprovider tests/test_torch_executor_gpu.py -k planned 2>&1 | tail -15 | tee "$out/planned-tests.txt"
.tox/gpu-suite/bin/python benchmarks/gpu/planned_placement.py "$out" 2>&1 | tail -20 | tee "$out/planned.txt"
