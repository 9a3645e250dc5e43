"""From a workload to a runnable chain: build the model, trace it, cut it into stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.errors import MembudgetError
from harness.errors import ProfilingError
from harness.chain.graph import Graph, trace
from harness.chain.stages import StagePlan, plan_stages
from harness.protocols import Workload


@dataclass
class Chain:
    """A traced model cut into stages, with an input for it, on one device."""

    graph: Graph
    plan: StagePlan
    example: torch.Tensor


MODEL_SEED = 0  # the random state every model and input batch is built from


def concrete(device: torch.device | str) -> torch.device:
    """``device`` with its index (``cuda`` -> ``cuda:0``), as tensors report theirs."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def build_model(workload: Workload, device: Any) -> tuple[torch.nn.Module, torch.Tensor]:
    """The workload's model and an input batch from the model registry, on ``device``.

    Built from :data:`MODEL_SEED`, in a forked random state: the same workload gives the same
    weights and batch in every process (torch-planned compares the gradients of its own process
    with the caching run's), and the caller's CPU random state (and that of the CUDA device the
    model is built on) is left as it was.
    """
    from harness.plugins import registry

    factory = registry().model_factory(workload.model)
    try:
        where = concrete(device)
        with torch.random.fork_rng(devices=[where.index] if where.type == "cuda" else []):
            torch.manual_seed(MODEL_SEED)
            return factory.build(workload, device)
    except MembudgetError:
        raise
    except Exception as exc:  # a plugin's factory may raise anything (KeyError, ImportError): one line each
        raise ProfilingError(f"cannot build {workload.model} for {_describe(workload)}: "
                             f"{type(exc).__name__}: {exc}") from None


def extract(workload: Workload, device: Any = "meta") -> Chain:
    """Build, trace and cut the workload's model on ``device``.

    The cut points are always found on the ``meta`` device (no memory needed); on another
    device the same cut is applied to a trace of the real model.
    """
    model, example = build_model(workload, device)
    graph = Graph(trace(model, example, label=workload.model))
    if torch.device(device).type == "meta":
        return Chain(graph, _plan(graph, example, workload), example)
    meta_model, meta_example = build_model(workload, "meta")
    plan = _plan(Graph(trace(meta_model, meta_example, label=workload.model)), meta_example, workload)
    try:
        plan.check(graph)
    except ProfilingError:
        plan = _plan(graph, example, workload)  # traced differently on this device: cut it here
    return Chain(graph, plan, example)


def _plan(graph: Graph, example: torch.Tensor, workload: Workload) -> StagePlan:
    try:
        return plan_stages(graph, example)
    except ProfilingError as exc:
        raise ProfilingError(f"{workload.model}: {exc}") from None
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        raise ProfilingError(
            f"{workload.model} failed while running on {_describe(workload)}: {type(exc).__name__}: {exc}"
        ) from None


def _describe(workload: Workload) -> str:
    size = "x".join(str(s) for s in workload.input_size)
    return f"batch {workload.batch_size}, input {size}, {workload.dtype}"
