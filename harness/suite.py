"""Suites: the YAML files in ``suites/`` that say what to benchmark, and their cases.

A suite (docs/architecture.md, "Suites and results")::

    name: quick
    profiler: analytic                  # a registered profiler
    device: V100-PCIe                   # device spec (analytic) or torch device
    models:
      - model: torchvision:resnet18     # a registered model (a profile path for `file`)
        batch_sizes: [32]
        input_size: [3, 224, 224]       # or input_sizes: [[3, 224, 224], [3, 500, 500]]
        dtype: bfloat16                 # optional: this model's dtype (default: the suite's dtype:)
        profiler: file                  # optional: this model's profiler (default: the suite's)
    budgets: {fractions: [0, 0.5, 1]}   # of the span min_memory..peak_memory (0..1); and/or bytes: [4GiB];
                                        # and/or peak_fractions: [0.2, 0.5] (of the keep-all peak, 0..1]
    planners: [keep-all, greedy, {name: dynprog, slots: 500}, {name: modnn, optional: true}]
    executors: [simulate]
    allocators: [caching]
    budget_model: chain                 # or device: budgets are what the GPU process may reserve
    repeats: 1
    statistic: trimmed-mean             # how published pages summarise repeats (or median, mean)
    seeds: [0]
    excludes: [{planner: keep-all, budget: 0}]    # drop matching cases
    timelines: true                     # or false, or a list of matches like excludes
    case_timeout_s: 600                 # optional: a case running longer is stopped, an error row
    include: [base.yaml]                # suites merged in first (see ``load_suite``)

Every error names the file, the line and the field (``suites/x.yaml:7: models[0].batch_sizes[1]:
...``); unknown profilers, models, planners, executors and allocators are errors when the
suite loads, naming the choices. A planner (or allocator, executor) marked ``optional: true``
that is not installed is skipped and the run records that it was.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal

import yaml
from pydantic import (
    BaseModel, BeforeValidator, ConfigDict, Field, PositiveInt, StrictBool, StrictInt,
    StrictStr, ValidationError, field_validator, model_validator,
)

from harness.errors import MembudgetError, UnknownOption, UnknownPlugin
from harness.files import not_utf8
from harness.options import check_planner_options
from harness.units import check_fraction, parse_bytes

MATCH_KEYS = ("model", "batch_size", "input_size", "planner", "executor", "allocator", "budget", "repeat", "seed")
_CONCATENATED = ("models", "excludes")  # lists that an including suite extends instead of replacing

Path_ = tuple[Any, ...]
Locations = dict[Path_, tuple[str, int]]


class SuiteError(MembudgetError):
    """A suite that cannot be run: the message names the file, line and field."""

    def __init__(self, message: str, *, source: str = "", line: int | None = None, field: str = "",
                 choices: list[str] | None = None):
        self.source, self.line, self.field, self.choices = source, line, field, choices or []
        MembudgetError.__init__(self, message)


class UnknownSuitePlugin(SuiteError, UnknownPlugin):
    """A suite names a profiler, model, planner, executor or allocator nobody registered."""

    def __init__(self, message: str, exc: UnknownPlugin, *, source: str, line: int, field: str):
        super().__init__(message, source=source, line=line, field=field, choices=list(exc.available))
        self.kind, self.name, self.available = exc.kind, exc.name, exc.available


def _where(source: str, line: int | None, field_name: str) -> str:
    at = f"{source}:{line}" if line else source
    return f"{at}: {field_name}: " if field_name else f"{at}: "


# --------------------------------------------------------------------------- YAML with lines


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
    loader = yaml.SafeLoader(text)
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
                        raise SuiteError(f"{source}:{line}: {_field_name((*at, key))}: given twice (first on line "
                                         f"{first})", source=source, line=line, field=_field_name((*at, key)))
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


def _load_with_includes(path: Path, stack: tuple[Path, ...] = ()) -> tuple[dict, Locations]:
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
        sub, sub_loc = _load_with_includes(target, (*stack, path.resolve()))
        sub.pop("name", None)  # the including suite names the run
        _merge(merged, merged_loc, sub, sub_loc)
    _merge(merged, merged_loc, data, locations)
    return merged, merged_loc


# --------------------------------------------------------------------------- schema


def _named(value: Any) -> Any:
    """``greedy`` is short for ``{name: greedy}``."""
    return {"name": value} if isinstance(value, str) else value


def _byte_quantity(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"a byte quantity like 4GiB, 512MiB or 1073741824, got {value!r}")
    if parse_bytes(value) <= 0:  # raises ValueError with the accepted forms
        raise ValueError(f"a budget must be positive, got {value!r}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ModelEntry(_Strict):
    """A model with the batch sizes and input sizes to run it at."""

    model: StrictStr
    batch_sizes: list[PositiveInt] = Field(min_length=1)
    input_size: list[PositiveInt] | None = Field(default=None, min_length=1)
    input_sizes: list[list[PositiveInt]] | None = Field(default=None, min_length=1)
    dtype: StrictStr | None = None
    profiler: StrictStr | None = None  # None: the suite's

    @model_validator(mode="after")
    def _one_input_key(self) -> ModelEntry:
        if self.input_size is not None and self.input_sizes is not None:
            raise ValueError("give input_size or input_sizes, not both")
        return self


class Budgets(_Strict):
    """Budgets as fractions of the span min..peak, as fractions of the keep-all peak (which reach below
    the minimum), and/or as byte quantities."""

    fractions: list[float] | None = None
    peak_fractions: list[float] | None = None
    bytes_: list[Annotated[Any, BeforeValidator(_byte_quantity)]] | None = Field(default=None, alias="bytes")

    @field_validator("fractions", "peak_fractions", mode="before")
    @classmethod
    def _numbers(cls, value: Any, info: Any) -> Any:
        of = "the span min..peak is a number within 0..1" if info.field_name == "fractions" else \
            "the keep-all peak is a number in (0, 1]"
        for k, item in enumerate(value if isinstance(value, list) else []):
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                percent = " (a suite writes 0.5, not 50%)" if str(item).strip().endswith("%") else ""
                raise ValueError(f"[{k}]: a fraction of {of}{percent}, got {item!r}")
        return value

    @field_validator("fractions")
    @classmethod
    def _within_the_span(cls, value: list[float] | None) -> list[float] | None:
        for k, fraction in enumerate(value or []):
            try:
                check_fraction(fraction)
            except ValueError as exc:
                raise ValueError(f"[{k}]: {exc}") from None
        return value

    @field_validator("peak_fractions")
    @classmethod
    def _of_the_peak(cls, value: list[float] | None) -> list[float] | None:
        for k, fraction in enumerate(value or []):
            if isinstance(fraction, bool) or not 0 < fraction <= 1:
                raise ValueError(f"[{k}]: a fraction of the keep-all peak is a number in (0, 1], got {fraction!r}")
        return value

    @model_validator(mode="after")
    def _some_budget(self) -> Budgets:
        if not (self.fractions or self.peak_fractions or self.bytes_):
            raise ValueError("no budgets: give fractions: [0, 0.5, 1] (of min..peak), peak_fractions: [0.2, 0.5] "
                             "(of the keep-all peak) and/or bytes: [4GiB]")
        return self


class Entry(BaseModel):
    """A plugin by name, with options (planners) and ``optional: true`` (skip when not installed)."""

    model_config = ConfigDict(extra="allow", strict=True)

    name: StrictStr
    optional: StrictBool = False
    label: StrictStr | None = None

    @field_validator("label")
    @classmethod
    def _label_is_a_field_of_the_case_id(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or "/" in value):
            raise ValueError(f"label {value!r}: a label names a column and is a field of the case id "
                             "(fields separated by '/'): give a non-empty one without '/'")
        return value

    @property
    def options(self) -> dict[str, Any]:
        """The keys other than name, optional and label: passed to the planner."""
        return dict(self.model_extra or {})

    @property
    def display(self) -> str:
        """The label, or ``name[key=value,...]`` when there are options."""
        if self.label:
            return self.label
        if not self.options:
            return self.name
        inner = ",".join(f"{k}={_compact(v)}" for k, v in sorted(self.options.items()))
        return f"{self.name}[{inner}]"


NamedEntry = Annotated[Entry, BeforeValidator(_named)]


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) if isinstance(value, (dict, list)) else str(value)


class SuiteSpec(_Strict):
    """The validated content of a suite file (after includes are merged)."""

    name: StrictStr = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: StrictStr = ""
    profiler: StrictStr
    device: StrictStr
    dtype: StrictStr = "float32"
    models: list[ModelEntry] = Field(min_length=1)
    budgets: Budgets
    planners: list[NamedEntry] = Field(min_length=1)
    executors: list[NamedEntry] = Field(default_factory=lambda: [Entry(name="simulate")], min_length=1)
    allocators: list[NamedEntry] = Field(default_factory=list)
    # what a budget means: "chain", the chain model's bytes (papers/004's M, the paper suites);
    # "device", the bytes the process may reserve on the GPU (harness.device_memory)
    budget_model: Literal["chain", "device"] = "chain"
    repeats: PositiveInt = 1
    # how the published pages summarise a case's repeats (harness.publish.summarise);
    # trimmed-mean drops the fastest and the slowest when there are three or more (MLPerf)
    statistic: Literal["trimmed-mean", "median", "mean"] = "trimmed-mean"
    seeds: list[StrictInt] = Field(default_factory=lambda: [0], min_length=1)
    excludes: list[dict[str, Any]] = Field(default_factory=list)
    timelines: Any = True
    validate_schedules: StrictBool = Field(default=True, alias="validate")
    # seconds a case (with the allocator cases that share its run) may take before it is stopped
    # and recorded as an error (harness.workers); None: no limit. `membudget run --case-timeout` overrides it
    case_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None

    @field_validator("excludes")
    @classmethod
    def _match_keys(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        _check_matches(value)
        return value

    @field_validator("timelines")
    @classmethod
    def _timelines(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return value
        if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
            raise ValueError("true, false, or a list of matches like excludes ({planner: greedy})")
        _check_matches(value)
        return value


def _check_matches(matches: list[dict[str, Any]]) -> None:
    for k, match in enumerate(matches):
        unknown = sorted(set(match) - set(MATCH_KEYS))
        if unknown:
            raise ValueError(f"[{k}]: unknown key {unknown[0]!r}; match on {', '.join(MATCH_KEYS)}")


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Budget:
    """One budget of a suite: a fraction of min..peak, a fraction of the keep-all peak, or a byte count."""

    kind: str  # "fraction" | "peak_fraction" | "bytes"
    value: float
    label: str

    def resolve(self, min_bytes: int, peak_bytes: int) -> int:
        """The budget in bytes for a profile with this minimum and peak."""
        if self.kind == "bytes":
            return int(self.value)
        if self.kind == "peak_fraction":
            return int(math.floor(self.value * peak_bytes))
        return int(min_bytes + math.floor(self.value * (peak_bytes - min_bytes)))


@dataclass(frozen=True)
class Case:
    """One point of a suite's grid: one row of its results."""

    suite: str
    model: str
    batch_size: int
    input_size: tuple[int, ...]
    device: str
    profiler: str
    dtype: str
    planner: str
    planner_label: str
    executor: str
    allocator: str
    budget: Budget
    repeat: int = 0
    seed: int = 0
    planner_options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    tags: tuple[str, ...] = ()  # repeat/seed parts of the id, when the suite varies them
    # ``allocator`` is the allocator's label (its name, with its options when the suite gives any)
    allocator_name: str = ""
    allocator_options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def input_label(self) -> str:
        """``3x224x224``."""
        return "x".join(str(d) for d in self.input_size)

    @property
    def profile_key(self) -> tuple[str, int, tuple[int, ...], str]:
        """Cases with the same key share one profile."""
        return (self.model, self.batch_size, self.input_size, self.dtype)

    @property
    def unit_id(self) -> str:
        """The id without the allocator: cases of one unit share their plan and run."""
        parts = [self.model, f"b{self.batch_size}", self.input_label, self.planner_label, self.budget.label,
                 self.executor, *self.tags]
        return "/".join(parts)

    @property
    def case_id(self) -> str:
        """Stable, readable and unique in the suite: ``model/bN/CxHxW/planner/budget/executor[/allocator]``."""
        parts = [self.model, f"b{self.batch_size}", self.input_label, self.planner_label, self.budget.label,
                 self.executor]
        if self.allocator:
            parts.append(self.allocator)
        return "/".join([*parts, *self.tags])

    def field_value(self, key: str) -> Any:
        """The value an exclude/timeline match compares for ``key``."""
        return {
            "model": self.model, "batch_size": self.batch_size, "input_size": self.input_size,
            "planner": self.planner, "executor": self.executor, "allocator": self.allocator,
            "budget": self.budget, "repeat": self.repeat, "seed": self.seed,
        }[key]


