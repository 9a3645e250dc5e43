"""The harness's own profilers, planners, executors, allocators and models.

They register through the same hooks as any plugin (as pytest's built-ins do), so that
``membudget list`` shows them beside the plugins' and nothing in the core is special.
Each area keeps its list in its own package (``register_builtin(register)``).
"""

from __future__ import annotations

from harness.hookspecs import hookimpl


@hookimpl
def membudget_register_profilers(register):
    """Register the core's profilers (``harness.profilers``: analytic, torch, file)."""
    from harness import profilers

    profilers.register_builtin(register)


@hookimpl
def membudget_register_planners(register):
    """Register the core's planners (``harness.planners``: keep-all and the PyTorch peers)."""
    from harness import planners

    planners.register_builtin(register)


@hookimpl
def membudget_register_executors(register):
    """Register the core's executors (``harness.executors``: the simulator and the torch executors)."""
    from harness import executors

    executors.register_builtin(register)


@hookimpl
def membudget_register_allocators(register):
    """Register the core's allocators (``harness.allocators``); ``exact`` finds its hint allocator by name."""
    from harness import allocators
    from harness.plugins import registry

    allocators.register_builtin(register, find_allocator=lambda name: registry().allocator(name))


@hookimpl
def membudget_register_models(register):
    """Register the core's model factories (``harness.models``: torchvision, transformers, ...)."""
    from harness import models

    models.register_builtin(register)
