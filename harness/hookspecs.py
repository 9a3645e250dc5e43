"""The hook specifications: how a plugin adds profilers, planners, executors, allocators, models.

Registry style (as in simonw/llm): each hook receives a ``register`` callable, and the
plugin calls it once for each object it brings. The objects follow the small protocols in
``harness.protocols``; each has a ``name`` and a one-line ``description``. A name another plugin
registered first (the built-ins first, then the plugins by distribution name) stays that plugin's, with a
warning; an object whose method cannot take the runner's arguments is skipped with a warning; a hook that raises
costs its plugin what it registers there (``harness.plugins``).

A plugin is a module with functions decorated by ``harness.hookimpl``, made known through
the ``membudget`` entry-point group::

    [project.entry-points.membudget]
    greedy = "membudget_greedy"
"""

from __future__ import annotations

from typing import Callable

import pluggy

PROJECT = "membudget"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def membudget_register_profilers(register: Callable) -> None:
    """Register ``Profiler`` objects: ``profile(workload) -> Profile``."""


@hookspec
def membudget_register_planners(register: Callable) -> None:
    """Register ``Planner`` objects: ``plan(profile, budget_bytes, **options) -> Schedule``."""


@hookspec
def membudget_register_executors(register: Callable) -> None:
    """Register ``Executor`` objects: ``run(schedule, profile, workload) -> Run``."""


@hookspec
def membudget_register_allocators(register: Callable) -> None:
    """Register ``Allocator`` objects: ``place(trace) -> Placement``."""


@hookspec
def membudget_register_models(register: Callable) -> None:
    """Register ``ModelFactory`` objects: build an ``nn.Module`` and its input for a workload."""
