"""benchmarks/gpu/env.sh rehearsed on the CPU: the Python every GPU script runs membudget with.

The GPU machine has no network. Its tox built the gpu-suite environment in the 2026-11-22 run,
but a machine without tox, or with a tox older than tox.ini's ``requires`` (which tox would then
try to download), must not cost the session: the script then installs the checkout and the
bundled plugins into the machine's own python3, offline. Stand-ins for tox and python3 record
what they are asked; nothing is installed.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

# python3 of the GPU machine: `-m pip install tox` fails (no network), any other pip call is
# logged and succeeds (but one from the carried wheels under NO_WHEELS: a package missing with no wheel
# for it), everything else runs on this Python
PYTHON3 = """\
    #!/usr/bin/env bash
    if [[ $1 == -m && $2 == pip ]]; then
        if [[ " $* " == *" tox "* ]]; then echo "ERROR: No matching distribution found for tox" >&2; exit 1; fi
        if [[ " $* " == *" --find-links "* && -n ${NO_WHEELS:-} ]]; then
            echo "ERROR: No matching distribution found for pydantic" >&2; exit 1
        fi
        echo "$*" >>"$PIP_CALLS"
        exit 0
    fi
    exec 'PYTHON' "$@"
"""
FAILING_TOX = """\
    #!/usr/bin/env bash
    echo "tox: provisioning tox>=4 needs the network" >&2
    exit 1
"""


def _machine(tmp_path: Path, tox: bool) -> tuple[Path, dict[str, str]]:
    """A checkout with env.sh and tox.ini, and a PATH whose python3 is the stand-in (and whose tox,
    when ``tox``, fails as an old tox would offline)."""
    work = tmp_path / "checkout"
    (work / "benchmarks" / "gpu").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "gpu" / "env.sh", work / "benchmarks" / "gpu" / "env.sh")
    shutil.copy(ROOT / "tox.ini", work / "tox.ini")
    shutil.copy(ROOT / "benchmarks" / "gpu" / "wheels.txt", work / "benchmarks" / "gpu" / "wheels.txt")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(textwrap.dedent(PYTHON3).replace("PYTHON", sys.executable))
    if tox:
        (bin_dir / "tox").write_text(textwrap.dedent(FAILING_TOX))
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_ENV_CHECK", "GPU_PYTHON")}
    env.update(PATH=os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"]), PIP_CALLS=str(tmp_path / "pip-calls"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               CUDA_VISIBLE_DEVICES="")
    return work, env


def _env_sh(work: Path, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "benchmarks/gpu/env.sh", "env.txt"], cwd=work, env={**env, **extra},
                          capture_output=True, text=True, timeout=120)


def _tox_plugins() -> list[str]:
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tox.ini")
    return [line.strip()[len("-e "):].strip() for line in config["base"]["plugins"].splitlines() if line.strip()]


@pytest.mark.parametrize("tox", [True, False], ids=["tox-fails", "no-tox"])
def test_without_a_working_tox_the_machines_python3_gets_the_checkout_and_every_plugin_offline(tmp_path, tox):
    if not tox and shutil.which("tox", path="/usr/bin:/bin"):
        pytest.skip("a tox in /usr/bin or /bin: the PATH cannot leave it out")
    work, env = _machine(tmp_path, tox)
    done = _env_sh(work, env, GPU_ENV_CHECK="0")
    log = (work / "env.txt").read_text()
    assert done.returncode == 0, done.stderr + log
    assert done.stdout.strip() == str(tmp_path / "bin" / "python3")  # the one line the scripts read
    assert ("tox -e gpu-suite failed" if tox else "no tox on this machine") in log
    plugins = _tox_plugins()
    assert len(plugins) >= 10 and f"has the checkout and {len(plugins)} plugins" in log
    wheels, pip = (tmp_path / "pip-calls").read_text().splitlines()
    assert wheels == WHEELS
    editable = " ".join(f"-e {p}" for p in ["."] + plugins)  # tox.ini's order: a plugin after what it builds on
    assert pip == f"-m pip install -q --no-deps --no-build-isolation --no-index {editable}"


def test_a_python3_whose_torch_sees_no_gpu_is_refused_with_the_reason(tmp_path):
    pytest.importorskip("torch")
    work, env = _machine(tmp_path, tox=True)
    done = _env_sh(work, env)
    log = (work / "env.txt").read_text()
    assert done.returncode == 1 and done.stdout == ""
    assert "torch sees no CUDA GPU" in log and "cannot run the GPU suite" in log
    assert not (tmp_path / "pip-calls").exists()  # nothing installed into a Python that cannot use it


WHEELS = "-m pip install -q --no-index --find-links benchmarks/gpu/wheels -r benchmarks/gpu/wheels.txt"


def test_without_a_package_or_its_wheel_the_log_names_the_script_that_downloads_them(tmp_path):
    """The 2026-11-28 H200 image had no pydantic: every job failed at `import harness`. env.sh installs
    what wheels.txt lists from the carried wheels (pip takes only what is missing), before the
    checkout; where a package is missing and no wheel came, the log says how to bring it."""
    work, env = _machine(tmp_path, tox=True)
    done = _env_sh(work, env, GPU_ENV_CHECK="0", NO_WHEELS="1")
    log = (work / "env.txt").read_text()
    assert done.returncode == 1 and done.stdout == ""
    assert "run benchmarks/gpu/wheels.sh here, then carry benchmarks/gpu/wheels" in log
    assert not (tmp_path / "pip-calls").exists()  # the checkout is not installed into a Python that cannot import it


def _requirement_names(lines) -> set[str]:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return {canonicalize_name(Requirement(line).name) for line in (raw.split("#")[0].strip() for raw in lines) if line}


def test_every_dependency_is_on_the_gpu_image_or_among_the_carried_wheels():
    """A dependency added to the core or a bundled plugin that the GPU image lacks would fail every job
    of a GPU session at its first import (as pydantic did): it must be listed in wheels.txt."""
    import tomllib

    gpu = ROOT / "benchmarks" / "gpu"
    image = _requirement_names((gpu / "image-packages.txt").read_text().splitlines())
    carried = _requirement_names((gpu / "wheels.txt").read_text().splitlines())
    assert "pydantic" in carried and "torch" in image and "numba" in image
    needed = set()
    for path in [ROOT / "pyproject.toml", *sorted((ROOT / "plugins").glob("*/pyproject.toml"))]:
        needed |= _requirement_names(tomllib.loads(path.read_text())["project"].get("dependencies", []))
    needed = {n for n in needed if not n.startswith("membudget")}
    assert needed and needed <= image | carried, sorted(needed - image - carried)
