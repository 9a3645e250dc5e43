#!/usr/bin/env bash
# A GPU session's work, the same line for every call (docs/gpu.md, "The next GPU session"):
#   bash benchmarks/gpu/session.sh
# goes through the GPU jobs in order, each taken up where an earlier call left it, until
# SESSION_SECONDS (default 540) have passed since the start:
#   suite:suites/gpu-smoke.yaml:published-2      issues #16 and #17 (benchmarks/gpu/slice.sh)
#   planned:results/gpu-planned/published        issue #18 (benchmarks/gpu/planned_placement.sh)
#   suite:suites/gpu/part1-resnet50.yaml:published, then parts 2-4: the full GPU table
# SESSION_JOBS replaces the list (the same words, separated by spaces). A suite job is done when
# its run folder holds every case (benchmarks/gpu/pending.py), the planned job when its
# summary.json says complete; a job the deadline cuts ends the call, one that fails early
# (an error, not the deadline) is logged and the next one starts.
#
# Under $OUT (the device tool brings back at most 8 files):
#   results.tgz  every run folder a job of this call wrote, paths from the repository root:
#                `tar xzf results.tgz` there before the next call, which resumes from it
#   summary.md   each suite job's benchmarks/gpu/summary.py report and the planned job's table
#   logs.tgz     every job's logs (tox, CUDA tests, the run) and summary.json
#   session.txt  what this call did, job by job (also printed)
# The CUDA tests run once, in the slice that starts the first job's run; the planned path's
# GPU tests in the call that starts its folder.
set -uo pipefail
out=${OUT:-/tmp/session-out}
deadline=$((SECONDS + ${SESSION_SECONDS:-540} - 30))  # 30 s kept to pack what came out
jobs=${SESSION_JOBS:-"suite:suites/gpu-smoke.yaml:published-2 planned:results/gpu-planned/published
    suite:suites/gpu/part1-resnet50.yaml:published suite:suites/gpu/part2-vgg16.yaml:published
    suite:suites/gpu/part3-densenet121.yaml:published suite:suites/gpu/part4-vit_b_16.yaml:published"}
mkdir -p "$out"
work=$(mktemp -d)
log="$out/session.txt"
: >"$log"
export PYTHONUNBUFFERED=1
say() { echo "session: $*" | tee -a "$log"; }
touched=()

pack() {
    local -A last=()  # run folder -> the job folder of its latest summary (parts share one run)
    local d
    : >"$out/summary.md"
    for d in $(ls -d "$work"/*/ | sort -V); do
        [[ -f $d/summary.md && -f $d/run ]] && last[$(cat "$d/run")]=$d
    done
    for d in $(printf '%s\n' "${last[@]}" | sort -V); do
        { cat "$d/summary.md"; echo; } >>"$out/summary.md"
    done
    for p in "$work"/*/planned.txt; do
        [[ -f $p ]] && { echo "## Planned placement ($(basename "$(dirname "$p")"))"; echo; echo '```';
                         tail -20 "$p"; echo '```'; } >>"$out/summary.md"
    done
    tar czf "$out/logs.tgz" -C "$work" .
    if ((${#touched[@]})); then
        tar czf "$out/results.tgz" $(printf '%s\n' "${touched[@]}" | sort -u)
        say "packed $(printf '%s\n' "${touched[@]}" | sort -u | tr '\n' ' ')into results.tgz"
    fi
    rm -rf "$work"
}
trap pack EXIT

command -v tox >/dev/null || python -m pip install -q tox >/dev/null 2>&1 || true
mkdir -p "$work/0-env"
if ! tox -e gpu-suite -q -- --help >"$work/0-env/tox.txt" 2>&1; then
    tail -30 "$work/0-env/tox.txt" | tee -a "$log"
    say "the gpu-suite environment did not build: no job ran"
    exit 1
fi
py=.tox/gpu-suite/bin/python

n=0
for job in $jobs; do
    n=$((n + 1))
    left=$((deadline - SECONDS))
    if ((left < 90)); then
        say "$left s left: $job and the jobs after it wait for the next call"
        break
    fi
    IFS=: read -r kind path run <<<"$job"
    job_out="$work/$n-$kind-$(basename "${path%.yaml}")"
    mkdir -p "$job_out"
    case $kind in
    suite)
        read -r todo total run_dir < <($py benchmarks/gpu/pending.py "$path" "$run") || {
            say "$job: cannot read the suite (see logs.tgz)"; continue; }
        if ((todo == 0)); then
            say "$job: done ($total cases in $run_dir)"
            continue
        fi
        say "$job: $todo of $total cases to run, $left s left"
        tests=0
        ((n == 1)) && tests=${SLICE_TESTS:-}
        OUT="$job_out" SLICE_SECONDS=$left SLICE_TOX=0 SLICE_TESTS=$tests \
            bash benchmarks/gpu/slice.sh "$path" "$run" 2>&1 | tee -a "$log"
        [[ -d $run_dir ]] && touched+=("$run_dir")
        echo "$run_dir" >"$job_out/run"
        rm -f "$job_out"/*.tgz  # the run folder goes into results.tgz
        read -r todo total run_dir < <($py benchmarks/gpu/pending.py "$path" "$run")
        if ((todo > 0)); then
            left=$((deadline - SECONDS))
            if ((left < 90)); then
                say "$job: $todo of $total cases left for the next call"
                break
            fi
            say "$job: stopped with $todo of $total cases left and $left s to go (see logs.tgz): next job"
        fi
        ;;
    planned)
        if [[ -s $path/summary.json ]] && $py -c "import json, sys; sys.exit(not json.load(open('$path/summary.json')).get('complete'))"; then
            say "$job: done ($path/summary.json)"
            continue
        fi
        say "$job: $left s left"
        OUT="$job_out" PLANNED_DIR="$path" PLANNED_SECONDS=$left PLANNED_TOX=0 \
            bash benchmarks/gpu/planned_placement.sh 2>&1 | tee -a "$log"
        [[ -d $path ]] && touched+=("$path")
        ;;
    *)
        say "$job: not a job (suite:SUITE.yaml:RUN_ID or planned:FOLDER)"
        ;;
    esac
done
say "this call took $SECONDS s"