def _value_matches(key: str, want: Any, case: Case) -> bool:
    have = case.field_value(key)
    if key == "input_size":
        if isinstance(want, str):
            return want == case.input_label
        return isinstance(want, list) and tuple(want) == have
    if key == "planner":
        return want in (case.planner, case.planner_label)
    if key == "allocator":
        return want in (case.allocator, case.allocator_name)
    if key == "budget":
        budget: Budget = have
        if want == budget.label:
            return True
        if isinstance(want, (int, float)) and not isinstance(want, bool) and budget.kind == "fraction":
            return math.isclose(float(want), budget.value)
        if budget.kind == "bytes":
            try:
                return parse_bytes(want) == int(budget.value)
            except ValueError:
                return False
        return False
    return want == have


def _alternatives(key: str, want: Any) -> list[Any]:
    """The values a match key accepts: a list value's items (for ``input_size``, a list of lists)."""
    if key == "input_size":
        return want if isinstance(want, list) and want and isinstance(want[0], list) else [want]
    return want if isinstance(want, list) else [want]


def matches(match: dict[str, Any], case: Case) -> bool:
    """True when every key of ``match`` fits ``case`` (a list value: any of its items)."""
    return all(any(_value_matches(key, w, case) for w in _alternatives(key, want)) for key, want in match.items())


