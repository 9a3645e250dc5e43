"""A loaded suite (``Suite``) and the cases of its grid: each a model, batch, input size, planner,
budget, executor, allocator, repeat and seed, one row of its results."""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from harness.errors import UnknownPlugin
from harness.suite.errors import Locations, SuiteError
from harness.suite.schema import Entry, ModelEntry, SuiteSpec
from harness.units import parse_bytes


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


def value_matches(key: str, want: Any, case: Case) -> bool:
    """Whether ``case``'s value for a match key (a suite's ``match:``) is ``want``: a planner or
    allocator by name or label, an input size or budget by its label, a fraction by value."""
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


def alternatives(key: str, want: Any) -> list[Any]:
    """The values a match key accepts: a list value's items (for ``input_size``, a list of lists)."""
    if key == "input_size":
        return want if isinstance(want, list) and want and isinstance(want[0], list) else [want]
    return want if isinstance(want, list) else [want]


def matches(match: dict[str, Any], case: Case) -> bool:
    """True when every key of ``match`` fits ``case`` (a list value: any of its items)."""
    return all(any(value_matches(key, w, case) for w in alternatives(key, want)) for key, want in match.items())


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
                    profiler=self.profiler_of(entry), dtype=self.dtype_of(entry), planner=planner.name,
                    planner_label=planner.display, executor=executor.name,
                    allocator=allocator.display if allocator else "", budget=budget,
                    repeat=repeat, seed=seed, planner_options=planner.options, tags=tags,
                    allocator_name=allocator.name if allocator else "",
                    allocator_options=allocator.options if allocator else {},
                ))
        return out

    def dtype_of(self, entry: ModelEntry) -> str:
        """The dtype of a model entry: its own, else the suite's; a profile file's own when neither says
        one (its times are of that dtype: QA had to repeat it in the suite)."""
        if entry.dtype:
            return entry.dtype
        if "dtype" not in self.raw and self.profiler_of(entry) == "file":
            return self.profile_file(entry).dtype or self.spec.dtype
        return self.spec.dtype

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


def iter_units(cases: list[Case]) -> Iterator[list[Case]]:
    """Group cases that share a plan and a run (all allocators of one unit), in order."""
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.unit_id, []).append(case)
    yield from groups.values()
