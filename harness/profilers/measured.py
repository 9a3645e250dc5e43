"""The ``torch`` profiler: a chain profile measured by running the model on a CPU or a CUDA GPU.

Sizes come from one instrumented iteration (``record_chain``, the code the analytic
profiler runs on ``meta``, so the two agree exactly on the CPU). Times come from
running each stage alone, from its recorded input: ``warmup`` untimed runs, then the
median of ``repeats`` timed ones, with ``time.perf_counter`` on the CPU and CUDA events
on a GPU. A backward is timed after an untimed forward that rebuilds its graph, onto
dropped gradients (as the torch executor's iterations run it: ``_time_once``).

On CUDA the workspaces are measured as peak-memory deltas (``max_memory_allocated``
above what the operation leaves allocated), the host link with pinned copies of the
sizes the stages save (``link_sizes``), and the convolution algorithms are cuDNN's
heuristic choice, cuDNN autotuned (``benchmark``) and PyTorch's native kernels (cuDNN off). On the CPU the
workspaces are what ``record_chain`` sees the operators allocate, the "host link" is a copy
between two host buffers, and the algorithms are oneDNN and PyTorch's native kernels.
"""

from __future__ import annotations

import statistics
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Iterator

import torch

from harness.model import Algorithm, Profile, Stage
from harness.profilers import devices
from harness.profilers.analytic import NOTES
from harness.errors import ProfilingError
from harness.chain.extract import Chain, extract
from harness.profilers.instrument import ChainRecord, StageRecord, record_chain
from harness.protocols import Workload


def _device(name: str) -> torch.device:
    refusal = devices.torch_device_refusal(name)
    if refusal:
        raise ProfilingError(refusal)
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ProfilingError("the torch profiler was asked for cuda, but no CUDA GPU is available here")
    return torch.device(name)


class Timer:
    """Times a callable on a device: perf_counter on the CPU, CUDA events on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, fn: Callable[[], Any]) -> float:
        """Seconds ``fn()`` took on the device."""
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


@dataclass
class _StageRun:
    """What is needed to run one stage alone: its env at entry (input leaf, carried values)."""

    env: dict[int, Any]
    out_like: tuple[torch.Size, torch.dtype] | None  # the output's shape and dtype, if it needs a gradient


class StageRunner:
    """Runs the stages of a chain one at a time from recorded inputs (no hooks, no counting)."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.runs: list[_StageRun] = []
        graph, env = chain.graph, {chain.graph.input_index: chain.example}
        x = chain.example
        for s, span in enumerate(chain.plan.stages):
            leaf = x.detach()
            if s > 0 and x.requires_grad and x.is_floating_point():
                leaf.requires_grad_(True)
            env[span.input] = leaf
            # what crosses a cut: the stage input, plain values, tensors that do not depend on
            # the input (detached: constants of the workload for timing purposes)
            entry = {k: v.detach() if isinstance(v, torch.Tensor) and k != span.input else v
                     for k, v in env.items()}
            graph.run(span.first, span.last, env)
            out = env[span.output]
            self.runs.append(_StageRun(entry, (out.shape, out.dtype) if out.requires_grad else None))
            x = out
        self.params = list(graph.gm.parameters())

    def forward(self, s: int) -> torch.Tensor:
        """Run F_s once and return its output (with its autograd graph)."""
        span = self.chain.plan.stages[s]
        env = dict(self.runs[s].env)
        leaf = env[span.input]
        if leaf.requires_grad:
            leaf.grad = None
        self.chain.graph.run(span.first, span.last, env)
        return env[span.output]

    def output_grad(self, s: int) -> torch.Tensor | None:
        """A gradient for the output of F_s (ones), or None when its backward does nothing."""
        like = self.runs[s].out_like
        return None if like is None else torch.ones(like[0], dtype=like[1], device=self.chain.example.device)

    def backward(self, s: int, out: torch.Tensor, grad: torch.Tensor | None) -> None:
        """Run B_s on the graph ``out`` came with, from ``grad``."""
        if grad is not None and out.requires_grad:
            torch.autograd.backward(out, grad)

    def drop_grads(self) -> None:
        """Forget the parameters' gradients: the next backward assigns them instead of adding to them."""
        for p in self.params:
            p.grad = None


