"""Test isolation: the test-support plugin (``tests.test_suite_support.install``) never outlives its test,
and neither does a SIGINT or SIGTERM handler that a test (or a library it starts, such as Ray) installs.

``install`` adds its planners, profiler and models to the process-wide registry; left there, a
later test that goes over every registered planner (``tests/test_allocators_simulated.py``) would
meet them, so the outcome would depend on the order the tests run in. A handler left behind
made a later test's ``_thread.interrupt_main()`` do nothing, and that test then searched without end.
"""

from __future__ import annotations

import signal
import threading

import pytest

from harness import plugins


@pytest.fixture(autouse=True)
def _registry_without_test_plugins():
    yield
    loaded = plugins._registry
    if loaded is not None and any(e.plugin == "membudget-test-support" for e in loaded.entries()):
        plugins.registry(reload=True)


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    if threading.current_thread() is not threading.main_thread():  # signal.signal works in the main thread only
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)
