"""How many workers ``pytest -n auto`` (``tox -e tests``) starts, for the tests of the core and of every plugin."""

from __future__ import annotations

import pytest

MOST_WORKERS = 4


@pytest.hookimpl(optionalhook=True, wrapper=True)
def pytest_xdist_auto_num_workers(config):
    """pytest-xdist's own count (a worker per CPU it finds), at most ``MOST_WORKERS``.

    Each worker holds its own torch and builds full-size torchvision models, and some tests start
    processes of their own (Ray, the GPU session's rehearsals); the suite was measured with two
    workers on two cores (docs/architecture.md, "Tests"). A container's CPU quota does not show in
    the count, hence the cap; ``-n N`` sets any other number."""
    return min(MOST_WORKERS, (yield))
