"""Built-in profilers: turn a workload into a chain ``Profile``.

- ``analytic``: estimated on the meta device for a device spec (``devices.py``);
- ``torch``: measured on a CPU or a CUDA GPU;
- ``file``: read from a profile JSON file.

All of them cut the model into a chain the same way (``harness.chain``) and the first two
measure sizes with the same instrumented iteration (``instrument.py``). ``membudget
profile`` is ``harness.commands.profile_command``.
"""

from __future__ import annotations

from harness.errors import ProfilingError

__all__ = ["ProfilingError", "register_builtin"]


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
