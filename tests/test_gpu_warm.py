"""benchmarks/gpu/warm_kernels.py, which a GPU call runs beside its first job to fill Numba's cache:
it plans, simulates and places the toy chain with every registered planner and allocator and
none of them fails there (the exact allocator, whose OR-Tools the GPU image lacks, is skipped) (a planner whose kernels it never reached would compile on the call's
clock again)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# the script run as on the GPU machine's image, which has no OR-Tools (results/gpu-smoke/published-2/meta.json:
# "ortools": null): a None in sys.modules makes every import of it fail
AS_ON_THE_GPU_IMAGE = ("import runpy, sys; sys.modules['ortools'] = None; sys.argv = [sys.argv[1]]; "
                       "runpy.run_path(sys.argv[0], run_name='__main__')")


def test_every_planner_and_allocator_is_warmed_without_a_failure():
    done = subprocess.run([sys.executable, "-c", AS_ON_THE_GPU_IMAGE, str(ROOT / "benchmarks" / "gpu" / "warm_kernels.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "failed" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    # the allocator that needs the missing package says so, and is the only one not warmed
    assert "warm: allocator exact skipped: the exact allocator needs OR-Tools: pip install 'membudget[exact]'" \
        in lines, done.stdout
    # what a fresh process registers, as the script's does (this one may hold the tests' own plugins)
    names = subprocess.run([sys.executable, "-c", "from harness.plugins import registry; r = registry(); "
                            "print(' '.join(r.names('planner'))); print(' '.join(r.names('allocator')))"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    for kind, registered in zip(("planner", "allocator"), names):
        warmed = {line.split()[2] for line in lines if line.startswith(f"warm: {kind} ")}
        assert warmed == set(registered.split()) and warmed, (kind, warmed, registered)
    assert lines[-1].startswith("warm: ") and lines[-1].endswith(" s in all")
