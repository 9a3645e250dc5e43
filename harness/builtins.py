"""The harness's own profilers, planners, executors, allocators and models.

They register through the same hooks as any plugin (as pytest's built-ins do), so that
``membudget list`` shows them beside the plugins' and nothing in the core is special.
Each area keeps its list in its own package (``register_builtin(register)``).
"""

from __future__ import annotations

from harness.hookspecs import hookimpl


@hookimpl
def membudget_register_profilers(register):
    from harness import profilers

    profilers.register_builtin(register)


@hookimpl
def membudget_register_planners(register):
    from harness import planners

    planners.register_builtin(register)


@hookimpl
def membudget_register_executors(register):
    from harness import executors

    executors.register_builtin(register)


@hookimpl
def membudget_register_allocators(register):
    from harness import allocators
    from harness.plugins import registry

    allocators.register_builtin(register, find_allocator=lambda name: registry().allocator(name))


@hookimpl
def membudget_register_models(register):
    from harness import models

    models.register_builtin(register)
