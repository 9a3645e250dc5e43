"""benchmarks/gpu/warm_kernels.py, which a GPU call runs beside its first job to fill Numba's cache:
it plans, simulates and places the toy chain with every registered planner and allocator and
none of them fails there (a planner whose kernels it never reached would compile on the call's
clock again)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.plugins import registry

ROOT = Path(__file__).resolve().parents[1]


def test_every_planner_and_allocator_is_warmed_without_a_failure():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "warm_kernels.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "failed" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    reg = registry()
    for kind in ("planner", "allocator"):
        warmed = {line.split()[2] for line in lines if line.startswith(f"warm: {kind} ")}
        assert warmed == set(reg.names(kind)), (kind, warmed)
    assert lines[-1].startswith("warm: ") and lines[-1].endswith(" s in all")
