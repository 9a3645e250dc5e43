"""What the torch-executor tests share: one CPU thread, and each model's chain and profile, built once."""

from __future__ import annotations

import functools

import pytest
import torch

from harness.executors._torch_chain import TorchChain, build_chain
from harness.model import Profile
from harness.plugins import registry
from harness.protocols import Workload

BATCH, SIZE = 2, (3, 64, 64)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The CPU is shared: one intra-op thread keeps the tests predictable."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.cache
def setup(model: str) -> tuple[TorchChain, Profile]:
    """The model's chain on the CPU and its analytic profile (sizes exact on the CPU); weights and
    batch drawn from a fixed seed, so that a failure reproduces."""
    torch.manual_seed(0)
    chain = build_chain(Workload(model, BATCH, SIZE, "cpu"), "cpu")
    profile = registry().profiler("analytic").profile(Workload(model, BATCH, SIZE, "V100-PCIe"))
    return chain, profile