@dataclass
class TorchProfiler:
    """Measures a chain profile on a CPU or CUDA device (``workload.device``)."""

    warmup: int = 2
    repeats: int = 5
    variant_batches: tuple[int, ...] = ()
    algorithms: bool = True
    calibrate: bool = True  # CUDA: measure runtime_bytes from a keep-all iteration (harness.device_memory)
    name: str = "torch"
    description: str = "measured on cpu or cuda: per-stage times (median), saved bytes, workspaces, host link"

    def profile(self, workload: Workload) -> Profile:
        """Measure the workload on its device; ``variant_batches`` add measured sub-batch profiles."""
        device = _device(workload.device)
        main = self._one(workload, device)
        variants = tuple(self._one(replace(workload, batch_size=b), device)
                         for b in self.variant_batches if b != workload.batch_size)
        return replace(main, variants=variants) if variants else main

    def _one(self, workload: Workload, device: torch.device) -> Profile:
        chain = extract(workload, device)
        try:
            record = record_chain(chain.graph, chain.plan, chain.example)
            runner = StageRunner(chain)
            timer = Timer(device)
            stages = []
            for s, r in enumerate(record.stages):
                fwd, bwd = self._times(runner, s, timer)
                fwd_ws, bwd_ws = (self._cuda_workspaces(runner, s, r) if device.type == "cuda"
                                  else (r.fwd_workspace, r.bwd_workspace))
                algorithms = self._algorithms(runner, s, r, timer, device, (fwd, bwd, fwd_ws, bwd_ws),
                                              workload.batch_size) if self.algorithms and _has_conv(r) else ()
                stages.append(Stage(
                    name=r.span.name, kind=r.span.kind, fwd_time=fwd, bwd_time=bwd,
                    input_bytes=r.input_bytes, saved_bytes=r.saved_bytes, grad_bytes=r.grad_bytes,
                    fwd_workspace=fwd_ws, bwd_workspace=bwd_ws, algorithms=algorithms,
                    flops=r.fwd.total_flops + r.bwd.total_flops, output_saved_bytes=r.output_saved_bytes,
                ))
        except ProfilingError:
            raise
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ProfilingError(f"{workload.model}: measuring on {device} failed: {type(exc).__name__}: {exc}") from None
        profile = self._profile(workload, device, record, tuple(stages))
        if device.type == "cuda" and self.calibrate:
            del chain, record, runner
            profile = replace(profile, runtime_bytes=_runtime_bytes(profile, workload, device))
        return profile

    # -- times
    def _times(self, runner: StageRunner, s: int, timer: Timer) -> tuple[float, float]:
        """Median forward and backward seconds of stage ``s`` after ``warmup`` untimed runs."""
        fwd_times, bwd_times = [], []
        for k in range(self.warmup + self.repeats):
            tf, tb = _time_once(runner, s, timer)
            if k >= self.warmup:
                fwd_times.append(tf)
                bwd_times.append(tb)
        runner.drop_grads()
        return statistics.median(fwd_times), statistics.median(bwd_times)

    # -- CUDA workspaces
    def _cuda_workspaces(self, runner: StageRunner, s: int, r: StageRecord) -> tuple[int, int]:
        device = runner.chain.example.device
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = runner.forward(s)
        torch.cuda.synchronize(device)
        after = torch.cuda.memory_allocated(device)
        fwd_ws = max(0, torch.cuda.max_memory_allocated(device) - after)
        had_grad = {id(p) for p in runner.params if p.grad is not None}
        grad = runner.output_grad(s)
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        runner.backward(s, out, grad)
        torch.cuda.synchronize(device)
        new_grads = sum(p.grad.numel() * p.grad.element_size() for p in runner.params
                        if p.grad is not None and id(p) not in had_grad)
        bwd_ws = max(0, torch.cuda.max_memory_allocated(device) - before - r.grad_bytes - new_grads)
        del out, grad
        runner.drop_grads()
        return fwd_ws, bwd_ws

    # -- convolution algorithms
    def _algorithms(self, runner: StageRunner, s: int, r: StageRecord, timer: Timer, device: torch.device,
                    default: tuple[float, float, int, int], batch: int) -> tuple[Algorithm, ...]:
        """The stage under each algorithm setting; the current default reuses the default figures."""
        found = []
        current = _default_algorithm(device)
        for name, context in _algorithm_contexts(device):
            if name == current:
                found.append(Algorithm(name, *default))
                continue
            with context():
                fwd, bwd = self._times(runner, s, timer)
                if device.type == "cuda":
                    fwd_ws, bwd_ws = self._cuda_workspaces(runner, s, r)
                else:  # not measurable on the CPU: native im2col over the batch, oneDNN's scratchpad unknown
                    extra = r.im2col_bytes * batch if name == "native" else 0
                    fwd_ws, bwd_ws = r.fwd_workspace + extra, r.bwd_workspace + extra
            found.append(Algorithm(name, fwd, bwd, fwd_ws, bwd_ws))
        found.sort(key=lambda a: (a.fwd_workspace + a.bwd_workspace, a.fwd_time + a.bwd_time))
        return tuple(found)

    # -- profile
    def _profile(self, workload: Workload, device: torch.device, record: ChainRecord,
                 stages: tuple[Stage, ...]) -> Profile:
        link = host_link(device, link_sizes(stages))
        if device.type == "cuda":
            memory = torch.cuda.get_device_properties(device).total_memory
            name = torch.cuda.get_device_name(device)
        else:
            memory, name = _host_memory(), "cpu"
        return Profile(
            model=workload.model, batch_size=workload.batch_size, input_shape=tuple(workload.input_size),
            device=name, device_memory=memory, d2h_bandwidth=link.d2h, h2d_bandwidth=link.h2d,
            weight_bytes=record.weight_bytes, output_bytes=record.output_bytes, stages=stages,
            dtype=workload.dtype, profiler="torch", measured=True,
            notes={
                **NOTES,
                "times": f"median of {self.repeats} runs after {self.warmup} warm-up runs, each stage alone "
                         f"({'CUDA events' if device.type == 'cuda' else 'time.perf_counter'})",
                "workspace": ("peak-memory delta (torch.cuda.max_memory_allocated)" if device.type == "cuda"
                              else "liveness estimate (no allocator statistics on the CPU)"),
                "host_link": ("pinned host <-> device copies" if device.type == "cuda"
                              else "copies between two host buffers (the CPU executor's 'host store')")
                             + " at the sizes the stages save, all sizes together (d2h / h2d): " + link.describe(),
                "torch": torch.__version__,
            },
        )


