"""The stack is one-way (docs/architecture.md, "The stack"; issue #15 item 4).

- Every module of ``harness`` and of the bundled plugins' packages imports alone, in a
  fresh interpreter: none leans on another having been imported first.
- The import graph of ``harness`` has no cycle, counting every import statement wherever
  it is (a function-level import is a dependency too, only a later one). Package-parent
  edges are not counted: importing ``harness.a.b`` runs ``harness/a/__init__.py`` first,
  which is no dependency of ``b`` on ``a``'s contents. A plugin loaded by name (the
  registry's ``BUILTINS``, entry points, ``harness.lazy.Lazy``) is no import statement:
  that is the inversion the stack is built on.
- Every import runs up the layer table of docs/architecture.md, "The stack": a module imports
  only from its own row and the rows above it, and every module has a row.
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


def package_modules(*package_dirs: Path) -> dict[str, Path]:
    """Every module of the packages, by dotted name, with its file."""
    return {name: path for package_dir in package_dirs
            for name, path in zip(module_names(package_dir), sorted(package_dir.rglob("*.py")))}


def import_graph(*package_dirs: Path) -> dict[str, set[str]]:
    """Module -> the modules of the packages it imports (any import statement, at any depth of
    the file), resolved to the most specific module; package-parent edges left out."""
    modules = package_modules(*package_dirs)

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


# --------------------------------------------------------------------------- the layers


def stack_layers(architecture: str) -> list[tuple[str, list[str]]]:
    """The table of docs/architecture.md's "The stack", top (the model) first: each layer's name
    and the paths of its "where" column (a file, or a folder ending in ``/``; ``plugins/*`` is
    every bundled plugin package)."""
    section = architecture.split("\n## The stack\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]  # past header, rule
    layers = []
    for row in rows:
        name, where = [cell.strip() for cell in row.strip("|").split(" | ")[:2]]
        layers.append((name, [p for p in where.split("`")[1::2] if p.startswith(("harness/", "plugins/"))]))
    return layers


def layer_of_modules(layers: list[tuple[str, list[str]]], modules: dict[str, Path]) -> dict[str, int]:
    """Module -> its layer's position in the table; the most specific path wins (a file in a
    folder that another row names)."""
    placed: dict[str, tuple[int, int]] = {}  # module -> (path length that placed it, layer)
    for position, (_, paths) in enumerate(layers):
        for where in paths:
            for name, path in modules.items():
                relative = path.relative_to(ROOT).as_posix()
                if where == "plugins/*":
                    hit, specificity = relative.startswith("plugins/"), 1
                elif where.endswith("/"):
                    hit, specificity = relative.startswith(where), len(where)
                else:
                    hit, specificity = relative == where, len(where)
                if hit and specificity > placed.get(name, (0, -1))[0]:
                    placed[name] = (specificity, position)
    return {name: position for name, (_, position) in placed.items()}


def layer_violations(graph: dict[str, set[str]], layer: dict[str, int],
                     names: list[str]) -> list[str]:
    """Every import of a module from a layer below its own, as 'a (layer) -> b (layer)'."""
    return sorted(f"{a} ({names[layer[a]]}) -> {b} ({names[layer[b]]})"
                  for a, targets in graph.items() if a in layer
                  for b in targets if b in layer and layer[b] > layer[a])


def test_every_import_runs_up_the_stack_of_docs_architecture():
    """docs/architecture.md: "a module imports only its own layer and the layers above it in this
    table". Every module of harness/ and of the bundled plugins has a row, and no import statement
    (a function-level one included) reaches a layer below its module's. The package ``harness``
    itself re-exports the model and ``hookimpl`` (hooks and registry): it sits with the lowest
    layer it imports from."""
    layers = stack_layers((ROOT / "docs" / "architecture.md").read_text())
    names = [name for name, _ in layers]
    assert names[0] == "model" and names[-1] == "runner, CLI" and len(names) >= 10
    stale = [where for _, paths in layers for where in paths if where != "plugins/*" and not (ROOT / where).exists()]
    assert not stale, "paths in docs/architecture.md's stack table that do not exist: " + ", ".join(stale)
    graph = import_graph(ROOT / "harness", *PLUGIN_DIRS)
    modules = package_modules(ROOT / "harness", *PLUGIN_DIRS)
    layer = layer_of_modules(layers, modules)
    layer["harness"] = max(layer[t] for t in graph["harness"])
    assert layer["harness.model"] == 0 and layer["harness.memory"] == 1
    assert layer["membudget_greedy"] == layer["harness.planners.torch_peers"] == names.index("the core's plugins")
    unplaced = sorted(set(modules) - set(layer))
    assert not unplaced, "modules in no row of docs/architecture.md's stack table: " + ", ".join(unplaced)
    violations = layer_violations(graph, layer, names)
    assert not violations, "imports that run down the stack:\n  " + "\n  ".join(violations)


def test_the_layer_check_finds_an_import_down_the_stack(tmp_path):
    table = ("intro\n\n## The stack\n\ntext\n\n| layer | where | what |\n| --- | --- | --- |\n"
             "| low | `harness/a.py` | |\n| mid | `harness/sub/`, `docs/x.md` | |\n"
             "| top | `harness/sub/c.py` (the file wins over its folder), `plugins/*` | |\n\n## Next\n")
    layers = stack_layers(table)
    assert layers == [("low", ["harness/a.py"]), ("mid", ["harness/sub/"]), ("top", ["harness/sub/c.py", "plugins/*"])]
    modules = {"harness.a": ROOT / "harness/a.py", "harness.sub.b": ROOT / "harness/sub/b.py",
               "harness.sub.c": ROOT / "harness/sub/c.py", "membudget_x": ROOT / "plugins/x/membudget_x/__init__.py"}
    layer = layer_of_modules(layers, modules)
    assert layer == {"harness.a": 0, "harness.sub.b": 1, "harness.sub.c": 2, "membudget_x": 2}
    graph = {"harness.a": {"harness.sub.b"}, "harness.sub.b": {"harness.a", "harness.sub.c"},
             "harness.sub.c": {"harness.sub.b"}, "membudget_x": {"harness.sub.c", "harness.a"}}
    assert layer_violations(graph, layer, ["low", "mid", "top"]) == [
        "harness.a (low) -> harness.sub.b (mid)", "harness.sub.b (mid) -> harness.sub.c (top)"]
