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
    same_schedule: run                  # or reuse: a schedule that ran already at a budget is not run again
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

``load_suite`` goes through the modules in order: ``reading`` (the YAML, with the line of every
key, includes merged), ``schema`` (what a suite may say, pydantic), ``messages`` (pydantic's
errors in a suite's words), ``cases`` (``Suite`` and the ``Case``s of its grid), ``checks`` (the
plugins named, duplicates, matches that find no case); ``errors`` holds ``SuiteError``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from harness.suite.cases import Budget, Case, Suite, iter_units, matches
from harness.suite.checks import check_match_values, check_plugin_names, check_unique
from harness.suite.errors import SuiteError, UnknownSuitePlugin, where
from harness.suite.messages import validation_error
from harness.suite.reading import load_with_includes
from harness.suite.schema import MATCH_KEYS, Budgets, Entry, ModelEntry, SuiteSpec

__all__ = ["MATCH_KEYS", "Budget", "Budgets", "Case", "Entry", "ModelEntry", "Suite", "SuiteError", "SuiteSpec",
           "UnknownSuitePlugin", "iter_units", "load_suite", "matches"]


def load_suite(path: str | Path, *, check_names: bool = True, check_option_values: bool = True) -> Suite:
    """Load, merge (``include:``), validate and expand a suite file; ``SuiteError`` says what is wrong.

    Included suites are merged first, in order, then the including file on top: a key it
    sets replaces the included one, except ``models`` and ``excludes``, which it extends.
    ``check_option_values=False`` leaves the planner option values to the cases (their check plans a
    toy chain: ``harness.suite.checks``), for a caller that only counts them.
    """
    path = Path(path)
    raw, locations = load_with_includes(path)
    try:
        spec = SuiteSpec.model_validate(raw)
    except ValidationError as exc:
        raise validation_error(exc, str(path), locations) from None
    device = str(spec.device)
    if device.lower().endswith(".json") and not Path(device).is_absolute():  # a device file, as profile files are:
        spec = spec.model_copy(update={"device": os.path.normpath(path.parent / device)})  # from the suite's folder
    suite = Suite(spec=spec, source=str(path), locations=locations, raw=raw)
    if check_names:
        check_plugin_names(suite, option_values=check_option_values)
    grid = suite.all_cases()  # once: a file-profiled model reads its profile for its input size
    check_unique(suite, grid)
    check_match_values(suite, grid)
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
        raise SuiteError(f"{where(source, line, fld)}the suite expands to no cases: {why}",
                         source=source, line=line, field=fld)
    return suite
