"""What a result was produced with: versions, git commit, machine, device, plugins.

Recorded in every run's ``meta.json`` so that a published table says where it came from.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

_PACKAGES = ("membudget", "numpy", "numba", "pandas", "pydantic", "pluggy", "torch", "torchvision",
             "pyarrow", "ray", "ortools")


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that shape results (None: not installed)."""
    out: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state(where: Path | None = None) -> dict[str, Any]:
    """The commit checked out where the harness lives, and whether its code has uncommitted changes.

    Changes under ``results/`` do not count: they are what a run writes (``tox -e publish``
    rewrites them while it runs), not the code that computed them.
    """
    where = where or Path(__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
    return {"commit": commit, "dirty": bool(status)}


def cuda_device() -> str | None:
    """The name of CUDA device 0, or None (no torch, or no GPU)."""
    try:
        import torch
    except ImportError:
        return None
    try:
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # a broken driver must not lose the run
        return None


def plugin_list() -> list[dict[str, str]]:
    """Every registered object with the plugin (distribution) and version that brought it."""
    from harness.plugins import registry

    return [
        {"kind": e.kind, "name": e.name, "plugin": e.plugin, "version": e.version}
        for e in registry().entries()
    ]


def environment() -> dict[str, Any]:
    """The environment block of ``meta.json``."""
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "packages": package_versions(),
        "git": git_state(),
        "cuda_device": cuda_device(),
        "plugins": plugin_list(),
    }
