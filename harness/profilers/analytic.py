"""The ``analytic`` profiler: a chain profile estimated without running the model for real.

PALEO-style (papers/002 section 2.2): the model is built and run on PyTorch's ``meta``
device, so shapes, saved tensors and gradients are exact while nothing is allocated
(ResNet-152 at batch 256 on 1000x1000 images costs the same as at batch 1). Each aten
operation's FLOPs come from ``torch.utils.flop_counter`` and the bytes it touches from
its arguments; its time is the roofline max(FLOPs / peak, bytes / bandwidth) of a
``DeviceSpec``. A stage's time is the sum over its operations, divided by the
efficiency factor of the stage's kind, plus a launch latency per operation.

Convolution stages get two modelled algorithms (first the memory-optimal one):
``implicit_gemm`` without workspace, slower by ``IMPLICIT_GEMM_SLOWDOWN`` on the
convolution part, and ``gemm``, the default (fastest) one, whose workspace is one
sample's im2col matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.model import Algorithm, Profile, Stage
from harness.profilers import devices
from harness.profilers.devices import DeviceSpec, Efficiency
from harness.errors import ProfilingError
from harness.chain.extract import extract
from harness.profilers.instrument import ChainRecord, OpStats, StageRecord, record_chain
from harness.protocols import Workload

NOTES = {
    "weight_bytes": "parameters + their gradients + buffers; no optimizer state",
    "flops": "Stage.flops is forward + backward FLOPs (torch.utils.flop_counter: a multiply-add is 2)",
    "attribution": "a boundary tensor saved by the stage before it and/or the stage after it is counted "
                   "once, in the later stage's saved_bytes",
    "grad_bytes": "0 for the first stage (the data needs no gradient)",
}


@dataclass
class AnalyticProfiler:
    """Estimates a chain profile on the meta device with a per-stage roofline of a device spec."""

    efficiency: Efficiency = field(default_factory=Efficiency)
    variant_batches: tuple[int, ...] = ()
    name: str = "analytic"
    description: str = "estimated on the meta device: exact sizes, FLOPs and a roofline per stage (device spec)"

    def profile(self, workload: Workload) -> Profile:
        """The workload's chain profile for the device spec named by ``workload.device``."""
        spec = device_spec(workload.device)
        main = self._one(workload, spec)
        variants = []
        for b in self.variant_batches:
            if b != workload.batch_size:
                variants.append(self._one(_with_batch(workload, b), spec))
        if variants:
            from dataclasses import replace

            main = replace(main, variants=tuple(variants))
        return main

    def _one(self, workload: Workload, spec: DeviceSpec) -> Profile:
        chain = extract(workload, "meta")
        try:
            record = record_chain(chain.graph, chain.plan, chain.example)
        except ProfilingError:
            raise
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
            raise ProfilingError(f"{workload.model}: the training iteration failed on the meta device: {exc}") from None
        return to_profile(record, workload, spec, self.efficiency)


def device_spec(name: str) -> DeviceSpec:
    """The spec for ``name``; ``cuda`` means the GPU of this machine when it is listed."""
    if name.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            found = devices.match_gpu(torch.cuda.get_device_name(torch.device(name)))
            if found is not None:
                return found
        raise ProfilingError(
            f"the analytic profiler needs a device spec, not {name!r} (this GPU is not in the table); "
            f"choose one of {', '.join(devices.names())}"
        )
    try:
        return devices.spec(name)
    except KeyError as exc:
        raise ProfilingError(f"the analytic profiler needs a device spec: {exc.args[0]}") from None


def _with_batch(workload: Workload, batch: int) -> Workload:
    from dataclasses import replace

    return replace(workload, batch_size=batch)


def roofline(stats: OpStats, spec: DeviceSpec, dtype: str, conv_only: bool | None = None) -> float:
    """Sum over operations of max(FLOPs / peak, bytes / bandwidth), in seconds (efficiency 1).

    ``conv_only`` True/False restricts the sum to convolutions / everything else.
    """
    peak, bandwidth = spec.flops_for(dtype), spec.memory_bandwidth
    total = 0.0
    for f, b, c in zip(stats.flops, stats.nbytes, stats.conv):
        if conv_only is None or c == conv_only:
            total += max(f / peak, b / bandwidth)
    return total


def _time(stats: OpStats, spec: DeviceSpec, dtype: str, eff: float, conv_factor: float = 1.0) -> float:
    conv = roofline(stats, spec, dtype, conv_only=True)
    rest = roofline(stats, spec, dtype, conv_only=False)
    return (conv * conv_factor + rest) / eff + stats.n_ops * spec.launch_latency


def _stage(r: StageRecord, spec: DeviceSpec, dtype: str, efficiency: Efficiency) -> Stage:
    eff = efficiency.of(r.span.kind)
    fwd, bwd = _time(r.fwd, spec, dtype, eff), _time(r.bwd, spec, dtype, eff)
    fwd_ws, bwd_ws = r.fwd_workspace + r.im2col_bytes, r.bwd_workspace + r.im2col_bytes
    algorithms: tuple[Algorithm, ...] = ()
    if r.im2col_bytes > 0:
        slow = devices.IMPLICIT_GEMM_SLOWDOWN
        algorithms = (
            Algorithm("implicit_gemm", _time(r.fwd, spec, dtype, eff, slow), _time(r.bwd, spec, dtype, eff, slow),
                      r.fwd_workspace, r.bwd_workspace),
            Algorithm("gemm", fwd, bwd, fwd_ws, bwd_ws),
        )
    return Stage(
        name=r.span.name, kind=r.span.kind, fwd_time=fwd, bwd_time=bwd,
        input_bytes=r.input_bytes, saved_bytes=r.saved_bytes, grad_bytes=r.grad_bytes,
        fwd_workspace=fwd_ws, bwd_workspace=bwd_ws, algorithms=algorithms,
        flops=r.fwd.total_flops + r.bwd.total_flops, output_saved_bytes=r.output_saved_bytes,
    )


def to_profile(record: ChainRecord, workload: Workload, spec: DeviceSpec, efficiency: Efficiency) -> Profile:
    """The analytic ``Profile`` of an instrumented meta iteration on ``spec``."""
    stages = tuple(_stage(r, spec, workload.dtype, efficiency) for r in record.stages)
    return Profile(
        model=workload.model,
        batch_size=workload.batch_size,
        input_shape=tuple(workload.input_size),
        device=spec.name,
        device_memory=spec.memory,
        d2h_bandwidth=spec.host_bandwidth,
        h2d_bandwidth=spec.host_bandwidth,
        weight_bytes=record.weight_bytes,
        output_bytes=record.output_bytes,
        stages=stages,
        dtype=workload.dtype,
        profiler="analytic",
        measured=False,
        notes={
            **NOTES,
            "device_spec": spec.source,
            "efficiency": efficiency.to_json(),
            "times": "roofline per aten op (torch.utils.flop_counter FLOPs, bytes of arguments and results) "
                     "/ kind efficiency + launch latency per op",
            "workspace": "what the stage's operators allocate on the meta device beyond what the chain model counts "
                         "(harness.profilers.allocations); conv stages add one sample's im2col matrix "
                         "(modelled default algorithm 'gemm')",
        },
    )
