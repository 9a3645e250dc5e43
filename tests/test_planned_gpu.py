"""The planned path on a CUDA GPU (issue #18): ResNet-50 training at planned addresses.

Needs CUDA (``@pytest.mark.gpu``), skipped without it. Each run starts its own process
(the pluggable allocator must be installed before CUDA is initialised there); the
caching allocator's run of the same schedule happens in this process. What is asserted:
the gradients equal the caching allocator's run (TF32 and cuDNN's algorithm choice leave a
few 1e-3 of the largest gradient, as in ``test_torch_executor_gpu.py``), every request of
the timed iterations is planned, and the arena is reported beside the caching reserve.
"""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from harness.bounds import min_memory, peak_memory  # noqa: E402
from harness.executors.planned import TorchPlannedExecutor  # noqa: E402
from harness.plugins import registry  # noqa: E402
from harness.profilers.measured import TorchProfiler  # noqa: E402
from harness.protocols import Workload  # noqa: E402

MODEL, BATCH, SIZE = "torchvision:resnet50", 32, (3, 224, 224)


@functools.cache
def profile():
    return TorchProfiler(warmup=1, repeats=3, algorithms=False).profile(Workload(MODEL, BATCH, SIZE, "cuda"))


@pytest.mark.parametrize("planner", ["keep-all", "greedy"])
def test_resnet50_trains_at_planned_addresses_with_the_caching_allocators_gradients(planner):
    p = profile()
    lo, hi = min_memory(p), peak_memory(p)
    budget = hi if planner == "keep-all" else int(lo + 0.5 * (hi - lo))
    schedule = registry().planner(planner).plan(p, budget)
    run = TorchPlannedExecutor(warmup=3, iterations=3).run(schedule, p, Workload(MODEL, BATCH, SIZE, "cuda"))
    assert run.status == "ok", run.message
    m = run.metrics
    assert m["grad_error_vs_caching"] < 1e-2, m
    assert m["departures"] == 0 and m["planned_requests"] > 0
    assert m["plan_max_live_bytes"] <= m["plan_bytes"] <= m["arena_bytes"]
    assert m["caching_reserved_bytes"] > 0 and "allocator_errors" not in m
    print(f"{planner}: arena {m['arena_bytes'] / 2**30:.2f} GiB, planned reserved "
          f"{m['planned_reserved_bytes'] / 2**30:.2f} GiB, caching reserved {m['caching_reserved_bytes'] / 2**30:.2f} GiB")
