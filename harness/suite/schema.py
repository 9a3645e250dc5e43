"""What a suite may say: its keys, their types and their ranges (pydantic models)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel, BeforeValidator, ConfigDict, Field, PositiveInt, StrictBool, StrictInt,
    StrictStr, field_validator, model_validator,
)

from harness.units import check_fraction, parse_bytes


MATCH_KEYS = ("model", "batch_size", "input_size", "planner", "executor", "allocator", "budget", "repeat", "seed")


def name_as_entry(value: Any) -> Any:
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
                if 1 < fraction <= 100 and float(fraction).is_integer():  # 50 would read "within 0..100%" as met
                    raise ValueError(f"[{k}]: a fraction of the span min..peak is a number within 0..1 (a suite "
                                     f"writes {fraction / 100:g}, not {fraction:g}), got {fraction!r}") from None
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


NamedEntry = Annotated[Entry, BeforeValidator(name_as_entry)]


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
    # a case whose schedule ran already at its budget (another planner made the same one): "run" it again,
    # or "reuse" that run's figures (harness.same_schedule): what the GPU suites say, device time being scarce
    same_schedule: Literal["run", "reuse"] = "run"
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
