"""What a valid suite is checked for before anything runs: the plugins it names are registered and
take its options, its devices, dtypes and profile files agree, no value is listed twice, and every
``excludes``/``timelines`` match finds a case."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import UnknownOption, UnknownPlugin
from harness.options import check_planner_options
from harness.suite.cases import Case, Suite, alternatives, value_matches
from harness.suite.errors import Path_, SuiteError, UnknownSuitePlugin, field_name
from harness.suite.schema import ModelEntry


def check_plugin_names(suite: Suite, option_values: bool = True) -> None:
    """``UnknownSuitePlugin`` (file, line and the registered choices) for the first profiler,
    device, model, planner, executor or allocator name of ``suite`` that nothing registered; and the other
    refusals before any case runs, planner option values among them (``option_values``: they plan a toy
    chain, compiling a planner's kernels, which a reader that runs nothing need not pay)."""
    from harness.plugins import registry

    reg = registry()
    spec = suite.spec

    def fail(exc: UnknownPlugin, *at: Any) -> SuiteError:
        source, line = suite.line_of(*at)
        return UnknownSuitePlugin(f"{source}:{line}: {field_name(at)}: {exc}", exc, source=source, line=line,
                                  field=field_name(at))

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
                factory = reg.model_factory(entry.model)
            except UnknownPlugin as exc:
                if entry.model.endswith(".json") or Path(suite.model_name(entry)).is_file():
                    source, line = suite.line_of("models", k, "model")
                    raise SuiteError(f"{source}:{line}: models[{k}].model: {entry.model!r} names a file, not a model: "
                                     "a profile file is read with profiler: file", source=source, line=line,
                                     field=f"models[{k}].model") from None
                raise fail(exc, "models", k, "model") from None
            _check_input_sizes(suite, k, entry, factory)
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
                        if option_values:
                            _check_option_values(suite, k, entry, plugin)
                    else:
                        from harness.allocators.options import check_allocator_options

                        check_allocator_options(entry.name, plugin, entry.options)
                        if option_values:
                            _check_allocator_option_values(suite, k, entry, plugin)
                except UnknownOption as exc:
                    source, line = suite.line_of(key, k)
                    raise SuiteError(f"{source}:{line}: {key}[{k}]: {exc}", source=source, line=line,
                                     field=f"{key}[{k}]") from None


def _check_option_values(suite: Suite, k: int, entry: Any, planner: Any) -> None:
    """A planner option's value the planner refuses (``{name: dynprog, slots: -3}``) made an error row in every
    case of that planner: refused here, with its line, as ``membudget plan --option`` refuses it."""
    from harness.case import option_value_refusal
    from harness.lazy import resolve

    why = option_value_refusal(resolve(planner), dict(entry.options))
    if why:
        source, line = suite.line_of("planners", k)
        raise SuiteError(f"{source}:{line}: planners[{k}]: {why}", source=source, line=line, field=f"planners[{k}]")


def _check_allocator_option_values(suite: Suite, k: int, entry: Any, allocator: Any) -> None:
    """An allocator option's value the allocator refuses (``{name: bestfit, rounds: -1}``) made an error row
    in every case, after each had planned and run: refused here, with its line, as ``membudget place
    --option`` refuses it. Two overlapping blocks placed with the options raise a ``ValueError`` where
    they are placed without them."""
    from harness.case import refused_for_its_options
    from harness.lazy import resolve
    from harness.model import MemoryBlock

    blocks = (MemoryBlock(0, "a", 256, 0.0, 2.0), MemoryBlock(1, "b", 512, 1.0, 3.0))
    allocator = resolve(allocator)
    refused = refused_for_its_options(lambda **opts: allocator.place(blocks, **opts), dict(entry.options), ValueError)
    if refused is not None:
        source, line = suite.line_of("allocators", k)
        raise SuiteError(f"{source}:{line}: allocators[{k}]: allocator {entry.name!r} refuses its options "
                         f"{dict(entry.options)}: {refused}", source=source, line=line, field=f"allocators[{k}]")


def _check_profile_file_labels(suite: Suite, k: int, entry: ModelEntry) -> None:
    """A profile file keeps its own device and dtype: the rows, which take the suite's labels, would name
    another (a measured H100 profile labelled K40m, a float32 one labelled bfloat16, with float32's times).
    Refused where the two differ; a suite on ``cpu`` or ``cuda`` (the torch executor's device) is not
    compared with the GPU a profile names."""
    from harness.profilers import devices

    profile = suite.profile_file(entry)
    for size in suite.input_sizes(entry):
        if tuple(size) != tuple(profile.input_shape):
            at = _input_field(entry, k)
            source, line = suite.line_of(*at)
            raise SuiteError(f"{source}:{line}: {field_name(at)}: {list(size)}, but models[{k}]'s profile file is "
                             f"{'x'.join(map(str, profile.input_shape))} (its times are): leave the input size "
                             "out of that model, or profile the model at that size",
                             source=source, line=line, field=field_name(at))
    dtype = suite.dtype_of(entry)
    if profile.dtype and dtype != profile.dtype:
        at = ("models", k, "dtype") if entry.dtype else ("dtype",)
        source, line = suite.line_of(*at)
        raise SuiteError(f"{source}:{line}: {field_name(at)}: {dtype}, but models[{k}]'s profile file is "
                         f"{profile.dtype} (its times are): write dtype: {profile.dtype} on that model",
                         source=source, line=line, field=field_name(at))

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


def _input_field(entry: ModelEntry, k: int) -> tuple[Any, ...]:
    return ("models", k, "input_sizes" if entry.input_sizes else "input_size")


def _check_input_sizes(suite: Suite, k: int, entry: ModelEntry, factory: Any) -> None:
    """An input size the model's factory says it cannot take (``[3, 64]`` for an image model; the optional
    ``check_input_size`` of ``harness.protocols.ModelFactory``) fails in every case when the model is built:
    refused before any case runs."""
    from harness.lazy import resolve

    check = getattr(resolve(factory), "check_input_size", None)
    if not (entry.input_size or entry.input_sizes) or not callable(check):
        return
    for size in suite.input_sizes(entry):
        wrong = check(entry.model, tuple(size))
        if wrong:
            at = _input_field(entry, k)
            source, line = suite.line_of(*at)
            raise SuiteError(f"{source}:{line}: {field_name(at)}: {wrong}", source=source, line=line,
                             field=field_name(at))


def _check_devices_and_dtypes(suite: Suite) -> None:
    """Refuse, before any case runs, a torch device or a dtype the bundled profilers would refuse in every case."""
    from harness.models.dtypes import unknown_dtype
    from harness.profilers import devices

    spec = suite.spec

    def refuse(message: str, *at: Any) -> SuiteError:
        source, line = suite.line_of(*at)
        return SuiteError(f"{source}:{line}: {field_name(at)}: {message}", source=source, line=line,
                          field=field_name(at))

    refusal = devices.torch_device_refusal(spec.device)
    if refusal and "torch" in {suite.profiler_of(e) for e in spec.models}:
        raise refuse(refusal, "device")
    for k, entry in enumerate(spec.models):
        if suite.profiler_of(entry) not in ("analytic", "torch"):  # they build the model in this dtype
            continue
        complaint = unknown_dtype(suite.dtype_of(entry))
        if complaint:
            raise refuse(complaint, *(("models", k, "dtype") if entry.dtype else ("dtype",)))


def _second(suite: Suite, at: Path_, values: list[Any], duplicate: Any) -> tuple[int, ...]:
    """Where in the list at ``at`` the second ``duplicate`` is written (its index in the suite file's list,
    which names optional entries that are not installed too), so that the error's line is its own; () when
    the list's values are not its entries (budget labels, input sizes)."""
    second = [i for i, v in enumerate(values) if v == duplicate][1]
    if at in (("planners",), ("executors",), ("allocators",)):
        entry = suite.present(at[0])[second]
        return (next(i for i, e in enumerate(getattr(suite.spec, at[0])) if e is entry),)
    if at == ("seeds",) or at[-1:] == ("batch_sizes",):
        return (second,)
    return ()


def check_unique(suite: Suite, cases: list[Case]) -> None:
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
            source, line = suite.line_of(*at, *_second(suite, at, values, duplicate))
            raise SuiteError(f"{source}:{line}: {field_name(at)}: {duplicate!r} is listed twice{hint}",
                             source=source, line=line, field=field_name(at))
    seen: set[str] = set()
    for case in cases:  # what the lists above cannot see: a model entry repeated
        if case.case_id in seen:
            source, line = suite.line_of("models")
            raise SuiteError(f"{source}:{line}: models: two entries give the case {case.case_id!r} (the same model, "
                             "batch size and input size listed twice)", source=source, line=line, field="models")
        seen.add(case.case_id)


def check_match_values(suite: Suite, cases: list[Case]) -> None:
    """Refuse an ``excludes``/``timelines`` value that no case of the grid (``cases``) has: a typo
    would match nothing."""
    absent = {name for _, name in suite.absent}  # optional plugins not installed: their matches are fine
    for key in ("excludes", "timelines"):
        matches_ = getattr(suite.spec, key)
        if isinstance(matches_, bool):
            continue
        for k, match in enumerate(matches_):
            for name, want in match.items():
                for w in alternatives(name, want):
                    if (isinstance(w, str) and w in absent) or any(value_matches(name, w, c) for c in cases):
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
