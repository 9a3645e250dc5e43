"""The ``torch-planned`` executor: a schedule's iterations served from one planned arena (issue #18).

On CUDA, :meth:`TorchPlannedExecutor.run`

1. starts a fresh process (``python -m harness.executors.planned JOB.json``) that makes a
   :class:`~harness.allocators.realaddr.RealAddressAllocator` its CUDA allocator
   (:mod:`harness.executors._cuda_pluggable`, whose docstring says why a process and not a
   ``MemPool``, and lists what only a GPU can confirm), builds the model (weights: outside
   iterations, from the fallback), runs one unmonitored warm-up iteration (cuDNN/cuBLAS
   handles and workspaces made once), one profiling iteration (recorded, served by the
   fallback), re-plans while a warm-up iteration departs, then the timed iterations at
   planned addresses; it writes the metrics and the last iteration's gradients;
2. runs the same schedule with the plain ``torch`` executor in this process (the caching
   allocator): its ``max_memory_reserved`` is the row's ``caching_reserved_bytes``, and its
   gradients are compared with the planned run's (``grad_error_vs_caching``, 0.0 when
   equal).

Metrics: ``arena_bytes`` (the arena held), ``plan_bytes`` and ``plan_max_live_bytes`` (the
plan's arena and the trace's max-live bytes), ``fallback_peak_bytes`` (the fallback's
high-water mark in the timed iterations: weights, gradients and departures),
``planned_reserved_bytes`` (the most the allocator held at once in the timed iterations,
arena plus live fallback blocks: what ``caching_reserved_bytes``, the caching allocator's
``max_memory_reserved`` after the same reset, is compared with), ``planned_process_peak_bytes``
(the same over the whole process: the warm-up and profiling iterations, served by the
fallback before the arena exists, included), ``departures`` (requests of the timed
iterations that left the plan), ``caching_reserved_bytes``, the timing metrics of the
torch executor. Options: ``allocator`` (a registered allocator's name, default
``bestfit``), ``warmup`` (at least 2), ``iterations``, ``alignment``, ``seed``, ``duplex`` (default: the schedule's layout),
``timeout_s``.

On the CPU (no pluggable allocator) the path is emulated: the torch executor runs the
schedule on the CPU (time, gradients), and the simulator's memory trace of the schedule
is played through the same RealAddressAllocator over a fake address space; the caching
figure is the ``caching`` allocator model's arena for that trace; ``emulated`` is 1.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.errors import MembudgetError
from harness.model import (
    DEVICE_OFFLOAD_START, Profile, Run, Schedule, chosen_algorithms, duplex_of, from_dict, to_dict,
)
from harness.protocols import Workload

__all__ = ["GRAD_TOLERANCE", "TorchPlannedExecutor", "main", "planned_run_problems"]


GRAD_TOLERANCE = 1e-2  # the largest relative gradient error that counts as the caching run's gradients
PEAK_TOLERANCE = 1.05  # how far the profiled trace's max-live bytes may exceed the schedule's predicted peak


def planned_run_problems(metrics: dict[str, float]) -> list[str]:
    """What is wrong with an ``ok`` planned run, by its metrics (empty: nothing): gradients not the
    caching run's (``grad_error_vs_caching`` at most ``GRAD_TOLERANCE``), timed requests that left the
    plan (``departures``), no request served from the plan, an arena smaller than the plan or a plan
    smaller than its trace's max-live bytes, or a trace whose max-live bytes exceed the schedule's
    predicted peak by more than ``PEAK_TOLERANCE`` (the run did not keep the schedule's memory: e.g.
    every prefetch let in at once). The GPU test and ``benchmarks/gpu/planned_placement.py`` judge a
    run by it."""
    m, problems = metrics, []
    error = m.get("grad_error_vs_caching", math.nan)
    if not error <= GRAD_TOLERANCE:  # NaN (no caching run to compare with) is a problem too
        problems.append(f"grad_error_vs_caching {error:.1e} > {GRAD_TOLERANCE:g}")
    if m.get("departures", math.nan) != 0:
        problems.append(f"departures {m.get('departures')}")
    if not m.get("planned_requests", 0) > 0:
        problems.append("no request served from the plan")
    live, plan, arena = (m.get(k, math.nan) for k in ("plan_max_live_bytes", "plan_bytes", "arena_bytes"))
    if not live <= plan <= arena:
        problems.append(f"not max-live {live:.0f} <= plan {plan:.0f} <= arena {arena:.0f}")
    predicted = m.get("predicted_peak_bytes")
    if predicted is not None and not live <= PEAK_TOLERANCE * predicted:
        problems.append(f"plan max-live {live:.0f} above the schedule's predicted peak {predicted:.0f}")
    if "allocator_errors" in m:
        problems.append(f"allocator_errors {m['allocator_errors']}")
    return problems


def _allocator(name: str) -> Any:
    from harness.plugins import registry

    return registry().allocator(name)


class TorchPlannedExecutor:
    """``torch-planned``: the torch executor with every iteration's allocation at planned addresses."""

    name = "torch-planned"
    description = ("Runs the schedule with one arena at the offsets an allocator planned from a profiled "
                   "iteration (CUDA: pluggable allocator; CPU: emulated), beside the caching allocator's reserve")

    def __init__(self, allocator: str = "bestfit", device: str | None = None, warmup: int = 3,
                 iterations: int = 5, alignment: int = 512, seed: int = 0, duplex: bool | None = None,
                 timeout_s: float = 1800.0) -> None:
        if warmup < 2:
            raise ValueError("torch-planned needs warmup >= 2 (one unmonitored, one profiling iteration)")
        self.allocator, self.device, self.warmup, self.iterations = allocator, device, warmup, iterations
        self.alignment, self.seed, self.duplex, self.timeout_s = alignment, seed, duplex, timeout_s

    def _torch(self, device: str, **extra: Any):
        from harness.executors.torch_executor import TorchExecutor

        return TorchExecutor(device=device, warmup=self.warmup, iterations=self.iterations, duplex=self.duplex,
                             seed=self.seed, enforce_budget=False, **extra)

    def run(self, schedule: Schedule, profile: Profile, workload: Workload | None = None) -> Run:
        """Run ``schedule`` at planned addresses: on CUDA in a child process with the pluggable
        allocator, on the CPU with the arena emulated (see the module docstring)."""
        from harness.executors.torch_executor import check_compatible, resolve_device, workload_on

        check_compatible(schedule, profile)
        device = resolve_device(workload, self.device)
        workload = replace(workload_on(workload, profile, device), device=str(device))
        if device.type == "cuda":
            return self._run_cuda(schedule, profile, workload)
        return self._run_emulated(schedule, profile, workload)

    # -- CPU: the torch executor for time and gradients, the simulator's trace for memory
    def _run_emulated(self, schedule: Schedule, profile: Profile, workload: Workload) -> Run:
        from harness.allocators.caching import CachingAllocator
        from harness.allocators.realaddr import FakeMemory, RealAddressAllocator, replay, trace_events
        from harness.allocators.trace import to_int_trace
        from harness.simulate.executor import simulate

        run = self._torch(str(workload.device)).run(schedule, profile, workload)
        trace = simulate(schedule, profile, duplex=self.duplex, offload_start=DEVICE_OFFLOAD_START,
                         with_trace=True).trace
        blocks = [b for b in trace if b.size > 0]
        events = trace_events(to_int_trace(blocks))
        real = RealAddressAllocator(_allocator(self.allocator), FakeMemory(alignment=self.alignment),
                                    alignment=self.alignment)
        for _ in range(self.warmup - 1):  # the CPU has no unmonitored warm-up to make
            replay(real, events)
        before = real.stats.departures
        for _ in range(self.iterations):
            replay(real, events)
        metrics = {**run.metrics, **real.summary(), "departures": real.stats.departures - before,
                   "caching_reserved_bytes": int(CachingAllocator().place(blocks).arena_bytes),
                   "emulated": 1}
        return replace(run, executor=self.name, metrics=metrics)

    # -- CUDA: the planned run in its own process, the caching run here
    def _run_cuda(self, schedule: Schedule, profile: Profile, workload: Workload) -> Run:
        autotuned = autotuned_stages(schedule, profile)
        if autotuned:
            return self._failed(schedule, profile, (
                f"torch-planned cannot run cuDNN's autotuned algorithm (stage {', '.join(map(str, autotuned))}): "
                "its benchmark search asks the allocator for cacheInfo, which PyTorch's pluggable allocator "
                "does not have; plan those stages with another algorithm"))
        with tempfile.TemporaryDirectory(prefix="membudget-planned-") as tmp:
            job = Path(tmp) / "job.json"
            job.write_text(json.dumps({
                "schedule": to_dict(schedule), "profile": to_dict(profile),
                "workload": {"model": workload.model, "batch_size": workload.batch_size,
                             "input_size": list(workload.input_size), "device": str(workload.device),
                             "dtype": workload.dtype},
                "options": {"allocator": self.allocator, "warmup": self.warmup, "iterations": self.iterations,
                            "alignment": self.alignment, "seed": self.seed,
                            "duplex": duplex_of(schedule, self.duplex)},
                "out": tmp,
            }))
            try:
                proc = subprocess.run([sys.executable, "-m", "harness.executors.planned", str(job)],
                                      capture_output=True, text=True, timeout=self.timeout_s, env=dict(os.environ))
            except subprocess.TimeoutExpired:
                return self._failed(schedule, profile, f"the planned process ran past {self.timeout_s} s")
            result = Path(tmp) / "run.json"
            if proc.returncode != 0 or not result.exists():
                tail = (proc.stderr or proc.stdout or "").strip().splitlines()
                why = tail[-1] if tail else f"exit status {proc.returncode}"
                return self._failed(schedule, profile, f"the planned process failed: {why}")
            planned = from_dict(Run, json.loads(result.read_text()))
            if planned.status != "ok":
                return planned
            import torch

            grads = torch.load(Path(tmp) / "grads.pt")
        baseline_executor = self._torch(str(workload.device))
        baseline = baseline_executor.run(schedule, profile, workload)
        metrics = dict(planned.metrics)
        if baseline.status == "ok":
            from harness.executors.grad_check import largest_relative_error

            chain = baseline_executor._chain
            got = {n: p.grad for n, p in chain.model.named_parameters() if p.grad is not None}
            metrics["grad_error_vs_caching"] = largest_relative_error(
                {n: g.to(next(iter(got.values())).device) for n, g in grads.items()}, got)
            metrics["caching_reserved_bytes"] = baseline.metrics.get("max_memory_reserved", math.nan)
            metrics["caching_allocated_bytes"] = baseline.metrics.get("max_memory_allocated", math.nan)
            metrics["caching_time_median_s"] = baseline.metrics.get("time_median_s", math.nan)
            if "grad_error" in baseline.metrics:
                metrics["grad_error"] = baseline.metrics["grad_error"]
        return replace(planned, metrics=metrics)

    def _failed(self, schedule: Schedule, profile: Profile, message: str) -> Run:
        return Run(executor=self.name, planner=schedule.planner, status="error", message=message,
                   makespan=math.nan, compute_time=profile.compute_time, peak_bytes=0, moved_bytes=0)


