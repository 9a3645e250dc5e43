"""benchmarks/gpu/env.sh rehearsed on the CPU: the Python every GPU script runs membudget with.

The GPU machine has no network. Its tox built the gpu-suite environment in the 2026-11-22 run,
but a machine without tox, or with a tox older than tox.ini's ``requires`` (which tox would then
try to download), must not cost the session: the script then installs the checkout and the
bundled plugins into the machine's own python3, offline. Stand-ins for tox and python3 record
what they are asked; nothing is installed.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
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


def _machine(tmp_path: Path, tox: bool, python: Path | None = None) -> tuple[Path, dict[str, str]]:
    """A checkout with env.sh, tox.ini and the projects, and a PATH whose python3 is the stand-in, running
    ``python`` (default: this one) for all but pip (and whose tox, when ``tox``, fails as an old tox would
    offline)."""
    work = tmp_path / "checkout"
    (work / "benchmarks" / "gpu").mkdir(parents=True)
    for name in ("env.sh", "link_checkout.py", "wheels.txt"):
        shutil.copy(ROOT / "benchmarks" / "gpu" / name, work / "benchmarks" / "gpu" / name)
    for name in ("tox.ini", "pyproject.toml"):
        shutil.copy(ROOT / name, work / name)
    for name in ("harness", "plugins"):
        (work / name).symlink_to(ROOT / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(textwrap.dedent(PYTHON3).replace("PYTHON", str(python or sys.executable)))
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
    try:  # the stand-in python3 runs this Python: without membudget installed, the link would write into it
        importlib.metadata.distribution("membudget")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("this Python has no membudget distribution: the link would not be refused")
    work, env = _machine(tmp_path, tox)
    done = _env_sh(work, env, GPU_ENV_CHECK="0")
    log = (work / "env.txt").read_text()
    assert done.returncode == 0, done.stderr + log
    assert done.stdout.strip() == str(tmp_path / "bin" / "python3")  # the one line the scripts read
    assert ("tox -e gpu-suite failed" if tox else "no tox on this machine") in log
    # this Python has membudget already (pip installed it for the tests): linking would offer every plugin
    # twice, so the link is refused and pip installs the checkout
    assert "already has membudget" in log and "the link did not take" in log
    plugins = _tox_plugins()
    assert len(plugins) >= 10 and f"has the checkout and {len(plugins)} plugins" in log
    wheels, pip = (tmp_path / "pip-calls").read_text().splitlines()
    assert wheels == WHEELS
    editable = " ".join(f"-e {p}" for p in ["."] + plugins)  # tox.ini's order: a plugin after what it builds on
    assert pip == f"-m pip install -q --no-deps --no-build-isolation --no-index {editable}"


def _bare_python(tmp_path: Path) -> Path:
    """A virtual environment standing in for the GPU machine's python3: every package this one has
    (numpy, pandas, torch...) but no membudget and no plugin."""
    venv, deps = tmp_path / "machine-python", tmp_path / "machine-packages"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True, capture_output=True)
    deps.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if not entry.name.startswith(("membudget", "__editable__", "harness", "__pycache__")) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "machine-packages.pth").write_text(f"{deps}\n")
    return python


def test_a_fresh_python3_gets_the_checkout_and_every_plugin_linked_without_a_build(tmp_path):
    """pip's editable installs of the core and the ten plugins took about 50 s of the H200 session's one
    call (46 s here): env.sh links them instead (benchmarks/gpu/link_checkout.py), and the machine's
    Python then runs membudget from the checkout, from any folder, with every plugin registered."""
    import tomllib

    python = _bare_python(tmp_path)
    work, env = _machine(tmp_path, tox=False, python=python)
    env.pop("PYTHONPATH")  # only the link may make the checkout importable
    if shutil.which("tox", path="/usr/bin:/bin"):
        pytest.skip("a tox in /usr/bin or /bin: the PATH cannot leave it out")
    done = _env_sh(work, env, GPU_ENV_CHECK="0")
    log = (work / "env.txt").read_text()
    assert done.returncode == 0, done.stderr + log
    assert f"has the checkout and {len(_tox_plugins())} plugins, linked" in log
    assert (tmp_path / "pip-calls").read_text().splitlines() == [WHEELS]  # no editable build
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([python, "-c", "import harness, membudget_hybrid; print(harness.__file__); "
                            "print(membudget_hybrid.__file__)"], cwd=elsewhere, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr
    core, plugin = where.stdout.split()
    assert Path(core).resolve() == ROOT / "harness" / "__init__.py"
    assert Path(plugin).resolve() == ROOT / "plugins" / "hybrid" / "membudget_hybrid" / "__init__.py"
    listed = subprocess.run([python.parent / "membudget", "list"], cwd=elsewhere, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    for folder in _tox_plugins():
        name = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]["name"]
        assert name in listed.stdout, f"{name} registers nothing after the link"
    assert "warning" not in listed.stderr  # no plugin offered twice, none failed


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


def test_the_gpu_suite_environment_docs_gpu_md_quotes_is_tox_inis():
    """docs/gpu.md quotes tox.ini's ``[testenv:gpu-suite]`` for whoever runs it by hand; the quote lost
    the line that installs the carried wheels once. Its settings, comments aside, must be tox.ini's."""
    doc = (ROOT / "docs" / "gpu.md").read_text()
    start = doc.index("[testenv:gpu-suite]")
    quoted = doc[start:doc.index("```", start)].splitlines()
    ini = (ROOT / "tox.ini").read_text()
    start = ini.index("[testenv:gpu-suite]")
    end = ini.find("\n[", start + 1)
    section = ini[start:end if end > 0 else None].splitlines()

    def settings(lines):
        return [ln.rstrip() for ln in lines
                if ln.strip() and not ln.lstrip().startswith("#") and not ln.startswith("description")]

    assert settings(quoted) == settings(section)