def _runtime_bytes(profile: Profile, workload: Workload, device: torch.device) -> int:
    """CUDA: a keep-all iteration's measured reservation over the caching allocator model's arena for
    the chain model's trace of it (``harness.device_memory.calibrate_runtime_bytes``)."""
    from harness.bounds import peak_memory
    from harness.device_memory import calibrate_runtime_bytes
    from harness.executors.torch_executor import TorchExecutor
    from harness.schedules import keep_all_schedule

    torch.cuda.empty_cache()
    keep_all = keep_all_schedule(profile, peak_memory(profile))
    executor = TorchExecutor(device=str(device), warmup=1, iterations=1, enforce_budget=False)
    run = executor.run(keep_all, profile, workload)
    del executor
    torch.cuda.empty_cache()
    if run.status != "ok":
        raise ProfilingError(f"{workload.model}: the keep-all calibration iteration failed: {run.message}")
    return calibrate_runtime_bytes(profile, int(run.metrics["max_memory_reserved"]))


def _time_once(runner: StageRunner, s: int, timer: Timer) -> tuple[float, float]:
    """One timed forward of stage ``s``, then one timed backward on the graph it built.

    The parameters' gradients are dropped before the backward, untimed: the torch executor drops
    them before every iteration, so its B_s assigns each gradient (autograd keeps the tensor it
    computed), where a backward onto the last run's gradients adds to them (a kernel per parameter)."""
    box: dict[str, Any] = {"grad": runner.output_grad(s)}
    tf = timer(lambda: box.__setitem__("out", runner.forward(s)))
    runner.drop_grads()
    tb = timer(lambda: runner.backward(s, box["out"], box["grad"]))
    return tf, tb


def _has_conv(r: StageRecord) -> bool:
    return any(r.fwd.conv)


def _default_algorithm(device: torch.device) -> str:
    """The name of the setting the stage's default figures were measured with."""
    if device.type == "cuda":
        if not torch.backends.cudnn.enabled:
            return "native"
        return "cudnn_autotuned" if torch.backends.cudnn.benchmark else "cudnn_heuristic"
    return "onednn" if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled else "native"


