"""How many workers ``pytest -n auto`` (``tox -e tests``) starts, for the tests of the core and of every plugin."""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """A worker per CPU this process may run on, at most four.

    Each worker holds its own torch and builds full-size torchvision models, and some tests start
    processes of their own (Ray, the GPU session's rehearsals); the suite was measured with two
    workers on two cores (docs/architecture.md, "Tests"). A container's CPU quota does not show in
    the affinity mask, hence the cap."""
    return max(1, min(4, len(os.sched_getaffinity(0))))
