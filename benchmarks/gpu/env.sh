#!/usr/bin/env bash
# The offline Python of the GPU scripts (session.sh, slice.sh, planned_placement.sh):
#   py=$(bash benchmarks/gpu/env.sh LOG) || exit 1
# prints the Python to run membudget with on the GPU machine, its build's output in LOG.
#   1. tox -e gpu-suite (tox.ini: the machine's torch linked in, the checkout and the bundled
#      plugins installed with no network): .tox/gpu-suite/bin/python.
#   2. When that cannot be had (no tox on the machine and none to install offline, a tox older than
#      tox.ini's `requires`, a failed build): the machine's own python3 (the first on PATH; on the
#      GPU image the one that holds PyTorch: the device tool's KINDS.md),
#      gets the checkout and the plugins of tox.ini's [base] list, in its order, linked as editable
#      installs are (benchmarks/gpu/link_checkout.py, under a second), or, where the link is refused
#      (that Python has one of them already), by pip's editable installs (--no-deps
#      --no-build-isolation --no-index, about 50 s), and is printed. The machine is lent for the
#      session, so its Python is ours to install into.
# Exits 1 (LOG says why) when neither gives a Python whose torch sees a CUDA GPU;
# GPU_ENV_CHECK=0 leaves that check out (the CPU rehearsals in tests/). GPU_PYTHON, when set, is
# printed as it is: the Python a caller (session.sh) has just made this way.
set -uo pipefail
log=${1:-/dev/null}
: >"$log"
if [[ -n ${GPU_PYTHON:-} ]]; then
    echo "gpu env: $GPU_PYTHON, made by the caller (GPU_PYTHON)" >>"$log"
    echo "$GPU_PYTHON"
    exit 0
fi
cuda_check="import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'torch sees no CUDA GPU')"

# offline (the lent GPU machines), pip's five retries with backoff would cost seconds of device time
command -v tox >/dev/null || timeout 20 python3 -m pip install -q --retries 0 --timeout 5 tox >/dev/null 2>&1 || true
if command -v tox >/dev/null; then
    if tox -e gpu-suite -q -- --help >>"$log" 2>&1; then
        echo .tox/gpu-suite/bin/python
        exit 0
    fi
    echo "gpu env: tox -e gpu-suite failed (above): installing into the machine's python3 instead" >>"$log"
else
    echo "gpu env: no tox on this machine: installing into the machine's python3" >>"$log"
fi
py=$(command -v python3) || { echo "gpu env: no python3 on PATH" >>"$log"; exit 1; }
if [[ ${GPU_ENV_CHECK:-1} != 0 ]] && ! "$py" -c "$cuda_check" >>"$log" 2>&1; then
    echo "gpu env: $py cannot run the GPU suite (above)" >>"$log"
    exit 1
fi
# The machine's image lacks some of the core's dependencies (benchmarks/gpu/wheels.txt: pydantic,
# seen 2026-11-28): wheels that benchmarks/gpu/wheels.sh downloaded on the CPU machine travel with
# the call (carry it); pip installs from them only what is missing, and nothing when all is there.
if ! PIP_NO_INDEX=1 "$py" -m pip install -q --no-index --find-links benchmarks/gpu/wheels \
        -r benchmarks/gpu/wheels.txt >>"$log" 2>&1; then
    echo "gpu env: $py lacks a package of benchmarks/gpu/wheels.txt and benchmarks/gpu/wheels has no wheel for it: run benchmarks/gpu/wheels.sh here, then carry benchmarks/gpu/wheels" >>"$log"
    exit 1
fi
mapfile -t plugins < <("$py" -c "import configparser; c = configparser.ConfigParser(interpolation=None); \
c.read('tox.ini'); print(c['base']['plugins'])" 2>>"$log" | sed 's/^ *-e *//; /^ *$/d')
if ((${#plugins[@]} == 0)); then
    echo "gpu env: tox.ini lists no plugins under [base]" >>"$log"
    exit 1
fi
# Linked (benchmarks/gpu/link_checkout.py: a .pth and a dist-info per project, under a second) rather than
# built by pip's editable installs (about 50 s of a session's one call); pip when the link is refused
if "$py" benchmarks/gpu/link_checkout.py . "${plugins[@]}" >>"$log" 2>&1; then
    echo "gpu env: $py has the checkout and ${#plugins[@]} plugins, linked" >>"$log"
    echo "$py"
    exit 0
fi
echo "gpu env: the link did not take (refused or failed, above): pip installs the checkout instead" >>"$log"
editable=(-e .)
for p in "${plugins[@]}"; do editable+=(-e "$p"); done
if ! PIP_NO_INDEX=1 "$py" -m pip install -q --no-deps --no-build-isolation --no-index "${editable[@]}" >>"$log" 2>&1; then
    echo "gpu env: pip could not install the checkout into $py (above)" >>"$log"
    exit 1
fi
echo "gpu env: $py has the checkout and ${#plugins[@]} plugins" >>"$log"
echo "$py"
