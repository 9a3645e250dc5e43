"""Built-in executors: the event simulator and the torch executor (also with PyTorch's save_on_cpu, and
with planned placement at real addresses)."""

from __future__ import annotations

from harness.lazy import load


class LazyTorchExecutor:
    """The ``torch`` executor as registered: torch is imported on the first run, not before.

    ``options`` are passed to ``harness.executors.torch_executor.TorchExecutor``.
    """

    name = "torch"
    description = "Runs the schedule on the real model (CUDA, or the CPU standing in): measured time and memory"
    target = "harness.executors.torch_executor.TorchExecutor"  # the class ``executor()`` builds

    def __init__(self, **options):
        self.options = options
        self._executor = None

    @property
    def duplex(self) -> bool | None:
        """Whether the copies use one stream per direction; None when the options do not say
        (the schedule's layout, ``Schedule.duplex``; ``harness.case.copy_layout`` reads it)."""
        duplex = self.options.get("duplex")
        return None if duplex is None else bool(duplex)

    def executor(self):
        """The real executor (built, and torch imported, on first use)."""
        if self._executor is None:
            self._executor = load(self.target)(**self.options)
        return self._executor

    def __getstate__(self) -> dict:
        # a worker process builds its own executor (and model): never pickle a model
        return {"options": self.options, "_executor": None}

    def run(self, schedule, profile, workload=None):
        """Execute ``schedule`` with ``TorchExecutor.run``."""
        return self.executor().run(schedule, profile, workload)


class LazyTorchSaveOnCpuExecutor(LazyTorchExecutor):
    """The ``torch-save-on-cpu`` executor: the torch executor with its ``save_on_cpu`` option.

    Every saved tensor goes through PyTorch's ``torch.autograd.graph.save_on_cpu`` hooks
    (to the host as it is saved, back when the backward uses it), for any planner's
    schedule; the schedule's own transfers do not run.
    """

    name = "torch-save-on-cpu"
    description = "The torch executor with PyTorch's save_on_cpu hooks for every saved tensor (no planned copies)"

    def __init__(self, **options):
        super().__init__(**{"save_on_cpu": True, **options})


class LazyTorchPlannedExecutor(LazyTorchExecutor):
    """The ``torch-planned`` executor (``harness.executors.planned``), torch imported on first use."""

    name = "torch-planned"
    description = ("Every device allocation of an iteration at the offsets an allocator planned from a profiled "
                   "iteration, beside the caching allocator's reserve (CUDA; emulated on the CPU)")
    target = "harness.executors.planned.TorchPlannedExecutor"


def register_builtin(register):
    """Register the built-in executors: ``simulate``, ``torch``, ``torch-save-on-cpu`` and
    ``torch-planned`` (lazily: no torch import here)."""
    from harness.simulate.executor import Simulator

    register(Simulator())
    register(LazyTorchExecutor())
    register(LazyTorchSaveOnCpuExecutor())
    register(LazyTorchPlannedExecutor())