def autotuned_stages(schedule: Schedule, profile: Profile) -> list[int]:
    """The stages ``schedule`` runs with cuDNN's benchmark mode (``cudnn_autotuned``)."""
    return [i for i, name in chosen_algorithms(schedule, profile).items() if name == "cudnn_autotuned"]


# --------------------------------------------------------------------------- the planned process


def _planned_execution_class():
    from harness.executors.torch_executor import _Execution

    class PlannedExecution(_Execution):
        """The torch executor's iterations, each one monitored by the real-address allocator."""

        # under the pluggable allocator a free synchronises the copy streams on the host, so an offload's
        # memory is free once its storage shrinks; and asking the copies' events whether they are over
        # would make the requests' order depend on timing, which the plan cannot follow
        tracks_copies_in_flight = False
        real: Any = None
        hook: Any = None  # the PluggableAllocator: what it could not serve
        k = 0
        departures_before = 0

        def _reset_stats(self) -> None:  # the pluggable allocator keeps no statistics
            import torch

            self._reset_counts()
            torch.cuda.synchronize(self.chain.device)
            self.departures_before = self.real.stats.departures
            self.real.reset_peaks()  # as the caching run resets its peaks before the timed iterations

        def _iteration(self, record: bool, timeline: bool = False) -> float:
            import torch

            from harness.executors._cuda_pluggable import as_out_of_memory

            k, self.k = self.k, self.k + 1
            monitored = k > 0  # the first makes handles and workspaces lazily: once, not part of the sequence
            if monitored:
                self.real.begin_iteration()
            try:
                time = super()._iteration(record, timeline)
                torch.cuda.synchronize(self.chain.device)
                if self.hook is not None and self.hook.out_of_memory is not None:
                    raise MemoryError(self.hook.out_of_memory)  # a NULL went to torch: nothing after it holds
            except BaseException as exc:
                if monitored:
                    try:  # close the iteration, but never hide why it failed (e.g. an oom) behind a re-plan
                        self.real.end_iteration()
                    except Exception:  # noqa: BLE001
                        pass
                meant = as_out_of_memory(exc, self.hook)
                if meant is exc:
                    raise
                raise meant from exc
            if monitored:
                self.real.end_iteration()
            return time

        def _oom(self, exc, prediction):
            self.cuda = False  # as in _report: no caching-allocator statistics to read here
            try:
                run = super()._oom(exc, prediction)
            finally:
                self.cuda = True
            return replace(run, executor=TorchPlannedExecutor.name, peak_bytes=int(self.real.reserved_bytes),
                           metrics={**run.metrics, **self.real.summary()})

        def _oom_message(self, text):
            # the planned process caps nothing (its arena is the plan): the device itself ran out
            return f"the device ran out of memory (planned placement, no budget cap): {text}"

        def _report(self, times, moved, stall, prediction):
            self.cuda = False  # the caching allocator's statistics raise under a pluggable allocator
            try:
                run = super()._report(times, moved, stall, prediction)
            finally:
                self.cuda = True
            metrics = {**run.metrics, **self.real.summary(),
                       "departures": self.real.stats.departures - self.departures_before}
            return replace(run, executor=TorchPlannedExecutor.name,
                           peak_bytes=int(self.real.reserved_bytes), metrics=metrics)

    return PlannedExecution


