"""The stack is one-way (docs/architecture.md, "The stack"; issue #15 item 4).

- Every module of ``harness`` and of the bundled plugins' packages imports alone, in a
  fresh interpreter: none leans on another having been imported first.
- The import graph of ``harness`` has no cycle, counting every import statement wherever
  it is (a function-level import is a dependency too, only a later one). Package-parent
  edges are not counted: importing ``harness.a.b`` runs ``harness/a/__init__.py`` first,
  which is no dependency of ``b`` on ``a``'s contents. A plugin loaded by name (the
  registry's ``BUILTINS``, entry points, ``harness.lazy.Lazy``) is no import statement:
  that is the inversion the stack is built on.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIRS = sorted(p.parent for p in ROOT.glob("plugins/*/membudget_*/__init__.py"))
# the optional extras (pyproject.toml): a module that needs one may fail to import without it
OPTIONAL = {"torch", "torchvision", "transformers", "ortools", "pyarrow", "ray"}


def module_names(package_dir: Path) -> list[str]:
    """Every module of the package in ``package_dir``, by dotted name (a package by its own name)."""
    names = []
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


# --------------------------------------------------------------------------- each module alone

# One interpreter, started fresh, imports the heavy third-party packages (never a module of
# harness or a plugin) and forks a child per module, two at a time; each child imports its
# module and exits. A child starts with no project module loaded, as a fresh interpreter
# would, without paying torch's import sixteen times (that took 75 s on two cores).
_FORKS = r"""
import importlib, json, os, sys, traceback
for heavy in ("numpy", "numba", "pydantic", "pluggy", "torch", "torchvision"):
    try:
        importlib.import_module(heavy)
    except ImportError:
        pass
assert not [m for m in sys.modules if m.split(".")[0] == "harness" or m.startswith("membudget_")]
failed, running = {}, {}

def reap():
    pid, status = os.wait()
    name, r = running.pop(pid)
    with os.fdopen(r) as pipe:
        report = pipe.read()
    if status:
        failed[name] = json.loads(report or '["", "killed"]')

for name in sys.argv[1:]:
    if len(running) >= 2:
        reap()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
            os._exit(0)
        except BaseException as exc:
            missing = exc.name if isinstance(exc, ModuleNotFoundError) else ""
            why = "".join(traceback.format_exception_only(exc)).strip()[-2000:]
            os.write(w, json.dumps([(missing or "").split(".")[0], why]).encode())
            os._exit(1)
    os.close(w)
    running[pid] = (name, r)
while running:
    reap()
print(json.dumps(failed))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks a child per module")
def test_every_module_imports_alone_in_a_fresh_interpreter():
    names = module_names(ROOT / "harness") + [n for d in PLUGIN_DIRS for n in module_names(d)]
    assert "harness.commands" in names and "membudget_greedy" in names
    path = os.pathsep.join([str(ROOT), *map(str, PLUGIN_DIRS), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _FORKS, *names], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": path, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    failed = {name: why for name, (missing, why) in json.loads(done.stdout.splitlines()[-1]).items()
              if not (missing in OPTIONAL and importlib.util.find_spec(missing) is None)}
    shown = [f"{n}: {w}" for n, w in list(failed.items())[:15]] + ([f"... and {len(failed) - 15} more"] if len(failed) > 15 else [])
    assert not failed, f"{len(failed)} modules do not import alone:\n" + "\n".join(shown)


# --------------------------------------------------------------------------- the import graph


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (any import statement, at any depth of the
    file), resolved to the most specific module; package-parent edges left out."""
    modules = {name: path for name, path in zip(module_names(package_dir), sorted(package_dir.rglob("*.py")))}

    def known(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [known(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, up level - 1 more
                    package = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                    base = ".".join(package + ([base] if base else []))
                targets = [known(f"{base}.{alias.name}") or known(base) for alias in node.names]
            graph[name].update(t for t in targets if t and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def shortest_cycle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle inside the component, as the modules along it (the first one repeated)."""
    members, best = set(component), None
    for start in component:  # breadth first from each module: the first way back is the shortest
        paths, seen = [[start]], {start}
        while paths and (best is None or len(paths[0]) + 1 < len(best)):
            path = paths.pop(0)
            nexts = sorted(graph[path[-1]] & members)
            if start in nexts:
                best = [*path, start]
                break
            for w in nexts:
                if w not in seen:
                    seen.add(w)
                    paths.append([*path, w])
    return best or []


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    """A shortest cycle of the component, then its modules and the edges inside it."""
    members = set(component)
    edges = [f"  {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return (" -> ".join(shortest_cycle(component, graph)) + f"\n  (the {len(component)} modules of its cycle component: "
            + ", ".join(component) + ")\n" + "\n".join(edges))


def test_the_harness_import_graph_has_no_cycle():
    graph = import_graph(ROOT / "harness")
    assert "harness.plugins" in graph["harness.commands"]  # function-level imports count too:
    assert "harness.commands" in graph["harness.cli"]  # cli imports it inside cmd_profile
    found = cycles(graph)
    assert not found, "import cycles among harness modules:\n" + "\n".join(describe(c, graph) for c in found)


def test_the_cycle_check_finds_a_cycle_and_ignores_package_parents():
    graph = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": set()}
    assert cycles(graph) == [["p.a", "p.b", "p.c"]]
    assert describe(cycles(graph)[0], graph).startswith("p.a -> p.b -> p.c -> p.a\n")
    graph["p.b"].add("p.a")
    assert shortest_cycle(cycles(graph)[0], graph) == ["p.a", "p.b", "p.a"]
    assert cycles({"p": {"p.a"}, "p.a": set()}) == []


def test_the_import_graph_counts_function_level_imports_and_no_package_parent(tmp_path):
    """``import_graph`` on a package made for the test: a package re-exporting its module is one
    edge (p -> p.a), a module is not made to depend on its package, and an import inside a
    function is an edge like any other (p.b <-> p.c is a cycle only through one)."""
    p = tmp_path / "p"
    p.mkdir()
    (p / "__init__.py").write_text("from p.a import f\n")
    (p / "a.py").write_text("def f():\n    return 1\n")
    (p / "b.py").write_text("from p.a import f\n\n\ndef g():\n    from p import c\n    return c\n")
    (p / "c.py").write_text("from . import b\n")
    graph = import_graph(p)
    assert graph == {"p": {"p.a"}, "p.a": set(), "p.b": {"p.a", "p.c"}, "p.c": {"p.b"}}
    assert cycles(graph) == [["p.b", "p.c"]]