def _fraction_label(f: float) -> str:
    return f"f{f:g}"


def _bytes_label(value: Any) -> str:
    return str(value).replace(" ", "") if isinstance(value, str) else str(int(value))


@dataclass
class Suite:
    """A loaded suite: the validated spec, where it came from, and its cases."""

    spec: SuiteSpec
    source: str
    locations: Locations = field(default_factory=dict, repr=False)
    skipped: list[str] = field(default_factory=list)
    absent: set[tuple[str, str]] = field(default_factory=set)  # (list key, name) not installed, optional
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    _profiles: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # path -> its Profile

    @property
    def name(self) -> str:
        """The suite's name (the results folder under ``results/``)."""
        return self.spec.name

    def line_of(self, *at: Any) -> tuple[str, int]:
        """(file, line) of the field at path ``at`` (the nearest enclosing one known)."""
        for n in range(len(at), -1, -1):
            if at[:n] in self.locations:
                return self.locations[at[:n]]
        return (self.source, 1)

    def budgets(self) -> list[Budget]:
        """The suite's budgets, fractions first, then fractions of the peak (``pN``), in the order written."""
        out = [Budget("fraction", float(f), _fraction_label(f)) for f in self.spec.budgets.fractions or []]
        out += [Budget("peak_fraction", float(f), f"p{f:g}") for f in self.spec.budgets.peak_fractions or []]
        out += [Budget("bytes", float(parse_bytes(b)), _bytes_label(b)) for b in self.spec.budgets.bytes_ or []]
        return out

    def present(self, key: str) -> list[Entry]:
        """The entries of ``planners``, ``executors`` or ``allocators`` that are installed."""
        return [e for e in getattr(self.spec, key) if (key, e.name) not in self.absent]

    def input_sizes(self, entry: ModelEntry) -> list[tuple[int, ...]]:
        """The input sizes of a model entry (the model factory's default when none is given)."""
        if entry.input_sizes:
            return [tuple(s) for s in entry.input_sizes]
        if entry.input_size:
            return [tuple(entry.input_size)]
        if self.profiler_of(entry) == "file":
            return [tuple(self.profile_file(entry).input_shape)]
        from harness.commands import DEFAULT_INPUT_SIZE, default_input_size

        try:
            return [default_input_size(entry.model)]
        except UnknownPlugin:  # the suite's check names the unknown model, with its line
            return [DEFAULT_INPUT_SIZE]

    def profile_file(self, entry: ModelEntry) -> Any:
        """The ``Profile`` a ``profiler: file`` entry names, read once; a file that is none is refused with its
        line in the suite (the file alone does not say where it was named)."""
        path = self.model_name(entry)
        if path not in self._profiles:
            from harness.model import ModelError, Profile, load

            try:
                self._profiles[path] = load(Profile, path)
            except (ModelError, OSError) as exc:
                k = next(k for k, e in enumerate(self.spec.models) if e is entry)
                source, line = self.line_of("models", k, "model")
                raise SuiteError(f"{source}:{line}: models[{k}].model: not a profile: {exc}", source=source,
                                 line=line, field=f"models[{k}].model") from None
        return self._profiles[path]

    def all_cases(self) -> list[Case]:
        """Every case of the grid, before excludes."""
        spec = self.spec
        tag_repeat = spec.repeats > 1
        tag_seed = len(spec.seeds) > 1 or spec.seeds != [0]
        out = []
        planners, executors = self.present("planners"), self.present("executors")
        allocators = self.present("allocators") or [None]
        for entry in spec.models:
            model = self.model_name(entry)
            for batch, size, planner, budget, executor, allocator, repeat, seed in itertools.product(
                entry.batch_sizes, self.input_sizes(entry), planners, self.budgets(), executors, allocators,
                range(spec.repeats), spec.seeds,
            ):
                tags = ((f"r{repeat}",) if tag_repeat else ()) + ((f"s{seed}",) if tag_seed else ())
                out.append(Case(
                    suite=spec.name, model=model, batch_size=batch, input_size=size, device=spec.device,
                    profiler=self.profiler_of(entry), dtype=entry.dtype or spec.dtype, planner=planner.name,
                    planner_label=planner.display, executor=executor.name,
                    allocator=allocator.display if allocator else "", budget=budget,
                    repeat=repeat, seed=seed, planner_options=planner.options, tags=tags,
                    allocator_name=allocator.name if allocator else "",
                    allocator_options=allocator.options if allocator else {},
                ))
        return out

    def profiler_of(self, entry: ModelEntry) -> str:
        """The profiler of a model entry: its own, else the suite's."""
        return entry.profiler or self.spec.profiler

    def model_name(self, entry: ModelEntry) -> str:
        """The model as the profiler gets it (``file`` profiles: a path from the suite's folder)."""
        if self.profiler_of(entry) == "file":
            path = Path(entry.model.removeprefix("file:"))
            return os.path.normpath(path if path.is_absolute() else Path(self.source).parent / path)
        return entry.model

    def cases(self, grid: list[Case] | None = None) -> list[Case]:
        """The suite's cases after excludes, in a stable order (``grid``: ``all_cases()``, when at hand)."""
        return [c for c in (self.all_cases() if grid is None else grid)
                if not any(matches(m, c) for m in self.spec.excludes)]

    def wants_timeline(self, case: Case) -> bool:
        """Whether the runner saves the timeline of ``case``."""
        t = self.spec.timelines
        return t if isinstance(t, bool) else any(matches(m, case) for m in t)


