"""How far the chain model's memory is from what CUDA really holds: ``python benchmarks/gpu/executor_memory.py``.

For a few workloads and schedules, runs the torch executor on CUDA without the memory cap
and prints, per run: the schedule's budget, the simulator's predicted peak, PyTorch's
``max_memory_allocated`` and ``max_memory_reserved``, and the memory already allocated
before the iteration (weights, the example batch, cuBLAS/cuDNN workspaces). The gaps are
what a budget enforced on reserved memory must absorb beyond the chain model.
"""

from __future__ import annotations

import json

import torch

from harness.bounds import min_memory, peak_memory
from harness.executors._torch_chain import build_chain
from harness.executors.torch_executor import TorchExecutor
from harness.plugins import registry
from harness.profilers.measured import TorchProfiler
from harness.protocols import Workload

WORKLOADS = (Workload("torchvision:resnet18", 32, (3, 128, 128), "cuda"),
             Workload("torchvision:resnet50", 64, (3, 224, 224), "cuda"))
CASES = (("keep-all", 1.0), ("greedy", 0.5), ("greedy", 0.25), ("torch-checkpoint", 0.5), ("vdnnpp-all", 0.5))


def main() -> None:
    MiB = 2**20
    for workload in WORKLOADS:
        profile = TorchProfiler(warmup=1, repeats=3, algorithms=False).profile(workload)
        torch.cuda.empty_cache()
        before_chain = torch.cuda.memory_allocated()
        chain = build_chain(workload, "cuda")
        resident = torch.cuda.memory_allocated() - before_chain
        lo, hi = min_memory(profile), peak_memory(profile)
        print("workload", workload.model, workload.batch_size, json.dumps({
            "weight_bytes_MiB": profile.weight_bytes / MiB, "resident_after_build_MiB": resident / MiB,
            "min_MiB": lo / MiB, "peak_MiB": hi / MiB}), flush=True)
        for planner, fraction in CASES:
            budget = int(lo + fraction * (hi - lo))
            try:
                schedule = registry().planner(planner).plan(profile, budget)
            except Exception as exc:  # a planner refusing a budget is a finding, not a crash
                print("case", planner, fraction, "plan failed:", exc, flush=True)
                continue
            run = TorchExecutor(warmup=1, iterations=2, enforce_budget=False).execute(schedule, profile, chain)
            m = run.metrics
            print("case", json.dumps({
                "planner": planner, "fraction": fraction, "status": run.status, "budget_MiB": budget / MiB,
                "predicted_peak_MiB": m.get("predicted_peak_bytes", 0) / MiB,
                "max_allocated_MiB": m.get("max_memory_allocated", 0) / MiB,
                "max_reserved_MiB": m.get("max_memory_reserved", 0) / MiB,
                "time_ms": run.makespan * 1e3, "predicted_ms": m.get("predicted_s", 0) * 1e3}), flush=True)
        del chain
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
