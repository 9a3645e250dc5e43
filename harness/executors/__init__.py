"""Built-in executors: the event simulator and the torch executor."""

from __future__ import annotations


class LazyTorchExecutor:
    """The ``torch`` executor as registered: torch is imported on the first run, not before.

    ``options`` are passed to ``harness.executors.torch_executor.TorchExecutor``.
    """

    name = "torch"
    description = "Runs the schedule on the real model (CUDA, or the CPU standing in): measured time and memory"

    def __init__(self, **options):
        self.options = options
        self._executor = None

    @property
    def duplex(self) -> bool:
        """Whether the copies use one stream per direction (the runner's lower bound reads it)."""
        return bool(self.options.get("duplex", False))

    def executor(self):
        """The real executor (built, and torch imported, on first use)."""
        if self._executor is None:
            from harness.executors.torch_executor import TorchExecutor

            self._executor = TorchExecutor(**self.options)
        return self._executor

    def __getstate__(self) -> dict:
        # a worker process builds its own executor (and model): never pickle a model
        return {"options": self.options, "_executor": None}

    def run(self, schedule, profile, workload=None):
        """Execute ``schedule`` with ``TorchExecutor.run``."""
        return self.executor().run(schedule, profile, workload)


def register_builtin(register):
    """Register the built-in executors: ``simulate`` and ``torch`` (lazily: no torch import here)."""
    from harness.simulate.executor import Simulator

    register(Simulator())
    register(LazyTorchExecutor())
