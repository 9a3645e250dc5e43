#!/usr/bin/env bash
# The CUDA tests of a GPU call, once per run of a GPU suite: benchmarks/gpu/session.sh runs them
# beside its first job, benchmarks/gpu/slice.sh (alone) in the slice that starts a run.
#   GPU_PYTHON=PYTHON bash benchmarks/gpu/cuda_tests.sh LOG
# The executor's and the profilers' CUDA tests (not the planned path's: the planned job's rows carry
# their checks), stopped at the first failure, within CUDA_TESTS_SECONDS (default 120), output to
# LOG. The script becomes GNU timeout (exec), so a caller that ran it in the background can stop
# it with SIGINT (pytest then writes its summary): bash's background jobs ignore SIGINT, timeout
# does not, and passes it on. The exit status is pytest's (124: the time ran out).
set -uo pipefail
log=${1:?usage: cuda_tests.sh LOG}
exec timeout -s INT -k 10 "${CUDA_TESTS_SECONDS:-120}" "${GPU_PYTHON:-python3}" -m pytest -q -p no:cacheprovider \
    -x tests/test_torch_executor_gpu.py tests/test_profilers.py -k "(cuda or gpu) and not planned" >"$log" 2>&1
