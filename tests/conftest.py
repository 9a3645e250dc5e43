"""Test isolation: the test-support plugin (``tests.test_suite_support.install``) never outlives its test.

``install`` adds its planners, profiler and models to the process-wide registry; left there, a
later test that goes over every registered planner (``tests/test_allocators_simulated.py``) would
meet them, so the outcome would depend on the order the tests run in.
"""

from __future__ import annotations

import pytest

from harness import plugins


@pytest.fixture(autouse=True)
def _registry_without_test_plugins():
    yield
    loaded = plugins._registry
    if loaded is not None and any(e.plugin == "membudget-test-support" for e in loaded.entries()):
        plugins.registry(reload=True)
