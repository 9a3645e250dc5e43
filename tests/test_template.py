"""The strategy-writer's path, end to end: ``templates/planner`` installed into a fresh venv.

Marked ``venv`` (about 30 s; ``pytest -m "not venv"`` skips it). No network: the fresh
virtual environment (``--system-site-packages``) also sees this interpreter's site-packages
through a ``.pth`` file, so numpy, numba, torch, pytest and setuptools come from here; the
core (a copy of ``pyproject.toml``, ``README.md`` and ``harness/``) and the template are
installed into it with ``pip install --no-deps --no-build-isolation --no-index`` (the
template editable, ``-e``, as its README says). The template is first made a user's own by
the README's steps 1 and 2 ("To make it yours": every name of it replaced by ``my-strategy``'s).
Then its own tests (the conformance kit) run in that venv, and ``membudget list --kind
planner`` there shows the renamed planner, registered through its entry point.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "templates" / "planner"
IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".hypothesis")


def _run(*cmd, env, cwd) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _venv(where: Path) -> tuple[Path, Path]:
    """A fresh venv that also sees this interpreter's packages; its python and bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(where)],
                   check=True, timeout=120)
    bin_dir = where / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / ("python.exe" if os.name == "nt" else "python")
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    ours = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    # plain paths, not site.addsitedir: the .pth files there (editable installs of this
    # checkout and of the bundled plugins) stay out, so only what this venv installs loads
    (Path(purelib) / "_outer_site.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
    return python, bin_dir


RENAMES = {"largest_first": "my_strategy", "largest-first": "my-strategy", "LargestFirst": "MyStrategy"}


def make_it_yours(plugin: Path) -> None:
    """templates/planner/README.md, "To make it yours", steps 1 and 2: rename the package folder and
    the test, and replace each of the template's names in every file."""
    (plugin / "membudget_largest_first").rename(plugin / "membudget_my_strategy")
    (plugin / "tests" / "test_largest_first.py").rename(plugin / "tests" / "test_my_strategy.py")
    for path in plugin.rglob("*"):
        if path.is_file():
            text = path.read_text()
            for old, new in RENAMES.items():
                text = text.replace(old, new)
            path.write_text(text)


@pytest.mark.venv
@pytest.mark.slow
def test_template_installs_registers_and_passes_the_kit_in_a_fresh_venv(tmp_path: Path) -> None:
    python, bin_dir = _venv(tmp_path / "venv")
    core, plugin = tmp_path / "core", tmp_path / "planner"
    shutil.copytree(ROOT / "harness", core / "harness", ignore=IGNORE)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, core / name)
    shutil.copytree(TEMPLATE, plugin, ignore=IGNORE)
    make_it_yours(plugin)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MEMBUDGET_PLUGINS", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # only the template's entry point: the bundled plugins' metadata is visible from the outer
    # site-packages, but their code (editable installs) is not
    env["MEMBUDGET_PLUGINS"] = "my-strategy"
    install = (python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index")
    _run(*install, core, env=env, cwd=tmp_path)
    _run(*install, "-e", plugin, env=env, cwd=tmp_path)

    where = _run(python, "-c", "import harness, membudget_my_strategy as m; print(harness.__file__, m.__file__)",
                 env=env, cwd=tmp_path).stdout.split()
    assert Path(where[0]).is_relative_to(tmp_path / "venv"), where  # installed, not this checkout
    assert Path(where[1]).is_relative_to(plugin), where  # editable: the user's folder

    listed = json.loads(_run(bin_dir / "membudget", "list", "--kind", "planner", "--json", env=env,
                             cwd=tmp_path).stdout)
    mine = [e for e in listed if e["name"] == "my-strategy"]
    assert mine and mine[0]["plugin"] == "membudget-my-strategy", listed

    tests = _run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", plugin / "tests", env=env, cwd=plugin)
    assert " passed" in tests.stdout and "failed" not in tests.stdout, tests.stdout