@contextmanager
def _quiet(flags: Callable[[], Any]) -> Iterator[None]:
    """Enter a ``torch.backends`` flags context without its informational warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with flags():
            yield


def _algorithm_contexts(device: torch.device) -> list[tuple[str, Callable[[], Any]]]:
    """(name, context factory) for each algorithm setting worth measuring on ``device``."""
    if device.type == "cuda":
        return [
            ("cudnn_heuristic", lambda: _quiet(lambda: torch.backends.cudnn.flags(enabled=True, benchmark=False))),
            ("cudnn_autotuned", lambda: _quiet(lambda: torch.backends.cudnn.flags(enabled=True, benchmark=True))),
            ("native", lambda: _quiet(lambda: torch.backends.cudnn.flags(enabled=False))),
        ]
    contexts: list[tuple[str, Callable[[], Any]]] = [
        ("native", lambda: _quiet(lambda: torch.backends.mkldnn.flags(enabled=False)))]
    if torch.backends.mkldnn.is_available():
        contexts.insert(0, ("onednn", lambda: _quiet(lambda: torch.backends.mkldnn.flags(enabled=True))))
    return contexts


LINK_SIZES = (1 << 20, 16 << 20, 64 << 20)  # when no stage saves anything
LINK_SIZE_RANGE = (1 << 20, 1 << 30)  # the copies timed: 1 MiB to 1 GiB


def link_sizes(stages: tuple[Stage, ...]) -> tuple[int, ...]:
    """The copy sizes to time the host link at: the quartiles and the largest of the bytes the
    stages save (a schedule moves a stage's saved data, so these are the sizes it copies),
    within ``LINK_SIZE_RANGE``.

    The 2026-11-22 H100 run timed 1-64 MiB copies (54.5 GB/s) while ResNet-50 at batch 256
    saves a median 668 MB per stage (up to 2.7 GB), and its copy-bound schedules ran as if
    the link gave 47 GB/s (vDNN's three variants within 2% of their measured times once
    simulated at that rate: docs/gpu.md, "Where the measured time goes").
    """
    saved = sorted(s.saved_bytes for s in stages if s.saved_bytes > 0)
    if not saved:
        return LINK_SIZES
    lo, hi = LINK_SIZE_RANGE
    picks = {saved[(len(saved) - 1) * q // 4] for q in (1, 2, 3, 4)}
    return tuple(sorted({min(max(int(b), lo), hi) for b in picks}))


@dataclass(frozen=True)
class HostLink:
    """The host link as timed: the rate each way over all the sizes together, and per size."""

    d2h: float  # bytes/s: the summed sizes over the summed median copy times
    h2d: float
    per_size: tuple[tuple[int, float, float], ...]  # (bytes, d2h bytes/s, h2d bytes/s)

    def describe(self) -> str:
        """One line for a profile's notes: the rate each way at every size timed."""
        return "; ".join(f"{size / 2**20:.0f} MiB: {d2h / 1e9:.1f} / {h2d / 1e9:.1f} GB/s"
                         for size, d2h, h2d in self.per_size)


def host_link(device: torch.device, sizes: tuple[int, ...] = LINK_SIZES, repeats: int = 3) -> HostLink:
    """Device-to-host and host-to-device copies of each of ``sizes`` (pinned host memory on CUDA),
    the median of ``repeats`` after one untimed; each way's rate is the summed sizes over the
    summed times: the rate of a mix of those copies, which is what a schedule's copy engine
    sees, where the best size's rate would be a bound that no schedule reaches."""
    timer = Timer(device)
    per_size = []
    pinned = device.type == "cuda"
    for size in sizes:
        host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
        dev = torch.empty(size, dtype=torch.uint8, device=device)
        d2h = statistics.median([timer(partial(host.copy_, dev, non_blocking=pinned))
                                 for _ in range(repeats + 1)][1:])
        h2d = statistics.median([timer(partial(dev.copy_, host, non_blocking=pinned))
                                 for _ in range(repeats + 1)][1:])
        per_size.append((size, max(d2h, 1e-9), max(h2d, 1e-9)))
        del host, dev
    total = sum(size for size, _, _ in per_size)
    return HostLink(total / sum(t for _, t, _ in per_size), total / sum(t for _, _, t in per_size),
                    tuple((size, size / d2h, size / h2d) for size, d2h, h2d in per_size))


def _host_memory() -> int:
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