# --------------------------------------------------------------------------- loading


def _field_name(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _model_holding(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose field ``loc``'s last key is (None where no model holds one)."""
    model: type[BaseModel] = SuiteSpec
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = _field(model, part)
        held = _model_in(field.annotation) if field is not None else None
        if held is None:
            return None
        model = held
    return model


def _field(model: type[BaseModel], key: Any) -> Any:
    """``model``'s field named ``key`` (by name or by alias), or None."""
    return next((f for n, f in model.model_fields.items() if key in (n, f.alias)), None)


def _keys_beside(loc: tuple[Any, ...]) -> list[str]:
    """The keys a suite allows where ``loc``'s last key stands (the fields of the model that holds it)."""
    model = _model_holding(loc)
    if model is None:
        return []
    keys = [f.alias or n for n, f in model.model_fields.items()]
    return [*keys, "include"] if model is SuiteSpec else keys


def _one_value_is_an_item(loc: tuple[Any, ...]) -> bool:
    """Whether the list field at ``loc`` takes a single plain value as an item: numbers and texts, and
    entries that a name stands for (``planners: [greedy]``); not mappings (``models``) or lists."""
    model = _model_holding(loc)
    field = _field(model, loc[-1]) if model is not None and loc else None
    lists = [a for a in (field.annotation, *typing.get_args(field.annotation))
             if typing.get_origin(a) is list] if field is not None else []
    return bool(lists) and _plain_value_fits(typing.get_args(lists[0])[0])


def _plain_value_fits(item: Any) -> bool:
    if typing.get_origin(item) is Annotated:
        return (any(getattr(m, "func", None) is _named for m in item.__metadata__)
                or _plain_value_fits(typing.get_args(item)[0]))
    return item is Any or item in (int, float, str)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (through list[...], Optional, Annotated), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _near_key(loc: tuple[Any, ...]) -> str | None:
    """The allowed key closest to the unknown key at ``loc``, when one is near."""
    from harness.plugins import close_names

    near = close_names(str(loc[-1]), _keys_beside(loc), n=1) if loc else []
    return near[0] if near else None


def _unknown_key(loc: tuple[Any, ...]) -> str:
    """The message for a key no suite model has: the closest allowed key when one is near."""
    keys = _keys_beside(loc)
    near = [_near_key(loc)] if _near_key(loc) else []
    hint = f"did you mean {near[0]!r}? " if near else ""
    allowed = f"the keys here are {', '.join(keys)}; " if keys and not near else ""
    return f"unknown field ({hint}{allowed}the suite format is in docs/cli.md, \"Suites\")"


def _yaml_kind(value: Any) -> str:
    """What a YAML value is, in YAML's words."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, str):
        return f"the text {value!r}"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"


# what a suite value should have been, by pydantic's error type (its own words name Python's types)
_EXPECTED = {"list_type": "a list", "string_type": "a text", "int_type": "a whole number",
             "int_parsing": "a whole number", "int_from_float": "a whole number", "float_type": "a number",
             "float_parsing": "a number", "bool_type": "true or false", "bool_parsing": "true or false",
             "dict_type": "a mapping"}


def _pydantic_errors(exc: ValidationError, suite_source: str, locations: Locations) -> SuiteError:
    lines = []
    first: tuple[str, int, str] | None = None
    errors = [(tuple("bytes" if p == "bytes_" else p for p in err["loc"]), err) for err in exc.errors()]
    errors.sort(key=lambda e: e[0] not in locations)  # errors at a line of their own first
    # a misspelt required key is one mistake: its "did you mean" line says it, not also "missing"
    meant = {(*loc[:-1], _near_key(loc)) for loc, err in errors if err["type"] == "extra_forbidden"}
    errors = [(loc, err) for loc, err in errors if not (err["type"] == "missing" and loc in meant)]
    for loc, err in errors:
        msg = err["msg"].removeprefix("Value error, ")
        if msg.startswith("[") and "]: " in msg and msg[1:msg.index("]")].isdigit():  # names its item
            item, msg = msg[1:].split("]: ", 1)
            loc = (*loc, int(item))
        at = loc
        while at not in locations and at:
            at = at[:-1]
        source, line = locations.get(at, (suite_source, 1))
        if err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "extra_forbidden":
            msg = _unknown_key(loc)
        elif err["type"].startswith("too_short") and "input" in err:
            msg = "must not be empty: the grid would have no cases"
        elif err["type"] == "model_type":  # pydantic's "Input should be a valid dictionary or instance of ..."
            keys = [k for k in _keys_beside((*loc, "")) if k != "include"]
            named = bool(loc) and isinstance(loc[-1], int) and _one_value_is_an_item(loc[:-1])
            msg = (f"{'a name or ' if named else ''}a mapping with the keys {', '.join(keys)}, "
                   f"got {_yaml_kind(err.get('input'))} "
                   "(the suite format is in docs/cli.md, \"Suites\")")
        elif err["type"] in _EXPECTED:
            value = err.get("input")
            one = (err["type"] == "list_type" and isinstance(value, (str, int, float))
                   and not isinstance(value, bool) and _one_value_is_an_item(loc))
            msg = f"{_EXPECTED[err['type']]}, got {_yaml_kind(value)}" + (f" (write [{value}])" if one else "")
        elif err["type"] == "string_pattern_mismatch":
            msg = (f"{err.get('input')!r} is not one plain folder name: letters, digits, '.', '_' and '-', "
                   "starting with a letter or digit")
        name = _field_name(loc)
        lines.append(f"{source}:{line}: {name or '(suite)'}: {msg}")
        first = first or (source, line, name)
    assert first is not None
    return SuiteError("\n".join(lines), source=first[0], line=first[1], field=first[2])


def _check_names(suite: Suite) -> None:
    from harness.plugins import registry

    reg = registry()
    spec = suite.spec

    def fail(exc: UnknownPlugin, *at: Any) -> SuiteError:
        source, line = suite.line_of(*at)
        return UnknownSuitePlugin(f"{source}:{line}: {_field_name(at)}: {exc}", exc, source=source, line=line,
                                  field=_field_name(at))

    try:
        reg.profiler(spec.profiler)
    except UnknownPlugin as exc:
        raise fail(exc, "profiler") from None
    for k, entry in enumerate(spec.models):
        if entry.profiler is not None:
            try:
                reg.profiler(entry.profiler)
            except UnknownPlugin as exc:
                raise fail(exc, "models", k, "profiler") from None
    if "analytic" in {suite.profiler_of(e) for e in spec.models}:  # a device spec name: check it now, not case by case
        from harness.profilers import devices

        try:
            devices.spec(spec.device)
        except KeyError as exc:
            source, line = suite.line_of("device")
            raise SuiteError(f"{source}:{line}: device: {exc.args[0]}", source=source, line=line, field="device",
                             choices=devices.names()) from None
    _check_devices_and_dtypes(suite)
    for k, entry in enumerate(spec.models):
        if suite.profiler_of(entry) != "file":
            try:
                reg.model_factory(entry.model)
            except UnknownPlugin as exc:
                if entry.model.endswith(".json") or Path(suite.model_name(entry)).is_file():
                    source, line = suite.line_of("models", k, "model")
                    raise SuiteError(f"{source}:{line}: models[{k}].model: {entry.model!r} names a file, not a model: "
                                     "a profile file is read with profiler: file", source=source, line=line,
                                     field=f"models[{k}].model") from None
                raise fail(exc, "models", k, "model") from None
        else:
            profile_path = Path(suite.model_name(entry))
            if not profile_path.is_file():
                source, line = suite.line_of("models", k, "model")
                if entry.model in dict(reg.models()):
                    problem = (f"{entry.model!r} is a model name, not a profile file: profile it with "
                               "profiler: analytic (or torch)")
                elif profile_path.is_dir():
                    problem = f"{str(profile_path)!r} is a folder, not a profile file"
                else:
                    problem = f"no profile file {str(profile_path)!r}"
                    if not Path(entry.model.removeprefix("file:")).is_absolute():
                        problem += f" (a path in a suite is from the suite file's folder: {profile_path.resolve()})"
                raise SuiteError(f"{source}:{line}: models[{k}].model: {problem}",
                                 source=source, line=line, field=f"models[{k}].model")
            _check_profile_file_labels(suite, k, entry)
    for key, kind in (("planners", "planner"), ("executors", "executor"), ("allocators", "allocator")):
        for k, entry in enumerate(getattr(spec, key)):
            try:
                plugin = reg.get(kind, entry.name)
            except UnknownPlugin as exc:
                if entry.optional:
                    from harness.plugins import close_names

                    close = close_names(entry.name, reg.names(kind), n=1)
                    typo = f" (did you mean {close[0]!r}?)" if close else ""
                    if reg.failed:  # installed, perhaps, by a plugin that failed: not "not installed"
                        failed = sorted(reg.failed)
                        one = len(failed) == 1
                        typo += (f" ({'the plugin' if one else 'the plugins'} {', '.join(failed)} failed to load or "
                                 f"register, as {'its warning says' if one else 'their warnings say'}: it may be "
                                 f"{'that plugin' if one else 'one of them'}'s)")
                    suite.skipped.append(f"{kind} {entry.name!r} is not installed (optional): skipped{typo}")
                    suite.absent.add((key, entry.name))
                    continue
                raise fail(exc, key, k, "name") from None
            if key == "executors" and entry.options:
                source, line = suite.line_of(key, k)
                raise SuiteError(f"{source}:{line}: {key}[{k}]: {kind}s take no options, got "
                                 f"{sorted(entry.options)}", source=source, line=line, field=f"{key}[{k}]")
            if key != "executors" and entry.options:
                try:
                    if key == "planners":
                        check_planner_options(entry.name, plugin, entry.options)
                    else:
                        from harness.allocators.options import check_allocator_options

                        check_allocator_options(entry.name, plugin, entry.options)
                except UnknownOption as exc:
                    source, line = suite.line_of(key, k)
                    raise SuiteError(f"{source}:{line}: {key}[{k}]: {exc}", source=source, line=line,
                                     field=f"{key}[{k}]") from None


def _check_profile_file_labels(suite: Suite, k: int, entry: ModelEntry) -> None:
    """A profile file keeps its own device and dtype: the rows, which take the suite's labels, would name
    another (a measured H100 profile labelled K40m, a float32 one labelled bfloat16, with float32's times).
    Refused where the two differ; a suite on ``cpu`` or ``cuda`` (the torch executor's device) is not
    compared with the GPU a profile names."""
    from harness.profilers import devices

    profile = suite.profile_file(entry)
    dtype = entry.dtype or suite.spec.dtype
    if profile.dtype and dtype != profile.dtype:
        at = ("models", k, "dtype") if entry.dtype else ("dtype",)
        source, line = suite.line_of(*at)
        raise SuiteError(f"{source}:{line}: {_field_name(at)}: {dtype}, but models[{k}]'s profile file is "
                         f"{profile.dtype} (its times are): write dtype: {profile.dtype} on that model",
                         source=source, line=line, field=_field_name(at))

    def spec_of(name: str) -> Any:
        try:
            return devices.spec(name)
        except KeyError:
            return devices.match_gpu(name)

    ours = None if devices.torch_device_refusal(suite.spec.device) is None else spec_of(suite.spec.device)
    theirs = spec_of(profile.device)
    if ours is not None and theirs is not None and ours.name != theirs.name:
        source, line = suite.line_of("device")
        raise SuiteError(f"{source}:{line}: device: {suite.spec.device}, but models[{k}]'s profile file was made "
                         f"on {profile.device}: its rows would say {suite.spec.device}; give that model a suite "
                         f"on device: {theirs.name}", source=source, line=line, field="device")


def _check_devices_and_dtypes(suite: Suite) -> None:
    """Refuse, before any case runs, a torch device or a dtype the bundled profilers would refuse in every case."""
    from harness.models.dtypes import unknown_dtype
    from harness.profilers import devices

    spec = suite.spec

    def refuse(message: str, *at: Any) -> SuiteError:
        source, line = suite.line_of(*at)
        return SuiteError(f"{source}:{line}: {_field_name(at)}: {message}", source=source, line=line,
                          field=_field_name(at))

    refusal = devices.torch_device_refusal(spec.device)
    if refusal and "torch" in {suite.profiler_of(e) for e in spec.models}:
        raise refuse(refusal, "device")
    for k, entry in enumerate(spec.models):
        if suite.profiler_of(entry) not in ("analytic", "torch"):  # they build the model in this dtype
            continue
        complaint = unknown_dtype(entry.dtype or spec.dtype)
        if complaint:
            raise refuse(complaint, *(("models", k, "dtype") if entry.dtype else ("dtype",)))


def _check_unique(suite: Suite, cases: list[Case]) -> None:
    """Refuse a value listed twice: its cases (``cases``: the grid) would share a case id."""
    spec, budgets = suite.spec, suite.budgets()
    lists: list[tuple[Path_, list[Any], str]] = [
        (("planners",), [p.display for p in suite.present("planners")], " (give one a label:)"),
        (("executors",), [e.name for e in suite.present("executors")], ""),
        (("allocators",), [a.display for a in suite.present("allocators")], " (give one a label:)"),
        (("seeds",), list(spec.seeds), ""),
    ]
    for kind, key in (("fraction", "fractions"), ("peak_fraction", "peak_fractions")):
        lists.append((("budgets", key), [b.label for b in budgets if b.kind == kind], ""))
    in_bytes = [b for b in budgets if b.kind == "bytes"]  # 160MiB and 167772160 are one budget
    for k, b in enumerate(in_bytes):
        same = next((other for other in in_bytes[:k] if other.value == b.value), None)
        if same is not None:
            source, line = suite.line_of("budgets", "bytes")
            twice = f"{same.label!r} is listed twice" if same.label == b.label else \
                f"{same.label!r} and {b.label!r} are the same budget ({int(b.value)} bytes)"
            raise SuiteError(f"{source}:{line}: budgets.bytes: {twice}", source=source, line=line,
                             field="budgets.bytes")
    for k, entry in enumerate(spec.models):
        lists.append((("models", k, "batch_sizes"), list(entry.batch_sizes), ""))
        lists.append((("models", k, "input_sizes" if entry.input_sizes else "input_size"),
                      ["x".join(map(str, size)) for size in suite.input_sizes(entry)], ""))
    for at, values, hint in lists:
        duplicate = next((v for v in values if values.count(v) > 1), None)
        if duplicate is not None:
            source, line = suite.line_of(*at)
            raise SuiteError(f"{source}:{line}: {_field_name(at)}: {duplicate!r} is listed twice{hint}",
                             source=source, line=line, field=_field_name(at))
    seen: set[str] = set()
    for case in cases:  # what the lists above cannot see: a model entry repeated
        if case.case_id in seen:
            source, line = suite.line_of("models")
            raise SuiteError(f"{source}:{line}: models: two entries give the case {case.case_id!r} (the same model, "
                             "batch size and input size listed twice)", source=source, line=line, field="models")
        seen.add(case.case_id)


def _check_match_values(suite: Suite, cases: list[Case]) -> None:
    """Refuse an ``excludes``/``timelines`` value that no case of the grid (``cases``) has: a typo
    would match nothing."""
    absent = {name for _, name in suite.absent}  # optional plugins not installed: their matches are fine
    for key in ("excludes", "timelines"):
        matches_ = getattr(suite.spec, key)
        if isinstance(matches_, bool):
            continue
        for k, match in enumerate(matches_):
            for name, want in match.items():
                for w in _alternatives(name, want):
                    if (isinstance(w, str) and w in absent) or any(_value_matches(name, w, c) for c in cases):
                        continue
                    have = sorted({_shown(name, c) for c in cases}, key=str)
                    source, line = suite.line_of(key, k, name)
                    raise SuiteError(f"{source}:{line}: {key}[{k}].{name}: {w!r} matches no case of the suite; its "
                                     f"{name} values are {', '.join(map(str, have))}",
                                     source=source, line=line, field=f"{key}[{k}].{name}")


def _shown(key: str, case: Case) -> Any:
    """How a match names ``case``'s value of ``key`` (labels, not objects)."""
    if key == "budget":
        return case.budget.label
    if key == "planner":
        return case.planner_label
    if key == "input_size":
        return case.input_label
    return case.field_value(key)


def load_suite(path: str | Path, *, check_names: bool = True) -> Suite:
    """Load, merge (``include:``), validate and expand a suite file; ``SuiteError`` says what is wrong.

    Included suites are merged first, in order, then the including file on top: a key it
    sets replaces the included one, except ``models`` and ``excludes``, which it extends.
    """
    path = Path(path)
    raw, locations = _load_with_includes(path)
    try:
        spec = SuiteSpec.model_validate(raw)
    except ValidationError as exc:
        raise _pydantic_errors(exc, str(path), locations) from None
    suite = Suite(spec=spec, source=str(path), locations=locations, raw=raw)
    if check_names:
        _check_names(suite)
    grid = suite.all_cases()  # once: a file-profiled model reads its profile for its input size
    _check_unique(suite, grid)
    _check_match_values(suite, grid)
    if not suite.cases(grid):
        if not suite.present("planners"):
            source, line = suite.line_of("planners")
            why, fld = "every planner listed is optional and not installed", "planners"
        elif spec.excludes:
            source, line = suite.line_of("excludes")
            why, fld = "the excludes remove every case", "excludes"
        else:
            source, line = suite.line_of()
            why, fld = "nothing to run", ""
        raise SuiteError(f"{_where(source, line, fld)}the suite expands to no cases: {why}",
                         source=source, line=line, field=fld)
    return suite


def iter_units(cases: list[Case]) -> Iterator[list[Case]]:
    """Group cases that share a plan and a run (all allocators of one unit), in order."""
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.unit_id, []).append(case)
    yield from groups.values()
