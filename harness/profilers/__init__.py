"""Built-in profilers: turn a workload into a chain ``Profile``.

- ``analytic``: estimated on the meta device for a device spec (``devices.py``);
- ``torch``: measured on a CPU or a CUDA GPU;
- ``file``: read from a profile JSON file.

All of them cut the model into a chain the same way (``stages.py``) and the first two
measure sizes with the same instrumented iteration (``instrument.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from harness.profilers.errors import ProfilingError

__all__ = ["ProfilingError", "profile_command", "register_builtin"]


def register_builtin(register):
    """Register the built-in profilers: ``analytic`` and ``torch`` (if torch is installed), ``file``."""
    import importlib.util

    from harness.lazy import Lazy
    from harness.profilers.file import FileProfiler

    register(FileProfiler())
    if importlib.util.find_spec("torch") is None:
        return
    register(Lazy("harness.profilers.analytic.AnalyticProfiler", "analytic",
                  "estimated on the meta device: exact sizes, FLOPs and a roofline per stage (device spec)"))
    register(Lazy("harness.profilers.measured.TorchProfiler", "torch",
                  "measured on cpu or cuda: per-stage times (median), saved bytes, workspaces, host link"))


def default_input_size(model: str) -> tuple[int, ...]:
    """The input size the model's factory suggests (3x224x224 when it says nothing)."""
    from harness.plugins import registry

    if model.startswith("file:") or model.endswith(".json"):
        return ()
    factory = registry().model_factory(model)
    suggest = getattr(factory, "default_input_size", None)
    return tuple(suggest(model)) if suggest else (3, 224, 224)


def profile_command(
    model: str,
    profiler: str = "analytic",
    device: str = "V100-PCIe",
    batch: int = 32,
    input_size: Sequence[int] | None = None,
    output: str | Path | None = None,
    dtype: str = "float32",
    **options: Any,
):
    """``membudget profile MODEL --profiler P --device D --batch N -o p.json``: profile and save.

    ``options`` configure the profiler (e.g. ``repeats=10`` or ``variant_batches=(8, 16)``
    for ``torch``); without them the registered instance is used. Returns the ``Profile``;
    with ``output`` it is also written there as JSON.
    """
    from dataclasses import replace

    from harness.model import save
    from harness.plugins import registry
    from harness.protocols import Workload

    from harness.lazy import resolve

    chosen = resolve(registry().profiler(profiler))
    if options:
        try:
            chosen = replace(chosen, **options)
        except TypeError as exc:
            raise ProfilingError(f"profiler {profiler!r} does not take these options: {exc}") from None
    size = tuple(input_size) if input_size else default_input_size(model)
    workload = Workload(model=model, batch_size=int(batch), input_size=size, device=device, dtype=dtype)
    profile = chosen.profile(workload)
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        save(profile, output)
    return profile
