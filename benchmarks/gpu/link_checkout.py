"""Make the checkout and its bundled plugins importable by this Python, as an editable install would,
without building anything:

    python benchmarks/gpu/link_checkout.py . plugins/greedy plugins/vdnn ...

``pip install --no-deps --no-build-isolation --no-index -e`` of the core and the ten plugins builds
an editable wheel per project through setuptools: 46 s on this project's 2-core CPU machine, and
about 55 s of ``env.sh`` on a fresh H200 (2026-11-28), out of a session's one ten-minute call. What
an editable install leaves is small, and this script writes just that into the Python's
site-packages, for each project (a folder with a ``pyproject.toml``), in well under a second:

- ``__link__<name>.pth``: the project's folder, put on ``sys.path`` at start-up (setuptools' own
  "compat" editable mode); the packages are imported from the checkout itself;
- ``<name>-<version>.dist-info``: ``METADATA`` (name, version, summary), ``entry_points.txt`` (what
  the registry finds plugins by: ``importlib.metadata``), ``direct_url.json`` (editable, from the
  folder), ``INSTALLER`` and ``RECORD`` (so that ``pip uninstall`` can remove it);
- the ``[project.scripts]`` (``membudget``) in the Python's scripts folder.

It refuses (exit 2, before writing anything) a project whose distribution this Python already has
from elsewhere: two copies would offer every plugin twice. Then ``benchmarks/gpu/env.sh`` installs
with pip, as before. At the end a fresh interpreter must import every project's packages from the
checkout and see every entry point, or it removes what it wrote (by each link's RECORD, written first)
and exits 1; so does any error while it writes. A second call replaces the links of the first.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

INSTALLER = "membudget-link-checkout"


def normalized(name: str) -> str:
    """A distribution name as dist-info folders spell it (PEP 503, with underscores)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def project_of(folder: Path) -> dict:
    """Name, version, summary, entry points, scripts and top-level packages of the project in ``folder``."""
    pyproject = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))
    meta = pyproject["project"]
    packages = pyproject.get("tool", {}).get("setuptools", {}).get("packages")
    if not isinstance(packages, list):  # packages.find: include patterns such as "harness*"
        include = (packages or {}).get("find", {}).get("include", [])
        packages = [p.rstrip("*") for p in include if "." not in p]
    return {"name": meta["name"], "version": meta["version"], "summary": meta.get("description", ""),
            "entry_points": meta.get("entry-points", {}), "scripts": meta.get("scripts", {}),
            "packages": [p for p in packages if "." not in p]}


def elsewhere(project: dict, site: Path) -> str | None:
    """Where this Python already has ``project``'s distribution, when it is not a link of ours in ``site``."""
    try:
        dist = importlib.metadata.distribution(project["name"])
    except importlib.metadata.PackageNotFoundError:
        return None
    if (dist.read_text("INSTALLER") or "").strip() == INSTALLER:
        return None
    return str(getattr(dist, "_path", "?"))


def unlink(project: dict, site: Path) -> None:
    """Remove every link of ``project`` this script made in ``site`` (any version: a version changed since
    would leave two distributions of one name), by its RECORD, which names the .pth and the scripts."""
    stem = normalized(project["name"])
    for info in site.glob(f"{stem}-*.dist-info"):
        installer = info / "INSTALLER"
        if not installer.is_file() or installer.read_text(encoding="utf-8").strip() != INSTALLER:
            continue  # not ours: elsewhere() refused it before anything was written
        record = info / "RECORD"
        for line in record.read_text(encoding="utf-8").splitlines() if record.is_file() else ():
            path = Path(line.split(",")[0])
            (path if path.is_absolute() else site / path).unlink(missing_ok=True)
        (site / f"__link__{stem}.pth").unlink(missing_ok=True)
        shutil.rmtree(info, ignore_errors=True)


def link(folder: Path, project: dict, site: Path, scripts: Path) -> None:
    """Write the ``.pth``, the dist-info and the scripts of one project. Its RECORD
    is written first, naming them all, so that ``unlink`` (and pip) can remove a link cut short."""
    stem = normalized(project["name"])
    info = site / f"{stem}-{project['version']}.dist-info"
    info.mkdir(exist_ok=True)
    pth = site / f"__link__{stem}.pth"
    pth.write_text(f"{folder}\n", encoding="utf-8")
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
                    f"Summary: {project['summary']}\n",
        "INSTALLER": f"{INSTALLER}\n",
        "direct_url.json": json.dumps({"url": folder.as_uri(), "dir_info": {"editable": True}}),
        "entry_points.txt": "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items()) + "\n"
            for group, points in {**project["entry_points"],
                                  **({"console_scripts": project["scripts"]} if project["scripts"] else {})}.items()),
    }
    written = [pth, *(info / name for name in files), *(scripts / name for name in project["scripts"])]
    record = [f"{p.relative_to(site) if p.is_relative_to(site) else p},," for p in written]
    (info / "RECORD").write_text("\n".join([*record, f"{info.name}/RECORD,,"]) + "\n", encoding="utf-8")
    for name, text in files.items():
        (info / name).write_text(text, encoding="utf-8")
    for name, target in project["scripts"].items():
        module, _, function = target.partition(":")
        script = scripts / name
        script.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\n"
                          f"sys.exit({function}())\n", encoding="utf-8")
        script.chmod(0o755)


CHECK = """
import importlib, importlib.metadata as md, json, sys
want = json.loads(sys.argv[1])
for folder, project in want:
    for package in project["packages"]:
        where = importlib.import_module(package).__path__[0]
        if not where.startswith(folder):
            sys.exit(f"{package} imports from {where}, not from {folder}")
    for group, points in project["entry_points"].items():
        found = {e.name for e in md.entry_points(group=group) if e.dist.name == project["name"]}
        if found != set(points):
            sys.exit(f"{project['name']}: entry points {sorted(found)}, not {sorted(points)}")
"""


def main(argv: list[str]) -> int:
    """Link the projects of ``argv`` (folders) into this Python; 0 when a fresh interpreter sees them all."""
    if not argv:
        print("usage: python benchmarks/gpu/link_checkout.py PROJECT_FOLDER ...", file=sys.stderr)
        return 2
    site, scripts = Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["scripts"])
    projects = [(Path(a).resolve(), project_of(Path(a).resolve())) for a in argv]
    there = [f"{p['name']} ({where})" for _, p in projects if (where := elsewhere(p, site))]
    if there:
        print(f"link_checkout: {sys.executable} already has {', '.join(there)}: install with pip instead",
              file=sys.stderr)
        return 2
    try:
        for folder, project in projects:
            unlink(project, site)  # a link of an earlier call, perhaps of another version
            link(folder, project, site, scripts)
        check = subprocess.run([sys.executable, "-c", CHECK, json.dumps([(str(f), p) for f, p in projects])],
                               capture_output=True, text=True, cwd="/")  # not the checkout: only the links work
        why = (check.stderr.strip() or check.stdout.strip() or f"the check exited {check.returncode}"
               if check.returncode else "")
    except Exception as exc:  # an unwritable site-packages, a disk full: pip gets a clean one
        why = f"{type(exc).__name__}: {exc}"
    if why:
        for _, project in projects:  # nothing half-made left for pip to trip over
            unlink(project, site)
        print(f"link_checkout: {why}", file=sys.stderr)
        return 1
    print(f"link_checkout: {len(projects)} projects linked into {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
