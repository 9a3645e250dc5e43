"""Every torchvision classification model profiles with the analytic profiler.

Batch 2 at 224x224 (299x299 for Inception v3): on the meta device the input size costs
nothing, and 224 is the one size every architecture accepts (MaxViT needs multiples of
224). Each chain must be well formed: connected sizes, known kinds, the data's and the
logits' sizes at its two ends.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from harness.model import STAGE_KINDS  # noqa: E402
from harness.profilers.analytic import AnalyticProfiler  # noqa: E402
from harness.protocols import Workload  # noqa: E402

MODELS = sorted(torchvision.models.list_models(module=torchvision.models))
PROFILER = AnalyticProfiler()


@pytest.mark.parametrize("arch", MODELS)
def test_every_torchvision_model_profiles_analytically(arch):
    side = 299 if arch == "inception_v3" else 224
    p = PROFILER.profile(Workload(f"torchvision:{arch}", 2, (3, side, side), "V100-PCIe"))
    assert p.n_stages >= 5
    assert p.stages[0].input_bytes == 2 * 3 * side * side * 4
    assert p.stages[0].grad_bytes == 0
    assert p.output_bytes == 2 * 1000 * 4
    assert all(s.kind in STAGE_KINDS for s in p.stages)
    assert len({s.name for s in p.stages}) == p.n_stages
    assert all(s.input_bytes > 0 and s.grad_bytes > 0 for s in p.stages[1:])
    assert sum(s.saved_bytes for s in p.stages) > 0
    assert p.weight_bytes > 0 and p.compute_time > 0
    assert sum(s.flops for s in p.stages) > 0
    assert any(s.kind in ("conv", "block") for s in p.stages)
