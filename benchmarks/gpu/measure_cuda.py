"""Measurements only a CUDA GPU can give, in one run: ``python benchmarks/gpu/measure_cuda.py OUT``.

1. Measured profiles (``torch`` profiler, CUDA events) of ResNet-50 and VGG-16 at batch 32,
   224x224, against the analytic profile of the same GPU's spec: sizes must agree
   exactly, the per-stage time error is reported.
2. Batch scaling: VGG-16 and ResNet-34 measured at the batch sizes moDNN's sub-batch
   selection visits (variants of one profile), so sub-batching is judged on measured
   times instead of the linear scaling of the chain model.
3. Real allocation traces: one training iteration (forward + backward) and one inference
   pass of ResNet-50 and VGG-16 recorded with ``torch.cuda.memory._record_memory_history``,
   written as benchmark CSV traces and placed by every allocator.

Everything goes to OUT (profiles JSON, traces CSV, ``summary.json``); the printed lines are
what the issue notes quote.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from harness.allocators.trace import blocks_from_torch_snapshot, max_live_bytes, to_int_trace, write_csv
from harness.allocators.validate import violations
from harness.model import save
from harness.plugins import registry
from harness.profilers.analytic import AnalyticProfiler, device_spec
from harness.profilers.measured import TorchProfiler
from harness.protocols import Workload

SIZE = (3, 224, 224)
SCALING = {"torchvision:vgg16": (256, (1, 2, 4, 8, 16, 32, 64, 128, 192)),
           "torchvision:resnet34": (128, (1, 2, 4, 8, 16, 32, 64, 96))}
ALLOCATORS = ("bestfit", "caching", "first-fit", "greedy-by-size")


def gpu_spec_name() -> str:
    name = torch.cuda.get_device_name()
    return "H200" if "H200" in name else "H100"


def compare_profiles(model: str, batch: int, out: Path) -> dict:
    workload = Workload(model, batch, SIZE, "cuda")
    started = time.perf_counter()
    measured = TorchProfiler(warmup=2, repeats=5).profile(workload)
    took = time.perf_counter() - started
    analytic = AnalyticProfiler().profile(Workload(model, batch, SIZE, gpu_spec_name()))
    tag = model.split(":")[-1]
    save(measured, out / f"{tag}-b{batch}-{gpu_spec_name().lower()}-measured.json")
    sizes_equal = all(
        (m.input_bytes, m.saved_bytes, m.grad_bytes) == (a.input_bytes, a.saved_bytes, a.grad_bytes)
        for m, a in zip(measured.stages, analytic.stages)) and measured.n_stages == analytic.n_stages
    errors = [(a.fwd_time + a.bwd_time) / (m.fwd_time + m.bwd_time) - 1
              for m, a in zip(measured.stages, analytic.stages) if m.fwd_time + m.bwd_time > 0]
    total_m = sum(s.fwd_time + s.bwd_time for s in measured.stages)
    total_a = sum(s.fwd_time + s.bwd_time for s in analytic.stages)
    row = {
        "model": model, "batch": batch, "stages": measured.n_stages, "profile_s": round(took, 1),
        "sizes_equal": sizes_equal, "measured_ms": total_m * 1e3, "analytic_ms": total_a * 1e3,
        "total_error": total_a / total_m - 1,
        "stage_error_median_abs": statistics.median(abs(e) for e in errors),
        "stage_error_max_abs": max(abs(e) for e in errors),
        "host_link_GBps": [measured.d2h_bandwidth / 1e9, measured.h2d_bandwidth / 1e9],
        "conv_stages_with_alternatives": sum(1 for s in measured.stages if s.algorithms),
    }
    print("profile", json.dumps(row), flush=True)
    return row


def batch_scaling(model: str, batch: int, variants: tuple[int, ...], out: Path) -> dict:
    profile = TorchProfiler(warmup=2, repeats=5, algorithms=False, variant_batches=variants).profile(
        Workload(model, batch, SIZE, "cuda"))
    tag = model.split(":")[-1]
    save(profile, out / f"{tag}-b{batch}-{gpu_spec_name().lower()}-scaling.json")
    per_sample = {}
    for p in (*profile.variants, profile):
        per_sample[p.batch_size] = sum(s.fwd_time + s.bwd_time for s in p.stages) / p.batch_size * 1e3
    row = {"model": model, "ms_per_sample": dict(sorted(per_sample.items()))}
    print("scaling", json.dumps(row), flush=True)
    return row


def record_trace(model: str, batch: int, training: bool) -> tuple:
    net, x = registry().model_factory(model).build(Workload(model, batch, SIZE, "cuda"), "cuda")

    def step() -> None:
        if training:
            net.zero_grad(set_to_none=True)
            net(x).sum().backward()
        else:
            with torch.no_grad():
                net(x)

    step()  # warm-up: cuDNN's choices, lazily created handles
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")  # no C++ frames to symbolise
    step()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    del net, x
    torch.cuda.empty_cache()
    return blocks_from_torch_snapshot(snapshot, torch.cuda.current_device())


def place_traces(out: Path) -> list[dict]:
    rows = []
    reg = registry()
    for model in ("torchvision:resnet50", "torchvision:vgg16"):
        for training in (True, False):
            blocks = record_trace(model, 32, training)
            kind = "training" if training else "inference"
            tag = f"{model.split(':')[-1]}-b32-{kind}"
            write_csv(to_int_trace(blocks), out / f"trace-{tag}.csv")
            row = {"trace": tag, "blocks": len(blocks), "max_live_MiB": max_live_bytes(blocks) / 2**20}
            for name in ALLOCATORS:
                alloc = reg.allocator(name)
                started = time.perf_counter()
                placement = alloc.place(blocks)
                row[f"{name}_MiB"] = placement.arena_bytes / 2**20
                row[f"{name}_s"] = time.perf_counter() - started
                row[f"{name}_valid"] = not violations(to_int_trace(blocks), placement)
            print("trace", json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    print("device", torch.cuda.get_device_name(), torch.__version__, flush=True)
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "spec": device_spec(gpu_spec_name()).name}
    summary["profiles"] = [compare_profiles(m, 32, out) for m in ("torchvision:resnet50", "torchvision:vgg16")]
    summary["scaling"] = [batch_scaling(m, b, v, out) for m, (b, v) in SCALING.items()]
    summary["traces"] = place_traces(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


def scaling_only(out: Path, specs: list[str]) -> None:
    """``--scaling MODEL:BATCH ...``: only step 2, for the given models and batches."""
    out.mkdir(parents=True, exist_ok=True)
    variants = (1, 2, 4, 8, 16, 32, 64, 128, 192)
    for spec in specs:
        model, batch = spec.rsplit(":", 1)
        batch_scaling(model, int(batch), tuple(v for v in variants if v < int(batch)), out)


if __name__ == "__main__":
    args = sys.argv[1:]
    target = Path(args[0]) if args and not args[0].startswith("--") else Path("gpu-measurements")
    if "--scaling" in args:
        scaling_only(target, args[args.index("--scaling") + 1:])
    else:
        main(target)
