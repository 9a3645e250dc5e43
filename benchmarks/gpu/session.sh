#!/usr/bin/env bash
# A GPU session's work, the same line for every call (docs/gpu.md, "The next GPU session"):
#   SESSION_SECONDS=540 bash benchmarks/gpu/session.sh
# goes through the GPU jobs in order, each taken up where an earlier call left it, until
# SESSION_SECONDS (default 540) have passed since the start. Set it below the call's own limit:
# the device tool stops a command at 600 s, or sooner when less device time is left (a
# session's last call), so SESSION_SECONDS = min(540, budget_left_s - 60 - the machine's start) on a
# fresh machine, budget_left_s - 40 on the warm machine of a session's second call.
#   planned:results/gpu-planned/published-2      issue #18 (benchmarks/gpu/planned_placement.sh),
#                                                at most SESSION_PLANNED_SECONDS (180) of the call
#   suite:suites/gpu-smoke.yaml:published-3      issues #16 and #17 (benchmarks/gpu/slice.sh)
#   suite:suites/gpu/part1-resnet50.yaml:published, then parts 2-4: the full GPU table
# SESSION_JOBS replaces the list (the same words, separated by spaces). A suite job is done when
# its run folder holds every case (benchmarks/gpu/pending.py), the planned job when its
# summary.json says complete. A job the deadline cuts ends the call, unless it had
# SESSION_STALL_SECONDS (400) or more and finished no case: then it is marked (no-progress in its
# run folder) and later calls skip it, so that a case that hangs cannot hold up the jobs after it
# (delete the file to try again).
# A job that fails early (an error, not the deadline) is logged and the next one starts.
#
# Under $OUT (the device tool brings back at most 8 files), packed again after every job:
#   results.tgz  every run folder a job of this call wrote, paths from the repository root:
#                `tar xzf results.tgz` there before the next call, which resumes from it
#   summary.md   each suite's benchmarks/gpu/summary.py report and the planned job's table
#   logs.tgz     every job's logs (tox, CUDA tests, the run) and summary.json
#   session.txt  what this call did, job by job (also printed), and the GPU it ran on
# The planned job goes first, capped, so that a session's first call (of two at most: docs/gpu.md) brings
# evidence for all three issues. The CUDA tests (benchmarks/gpu/cuda_tests.sh) run once, in the call
# that starts the first suite job's run, beside the first job (the suites wait for them); the planned
# path's GPU tests are not run (the planned job's rows carry their checks).
# Beside the jobs, benchmarks/gpu/warm_kernels.py fills Numba's cache (its log: logs.tgz, 0-env/warm.txt).
# A suite job whose slice measured only error rows on the GPU ends the call (benchmarks/gpu/pending.py says
# how to run them again after a fix).
set -uo pipefail
out=${OUT:-/tmp/session-out}
deadline=$((SECONDS + ${SESSION_SECONDS:-540} - 30))  # 30 s kept to pack what came out
stall_after=${SESSION_STALL_SECONDS:-400}  # a job given this long that finishes no case is marked
planned_cap=${SESSION_PLANNED_SECONDS:-180}
jobs=${SESSION_JOBS:-"planned:results/gpu-planned/published-2 suite:suites/gpu-smoke.yaml:published-3
    suite:suites/gpu/part1-resnet50.yaml:published suite:suites/gpu/part2-vgg16.yaml:published
    suite:suites/gpu/part3-densenet121.yaml:published suite:suites/gpu/part4-vit_b_16.yaml:published"}
mkdir -p "$out"
work=$(mktemp -d)
log="$out/session.txt"
: >"$log"
export PYTHONUNBUFFERED=1
say() { echo "session [${SECONDS} s]: $*" | tee -a "$log"; }  # the seconds since the call started
touched=()

pack() {  # what came out so far, under $OUT: after every job, so a call stopped short keeps it
    local -A last=()  # run folder -> the job folder of its latest summary (parts share one run)
    local d p
    : >"$out/summary.md"
    for d in $(printf '%s\n' "$work"/*/ | sort -V); do  # in job order: a later part's summary wins
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
        mapfile -t folders < <(printf '%s\n' "${touched[@]}" | sort -u)
        tar czf "$out/results.tgz.part" "${folders[@]}" && mv "$out/results.tgz.part" "$out/results.tgz"
    fi
}
warm_pid= tests_pid=
finish() {
    [[ -n $warm_pid ]] && kill "$warm_pid" 2>/dev/null
    [[ -n $tests_pid ]] && kill -INT "$tests_pid" 2>/dev/null && wait "$tests_pid"  # its log is packed
    pack
    ((${#touched[@]})) && say "packed $(printf '%s\n' "${touched[@]}" | sort -u | tr '\n' ' ')into results.tgz"
    rm -rf "$work"
}
trap finish EXIT

if command -v nvidia-smi >/dev/null; then
    say "GPU: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | head -1)"
fi
mkdir -p "$work/0-env"
if ! py=$(bash benchmarks/gpu/env.sh "$work/0-env/env.txt"); then
    tail -30 "$work/0-env/env.txt" | tee -a "$log"
    say "no Python could run the GPU suite (benchmarks/gpu/env.sh): no job ran"
    exit 1
fi
say "python: $py"
export GPU_PYTHON=$py  # env.sh gives it to slice.sh and planned_placement.sh instead of building again
# the planners' Numba kernels compiled into Numba's cache while the GPU runs the first job, so that the
# suites' runner loads them instead of compiling on the call's clock (about a minute on a 2-core machine)
if [[ ${SESSION_WARM:-1} != 0 ]]; then
    timeout -k 5 300 "$py" benchmarks/gpu/warm_kernels.py >"$work/0-env/warm.txt" 2>&1 &
    warm_pid=$!
fi

# The CUDA tests: once, in the call that starts the first unfinished suite job's run (where slice.sh
# would run them, in that job's first slice), but beside the first job rather than on the suite's
# clock (about a minute on an H200): the suite jobs wait for them. They share the GPU with the
# planned job, whose memory figures are its processes' own (its times, planned and caching, are
# measured beside them: docs/gpu.md). SESSION_TESTS=0 leaves them out.
for job in $jobs; do
    [[ ${SESSION_TESTS:-1} == 0 ]] && break
    IFS=: read -r kind path run <<<"$job"
    [[ $kind == suite && -n $path && -n $run ]] || continue
    read -r todo total run_dir _ < <($py benchmarks/gpu/pending.py "$path" "$run" 2>/dev/null) || continue
    ((todo == 0)) && continue
    [[ -f $run_dir/no-progress ]] && continue  # the loop below skips it, as it passes over an unreadable one
    if [[ ! -s $run_dir/rows.csv ]]; then
        mkdir -p "$work/0-tests"
        GPU_PYTHON=$py bash benchmarks/gpu/cuda_tests.sh "$work/0-tests/cuda-tests.txt" &
        tests_pid=$!
        say "CUDA tests started beside the jobs ($path starts its run in this call)"
    fi
    break
done

n=0
for job in $jobs; do
    n=$((n + 1))
    left=$((deadline - SECONDS))
    if ((left < 150)); then  # under that a slice cannot profile a model and run a case
        say "$left s left: $job and the jobs after it wait for the next call"
        break
    fi
    IFS=: read -r kind path run <<<"$job"
    job_out="$work/$n-$kind-$(basename "${path%.yaml}")"
    mkdir -p "$job_out"
    case $kind in
    suite)
        if [[ -z $path || -z $run ]]; then
            say "$job: not a job (suite:SUITE.yaml:RUN_ID)"
            continue
        fi
        if ! read -r todo total run_dir measured errors < <($py benchmarks/gpu/pending.py "$path" "$run" 2>"$job_out/pending.txt"); then
            say "$job: cannot read the suite: $(tail -1 "$job_out/pending.txt")"
            continue
        fi
        if ((todo == 0)); then
            say "$job: done ($total cases in $run_dir)"
            continue
        fi
        if [[ -f $run_dir/no-progress ]]; then
            say "$job: skipped: $(cat "$run_dir/no-progress") (delete $run_dir/no-progress to try again)"
            continue
        fi
        before=$todo measured_before=$measured errors_before=$errors
        if [[ -n $tests_pid ]]; then  # the suite runs alone on the GPU: its times are the table's
            wait "$tests_pid"
            say "CUDA tests: $(tail -1 "$work/0-tests/cuda-tests.txt")"
            tests_pid=
            left=$((deadline - SECONDS))
            if ((left < 150)); then
                say "$left s left after the CUDA tests: $job and the jobs after it wait for the next call"
                break
            fi
        fi
        left=$((deadline - SECONDS))
        started_with=$left
        say "$job: $todo of $total cases to run, $left s left"
        OUT="$job_out" SLICE_SECONDS=$left SLICE_TESTS=0 \
            bash benchmarks/gpu/slice.sh "$path" "$run" 2>&1 | tee -a "$log"
        [[ -d $run_dir ]] && touched+=("$run_dir")
        echo "$run_dir" >"$job_out/run"
        rm -f "$job_out"/*.tgz  # the run folder goes into results.tgz
        if ! read -r todo total run_dir measured errors < <($py benchmarks/gpu/pending.py "$path" "$run" 2>>"$job_out/pending.txt"); then
            say "$job: cannot count its cases after the slice: next job"
            pack
            continue
        fi
        ran=$((measured - measured_before))
        if ((ran >= 2 && errors - errors_before == ran)); then  # (one error may be that case's own)
            # an error counts as finished (--resume would not run it again): a fault common to the
            # cases (a CUDA path, a profile) would otherwise make every later job "done" with errors
            say "$job: every case this call measured on the GPU ($ran) is an error row (see logs.tgz and" \
                "$run_dir/rows.csv): the call stops here, before the jobs after it meet the same fault;" \
                "after the fix, python benchmarks/gpu/pending.py --forget-errors $path $run"
            pack
            break
        fi
        if ((todo > 0)); then
            left=$((deadline - SECONDS))
            if ((left >= 150)); then
                say "$job: stopped with $todo of $total cases left and $left s to go (see logs.tgz): next job"
            elif ((started_with >= stall_after && todo == before)); then
                echo "no case finished in $started_with s ($todo of $total left)" >"$run_dir/no-progress"
                say "$job: no case finished in this call: later calls skip it ($run_dir/no-progress)"
                pack
                continue
            else
                say "$job: $todo of $total cases left for the next call"
                break
            fi
        fi
        pack
        ;;
    planned)
        if [[ -s $path/summary.json ]] && $py -c "import json, sys; sys.exit(not json.load(open('$path/summary.json')).get('complete'))" 2>/dev/null; then
            say "$job: done ($path/summary.json)"
            continue
        fi
        left=$((deadline - SECONDS))
        give=$((left < planned_cap ? left : planned_cap))
        say "$job: $give of $left s left"
        # its GPU tests would profile and run what the script then runs again, and the script's rows
        # carry their checks (problems: planned_run_problems): the cap goes to the script
        OUT="$job_out" PLANNED_DIR="$path" PLANNED_SECONDS=$give PLANNED_TESTS=${PLANNED_TESTS:-0} \
            bash benchmarks/gpu/planned_placement.sh 2>&1 | tee -a "$log"
        [[ -d $path ]] && touched+=("$path")
        pack
        ;;
    *)
        say "$job: not a job (suite:SUITE.yaml:RUN_ID or planned:FOLDER)"
        ;;
    esac
done
say "this call took $SECONDS s"
