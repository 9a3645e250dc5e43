"""Analytic profiler speed: ResNet-152, DenseNet-201 and ViT-B/16 at batch 256.

Target (issue 3): under 5 s each on the development machine (2 cores). The time covers
the whole ``profile()`` call: building the model on the meta device, tracing, cutting
the chain, the instrumented iteration and the roofline. Run with ``tox -e bench`` (or
``pytest benchmarks/bench_profilers.py -o python_files=bench_*.py``); one warm-up round
keeps imports and first-call costs out of the measurement.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchvision")

from harness.profilers.analytic import AnalyticProfiler  # noqa: E402
from harness.protocols import Workload  # noqa: E402

CASES = {
    "resnet152": (3, 224, 224),
    "densenet201": (3, 224, 224),
    "vit_b_16": (3, 224, 224),
}


@pytest.mark.parametrize("arch", sorted(CASES))
def test_analytic_profile_time(benchmark, arch):
    workload = Workload(f"torchvision:{arch}", 256, CASES[arch], "V100-PCIe")
    profiler = AnalyticProfiler()
    profile = benchmark.pedantic(profiler.profile, args=(workload,), rounds=3, iterations=1, warmup_rounds=1)
    benchmark.extra_info["stages"] = profile.n_stages
    benchmark.extra_info["target_s"] = 5.0
    assert profile.batch_size == 256


def test_resnet152_at_1000px_time(benchmark):
    """The issue's large case: 1000x1000 images cost the same as 224x224 on the meta device."""
    workload = Workload("torchvision:resnet152", 256, (3, 1000, 1000), "V100-PCIe")
    profile = benchmark.pedantic(AnalyticProfiler().profile, args=(workload,), rounds=3, iterations=1,
                                 warmup_rounds=1)
    assert profile.stages[0].input_bytes == 256 * 3 * 1000 * 1000 * 4
