"""A suite file read as YAML that remembers the line of every key and item, with its ``include:``
suites merged in first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.files import not_utf8
from harness.yaml_numbers import NumberLoader
from harness.suite.errors import Locations, Path_, SuiteError, field_name


_CONCATENATED = ("models", "excludes")  # lists that an including suite extends instead of replacing


def _nearby(path: Path) -> str:
    """``; did you mean X?`` for the suite file beside ``path`` whose name is closest, if one is close."""
    from harness.plugins import close_names

    try:
        files = {f.stem: f.name for f in path.parent.iterdir()
                 if f.suffix in (".yaml", ".yml") and f.is_file() and f.name != path.name}
    except OSError:
        return ""
    near = close_names(path.stem, list(files), n=1)  # by stem: the shared ".yaml" made any name look close
    return f"; did you mean {path.parent / files[near[0]]}?" if near else ""


def _compose(path: Path) -> tuple[Any, Locations]:
    """Load YAML keeping, for every key and item, the line where its value starts."""
    if path.is_dir():
        suites = sorted(f.name for f in path.iterdir() if f.suffix in (".yaml", ".yml"))[:5]
        raise SuiteError(f"{path}: a folder, not a suite file" + (f" (it holds {', '.join(suites)})" if suites else ""),
                         source=str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        near = _nearby(path) if isinstance(exc, FileNotFoundError) else ""
        raise SuiteError(f"{path}: cannot read the suite: {exc.strerror or exc}{near}", source=str(path)) from None
    except UnicodeDecodeError as exc:
        raise SuiteError(f"{path}: not a suite: {not_utf8(exc)}", source=str(path)) from None
    if path.suffix.lower() in (".csv", ".tsv"):
        raise SuiteError(f"{path}: a CSV file, not a suite (YAML): membudget place places an allocation trace, "
                         "membudget publish and compare read a run's rows.csv", source=str(path))
    if all(not line.strip() or line.lstrip().startswith("#") for line in text.splitlines()):
        raise SuiteError(f"{path}: the file is empty: a suite is a mapping (name:, profiler:, models:, ...)",
                         source=str(path))
    loader = NumberLoader(text)
    source = str(path)
    try:
        root = loader.get_single_node()
        locations: Locations = {}

        def build(node: yaml.Node, at: Path_, line: int | None = None) -> Any:
            locations[at] = (source, line or node.start_mark.line + 1)
            if isinstance(node, yaml.MappingNode):
                loader.flatten_mapping(node)
                out = {}
                for key_node, value_node in node.value:
                    key = loader.construct_object(key_node, deep=True)
                    if not isinstance(key, (str, int, float, bool)):
                        line = key_node.start_mark.line + 1
                        raise SuiteError(f"{source}:{line}: keys must be plain names, got {key!r}",
                                         source=source, line=line)
                    if key in out:
                        line = key_node.start_mark.line + 1
                        first = locations[(*at, key)][1]
                        raise SuiteError(f"{source}:{line}: {field_name((*at, key))}: given twice (first on line "
                                         f"{first})", source=source, line=line, field=field_name((*at, key)))
                    out[key] = build(value_node, (*at, key), key_node.start_mark.line + 1)
                return out
            if isinstance(node, yaml.SequenceNode):
                return [build(child, (*at, i)) for i, child in enumerate(node.value)]
            return loader.construct_object(node, deep=True)

        data = build(root, ()) if root is not None else None
        if isinstance(data, dict) and {"model", "stages"} <= set(data):  # JSON is YAML: a profile reads as one
            raise SuiteError(f"{path}: a profile, not a suite: membudget plan {path} --planner P --budget B plans "
                             "it, and a suite's models: reads it with profiler: file", source=source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise SuiteError(f"{source}:{line or 1}: not valid YAML: {problem}", source=source, line=line) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise SuiteError(f"{source}:1: a suite is a mapping (name:, profiler:, models:, ...), "
                         f"got {type(data).__name__}", source=source, line=1)
    return data, locations


def _merge(base: dict, base_loc: Locations, top: dict, top_loc: Locations) -> None:
    """Merge suite ``top`` over ``base`` in place: keys replace, except lists in ``_CONCATENATED``."""
    for key, value in top.items():
        old = base.get(key)
        if key in _CONCATENATED and isinstance(old, list) and isinstance(value, list):
            shift = len(old)
            old.extend(value)
            for at, where in top_loc.items():
                if at[:1] == (key,) and len(at) > 1:
                    base_loc[(key, at[1] + shift, *at[2:])] = where
            continue
        base[key] = value
        for at in [a for a in base_loc if a[:1] == (key,)]:
            del base_loc[at]
        base_loc.update({at: where for at, where in top_loc.items() if at[:1] == (key,)})


def load_with_includes(path: Path, stack: tuple[Path, ...] = ()) -> tuple[dict, Locations]:
    """A suite file's mapping with its ``include:`` files merged (the including file's keys win)
    and each key's file and line; ``SuiteError`` for a cycle or an include that is no suite file."""
    path = path.resolve() if path.is_absolute() else path
    if path.resolve() in stack:
        chain = " -> ".join(str(p) for p in (*stack, path.resolve()))
        raise SuiteError(f"{path}: include cycle: {chain}", source=str(path))
    data, locations = _compose(path)
    includes = data.pop("include", [])
    inc_line = locations.get(("include",), (str(path), 1))[1]
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise SuiteError(f"{path}:{inc_line}: include: a list of suite files, got {includes!r}",
                         source=str(path), line=inc_line, field="include")
    merged: dict = {}
    merged_loc: Locations = {(): (str(path), 1)}
    for k, name in enumerate(includes):
        target = (path.parent / name)
        if not target.is_file():
            line = locations.get(("include", k), (str(path), inc_line))[1]
            what = "a folder, not a suite file" if target.is_dir() else "no such suite file"
            raise SuiteError(f"{path}:{line}: include[{k}]: {what} {str(target)!r}",
                             source=str(path), line=line, field=f"include[{k}]")
        sub, sub_loc = load_with_includes(target, (*stack, path.resolve()))
        sub.pop("name", None)  # the including suite names the run
        _merge(merged, merged_loc, sub, sub_loc)
    _merge(merged, merged_loc, data, locations)
    return merged, merged_loc
