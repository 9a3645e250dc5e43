"""Make a tox environment see the packages of the machine's own Python (the GPU suite's set-up).

``tox -e gpu-suite`` runs offline against the torch, torchvision, numba... already installed
on a GPU machine. ``sitepackages = true`` is not enough when that Python is itself a
virtual environment (as on machines where torch lives in ``/opt/.../.venv``): virtualenv
then links the base interpreter's site-packages, not the venv's. This script finds the
first ``python3`` on PATH outside the tox environment that imports torch and writes its
site-packages into a ``.pth`` file of the tox environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

PROBE = "import json, site, torch; print(json.dumps(site.getsitepackages()))"


def outer_site_packages() -> list[str] | None:
    own = Path(sys.prefix).resolve()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which("python3", path=folder) if folder else None
        if not candidate or own in Path(candidate).resolve().parents or Path(folder).resolve().parent == own:
            continue
        probe = subprocess.run([candidate, "-c", PROBE], capture_output=True, text=True)
        if probe.returncode == 0:
            return json.loads(probe.stdout)
    return None


def main() -> int:
    found = outer_site_packages()
    if found is None:
        print("gpu-suite: no python3 on PATH outside the tox environment imports torch", file=sys.stderr)
        return 1
    pth = Path(sysconfig.get_paths()["purelib"]) / "_membudget_machine_site.pth"
    pth.write_text("\n".join(found) + "\n")
    print(f"gpu-suite: the environment sees {', '.join(found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