def main(argv: list[str] | None = None) -> int:
    """The planned process: ``python -m harness.executors.planned JOB.json``."""
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text())
    out = Path(job["out"])
    opts = job["options"]
    import torch

    from harness.allocators.realaddr import RealAddressAllocator
    from harness.executors._cuda_pluggable import CudaRuntime, PlannedPathError, PluggableAllocator

    try:
        runtime = CudaRuntime()
        real = RealAddressAllocator(_allocator(opts["allocator"]), runtime, alignment=opts["alignment"])
        hook = PluggableAllocator(real, runtime)
        hook.install()
    except (PlannedPathError, MembudgetError) as exc:
        print(f"torch-planned: {exc}", file=sys.stderr)
        return 2
    from harness.executors._torch_chain import build_chain
    from harness.executors.torch_executor import TorchExecutor, check_compatible

    schedule = from_dict(Schedule, job["schedule"])
    profile = from_dict(Profile, job["profile"])
    w = job["workload"]
    workload = Workload(w["model"], w["batch_size"], tuple(w["input_size"]), w["device"], w["dtype"])
    device = torch.device(workload.device)
    chain = build_chain(workload, device)
    check_compatible(schedule, profile, chain)
    ex = TorchExecutor(device=str(device), warmup=opts["warmup"], iterations=opts["iterations"],
                       duplex=opts["duplex"], seed=opts["seed"], enforce_budget=False, grad_check=False)
    from harness.executors.torch_executor import _safe_predict

    execution = _planned_execution_class()(ex, schedule, profile, chain)
    execution.real, execution.hook = real, hook
    if schedule.transfers and hasattr(execution.copies, "d2h"):
        c = execution.copies
        hook.set_streams(c.compute.cuda_stream, [c.d2h.cuda_stream, c.h2d.cuda_stream])
    try:
        with torch.autograd.set_multithreading_enabled(False):  # one thread: one request order
            run = execution.measure(_safe_predict(schedule, profile, opts["duplex"]))
    finally:
        try:
            execution.close()
        except Exception:  # noqa: BLE001
            if hook.out_of_memory is None:
                raise  # after a NULL handed to torch every CUDA call fails; the oom row says why
    if hook.errors or real.stats.errors:
        errors = hook.errors + real.stats.errors
        run = replace(run, metrics={**run.metrics, "allocator_errors": len(errors)},
                      message=(run.message + " " if run.message else "") + f"allocator: {errors[0]}")
    if run.status == "ok":  # the caching run's gradients are compared with these
        grads = {n: p.grad.detach().cpu() for n, p in chain.model.named_parameters() if p.grad is not None}
        torch.save(grads, out / "grads.pt")
    (out / "run.json").write_text(json.dumps(to_dict(run)))
    return 0


if __name__ == "__main__":
    code = main()
    # leave without interpreter teardown: the pluggable allocator's ctypes callbacks stay
    # installed, and tensors freed during finalisation would call into a dismantled
    # interpreter; a crash there would discard the run.json already written
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
