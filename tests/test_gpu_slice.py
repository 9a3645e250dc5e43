"""benchmarks/gpu/slice.sh rehearsed on the CPU, so that a GPU session never finds it broken: a
stand-in ``tox`` whose gpu-suite Python is this one, a CPU suite, twice (the second resumes).

What the device tool takes back is checked: at most 8 files under $OUT, plain names, the run
folder packed with paths from the repository root; and that the resumed slice runs no case
twice and skips the CUDA tests (they ran in the slice that started the run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                       reason="needs bash and GNU timeout"),
]

ROOT = Path(__file__).resolve().parents[1]
SUITE = """
    name: cpu-slice
    profiler: analytic
    device: V100-PCIe
    models: [{model: builtin:tiny-cnn, batch_sizes: [4], input_size: [3, 16, 16]}]
    budgets: {fractions: [0.5], bytes: [1GiB]}
    planners: [keep-all, greedy]
    executors: [torch, simulate]
    excludes: [{budget: 1GiB, planner: [greedy]}]
"""


def _slice(work: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "benchmarks/gpu/slice.sh", "cpu.yaml", "r1"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_slice_packs_its_run_and_the_next_one_resumes_it(tmp_path):
    work = tmp_path / "checkout"
    (work / "benchmarks" / "gpu").mkdir(parents=True)
    for name in ("slice.sh", "summary.py"):
        shutil.copy(ROOT / "benchmarks" / "gpu" / name, work / "benchmarks" / "gpu" / name)
    (work / "cpu.yaml").write_text(textwrap.dedent(SUITE))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tox = bin_dir / "tox"  # tox -e gpu-suite: an environment whose python is this one
    tox.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env bash
        mkdir -p .tox/gpu-suite/bin
        printf '#!/usr/bin/env bash\\nexec %s "$@"\\n' '{sys.executable}' > .tox/gpu-suite/bin/python
        chmod +x .tox/gpu-suite/bin/python
    """))
    tox.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OUT": str(out),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}

    first = _slice(work, env)
    assert first.returncode == 0, first.stdout + first.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == ["cpu-slice.tgz", "cuda-tests.txt", "run.txt", "summary.json", "summary.md", "tox.txt"]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files) and len(files) <= 8
    assert "CUDA tests not run" not in (out / "cuda-tests.txt").read_text()  # the slice that starts the run
    with tarfile.open(out / "cpu-slice.tgz") as tgz:
        names = tgz.getnames()
    assert "results/cpu-slice/r1/rows.csv" in names and all(n.startswith("results/cpu-slice/r1") for n in names)
    assert "- PASS: no errors" in first.stdout  # the summary's checks are printed
    run_dir = work / "results" / "cpu-slice" / "r1"
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["sessions"][-1]["cases_run"] == 6

    second = _slice(work, env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "CUDA tests not run" in (out / "cuda-tests.txt").read_text()
    meta = json.loads((run_dir / "meta.json").read_text())
    assert [s["cases_run"] for s in meta["sessions"]] == [6, 0]
    ids = [line.split(",")[1] for line in (run_dir / "rows.csv").read_text().splitlines()[1:]]
    assert len(ids) == len(set(ids)) == 6
