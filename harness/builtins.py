"""The harness's own profilers, planners, executors, allocators and models.

They register through the same hooks as any plugin (as pytest's built-ins do), so that
``membudget list`` shows them beside the plugins' and nothing in the core is special.
"""

from __future__ import annotations

from harness.hookspecs import hookimpl


@hookimpl
def membudget_register_planners(register):
    from harness.planners import keep_all

    register(keep_all.KeepAll())


@hookimpl
def membudget_register_executors(register):
    from harness.simulate.executor import Simulator

    register(Simulator())
