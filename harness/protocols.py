"""The small protocols that registered objects follow (see ``harness.hookspecs``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

from harness.model import MemoryBlock, Placement, Profile, Run, Schedule


@dataclass(frozen=True)
class Workload:
    """What to profile and run: a registered model, its batch and input size, and the device.

    ``device`` is a device-spec name for the analytic profiler (``V100-PCIe``) or a torch
    device (``cpu``, ``cuda``) for measured profiling and real execution.
    """

    model: str
    batch_size: int
    input_size: tuple[int, ...] = (3, 224, 224)
    device: str = "cpu"
    dtype: str = "float32"

    @classmethod
    def of(cls, profile: Profile, device: str) -> Workload:
        """The workload ``profile`` describes (its model, batch, input size and dtype), on ``device``."""
        return cls(profile.model, profile.batch_size, tuple(profile.input_shape), device, profile.dtype)


@runtime_checkable
class Profiler(Protocol):
    """Turns a workload into a chain ``Profile`` (measured, estimated, or read from a file)."""

    name: str
    description: str

    def profile(self, workload: Workload) -> Profile: ...


@runtime_checkable
class Planner(Protocol):
    """Decides what moves where and when for a memory budget: returns a ``Schedule``.

    A planner raises ``harness.errors.InfeasibleBudget`` when it cannot fit the budget, with
    ``needed_bytes`` an int above the budget (``harness.testing`` checks it). Its
    options are the keyword parameters of ``plan`` plus the names in an optional
    ``extra_options`` attribute; unknown ones are refused (``harness.options``). A ``plan``
    that takes only ``**options`` (no named option) and has no ``extra_options`` is taken at
    its word: every option reaches it, a misspelt one too.
    """

    name: str
    description: str

    def plan(self, profile: Profile, budget_bytes: int, **options: Any) -> Schedule: ...


@runtime_checkable
class Executor(Protocol):
    """Runs a schedule (simulated or for real) and reports what happened as a ``Run``.

    Optional attributes the runner reads: ``duplex`` (bool: the copy engines it runs on, one per
    direction when true; a case then plans for that layout, ``harness.case.copy_layout``; absent or
    None: the planner's ``duplex`` option decides) and ``needs_gpu`` (bool: its runs need a GPU
    even on a ``cpu`` case, so a Ray worker is given one; cases on ``cuda`` always get one).
    """

    name: str
    description: str

    def run(self, schedule: Schedule, profile: Profile, workload: Workload | None = None) -> Run: ...


@runtime_checkable
class Allocator(Protocol):
    """Places the blocks of a memory trace at offsets in one arena: returns a ``Placement``.

    Optional: ``serves_under_cap(trace, cap_bytes) -> bool``, for a model of an allocator that gives
    cached memory back when the process reaches a cap (PyTorch's caching allocator under
    ``set_per_process_memory_fraction``): whether it serves the trace capped at ``cap_bytes``. The
    runner asks it when the arena ``place`` reported does not fit the budget (``arena_fits_budget``;
    ``harness.device_memory.arena_fits``).

    Options: the keyword parameters of ``place`` after the trace, or, when ``place`` takes
    ``**options``, the names in an ``options`` attribute (``harness.allocators.options``;
    ``membudget place --option`` and a suite's allocator entries are checked against them).

    Optional, for an allocator whose answer depends on time (a time limit): ``deterministic()``
    returns the same allocator with a budget that does not (a node or round limit), which the
    conformance kit's repeat check uses (``harness.testing_allocators``).

    Optional too, for an allocator that searches: interrupted (Ctrl-C, SIGTERM: a ``KeyboardInterrupt``),
    it may set the exception's ``placement`` attribute to the best ``Placement`` it had, for every block
    it was given, and re-raise; ``membudget place`` then prints and writes that placement before it stops.
    """

    name: str
    description: str

    def place(self, trace: Sequence[MemoryBlock]) -> Placement: ...


@runtime_checkable
class ModelFactory(Protocol):
    """Builds a model by name: ``build(workload)`` returns ``(nn.Module, example_input)``.

    ``names()`` lists the model names it answers to (e.g. ``torchvision:resnet50``).
    Optional: ``default_input_size(name) -> tuple`` (one input's shape, without the batch), the
    size ``membudget profile`` and a suite use when none is given (else ``(3, 224, 224)``); and
    ``check_input_size(name, size) -> str | None``, what is wrong with an input size (None: nothing),
    which a suite asks before any case runs (else a wrong size fails in each case, when the model is built).
    """

    name: str
    description: str

    def names(self) -> Sequence[str]: ...

    def build(self, workload: Workload, device: Any = "cpu") -> tuple[Any, Any]: ...
