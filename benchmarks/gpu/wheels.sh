#!/usr/bin/env bash
# Wheels the GPU machine's image lacks (benchmarks/gpu/wheels.txt), downloaded here (that machine has
# no network) for its Python 3.12:
#   bash benchmarks/gpu/wheels.sh
# then name benchmarks/gpu/wheels in the device tool's `carry`; env.sh installs from it only what
# the machine's python3 is missing.
set -euo pipefail
dest=benchmarks/gpu/wheels
mkdir -p "$dest"
python3 -m pip download -q --only-binary=:all: --implementation cp --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$dest" -r benchmarks/gpu/wheels.txt
ls "$dest"
