"""The torch executor's order of issue and waits, timed: on a device that ran every operation in the
profile's time, its iterations take exactly the simulator's time (issue #16, "Predictions you can
trust").

``FakeCuda`` in timed mode (``tests/fake_cuda.py``) gives every stream a virtual clock: each
operation of the schedule is charged its profile time on the compute stream (``Lowered.op_dur``), each
copy between pinned host memory and the device its bytes over the profile's link rate, and the host
is infinitely fast, so it runs as far ahead of the device as its waits let it (a GPU at a large batch).
The executor's own clock then measures its CUDA path in that virtual time, and its
``prediction_error`` is what its order of issue and waits adds to the simulator's timeline: the part
of a real run's error that no profile can fix. Before these tests, the vDNN rows of both models ran
14-25% over their prediction here (prefetches held back by offloads the host had not seen end;
+8-9% on ResNet-50 and +28-33% on ViT-B/16 with the H200's stage times, where the H200 measured
+15-17% and +28-36%), GREEDY's 3% under it (prefetches let in before the memory the simulator holds
between the backwards was free), and moDNN's up to 2.5% off (copies in the order of their issue
points, not the list's); the last test puts the first two faults back and sees them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from harness.executors import torch_executor  # noqa: E402
from harness.executors._torch_chain import ChainPass  # noqa: E402
from harness.executors.torch_executor import TorchExecutor  # noqa: E402
from harness.bounds import min_memory, peak_memory  # noqa: E402
from harness.errors import InfeasibleBudget  # noqa: E402
from harness.model import DEVICE_OFFLOAD_START, Profile, load  # noqa: E402
from harness.plugins import registry  # noqa: E402
from harness.simulate.executor import simulate  # noqa: E402
from harness.simulate.lowering import lower  # noqa: E402
from harness.time_gap import time_gap  # noqa: E402
from tests.fake_cuda import FakeCuda  # noqa: E402
from tests.test_torch_executor import plan_tight  # noqa: E402
from tests.torch_cases import one_thread, setup  # noqa: E402,F401 (one_thread: an autouse fixture)

MODELS = ["torchvision:resnet18", "torchvision:vit_b_16"]  # the GPU smoke suite's two families
# every bundled planner the GPU smoke suite runs but torch-save-on-cpu, whose executor runs PyTorch's
# hooks, not the schedule's transfers
PLANNERS = [p for p in registry().names("planner") if p != "torch-save-on-cpu"]


def timed_cuda(monkeypatch, schedule, profile) -> FakeCuda:
    """A timed FakeCuda installed, the executor sent down its CUDA path, and every operation of
    ``schedule`` charged its time on ``profile`` as the simulator lowers it."""
    monkeypatch.setattr(torch_executor, "on_cuda", lambda device: True)
    fake = FakeCuda(events_complete="in time",
                    link_bps=(profile.d2h_bandwidth, profile.h2d_bandwidth)).install(monkeypatch)
    seconds = dict(zip((op.label for op in schedule.ops), lower(schedule, profile).op_dur.tolist()))

    def charged(method, kind_of):
        def run(self, stage, sb, *args):
            fake.charge(seconds[f"{kind_of(args)}{stage}" + (f"/{sb}" if sb else "")])
            return method(self, stage, sb, *args)
        return run

    monkeypatch.setattr(ChainPass, "forward", charged(ChainPass.forward, lambda args: args[0] if args else "F"))
    monkeypatch.setattr(ChainPass, "recompute", charged(ChainPass.recompute, lambda args: "R"))
    monkeypatch.setattr(ChainPass, "backward", charged(ChainPass.backward, lambda args: "B"))
    return fake


def timed_run(monkeypatch, model: str, planner: str, duplex: bool | None = None):
    """``planner``'s schedule at a tight budget, run by the executor on the timed FakeCuda."""
    chain, profile = setup(model)
    schedule = plan_tight(profile, planner)
    fake = timed_cuda(monkeypatch, schedule, profile)
    with fake.checking():
        run = TorchExecutor(warmup=1, iterations=1, grad_check=False, duplex=duplex).execute(schedule, profile, chain)
    return run, fake, schedule, profile


# --------------------------------------------------------------------------- the clock itself
def test_the_timed_fake_runs_streams_in_virtual_time(monkeypatch):
    """Compute charged on one stream, a copy on another after an event: each starts when its stream
    and its wait allow, the events' elapsed times say so, and the host sees an event complete only
    once it has waited for a point past it."""
    fake = FakeCuda(events_complete="in time", link_bps=(1e9, 2e9)).install(monkeypatch)
    compute, side = torch.cuda.current_stream(), torch.cuda.Stream()
    start = torch.cuda.Event(enable_timing=True)
    start.record(compute)
    fake.charge(0.004)
    computed = torch.cuda.Event(enable_timing=True)
    computed.record(compute)
    host = torch.empty(1000, dtype=torch.uint8, pin_memory=True)
    device = torch.ones(1000, dtype=torch.uint8)
    with fake.checking(), torch.cuda.stream(side):  # the check's dispatch mode sees the copy
        side.wait_event(computed)
        host.copy_(device, non_blocking=True)  # 1000 bytes at 1 GB/s: 1 us, after the compute
        copied = torch.cuda.Event(enable_timing=True)
        copied.record(side)
    assert start.elapsed_time(computed) == pytest.approx(4.0)
    assert start.elapsed_time(copied) == pytest.approx(4.001)
    assert not copied.query()  # the host has waited for nothing yet
    computed.synchronize()
    assert not copied.query()  # the copy ends 1 us after the point the host reached
    torch.cuda.synchronize()
    assert copied.query() and fake.host_t == pytest.approx(0.004001)
    fake.charge(0.001)  # issued after the host's wait: it starts there, not at the stream's last end
    ended = torch.cuda.Event(enable_timing=True)
    ended.record(compute)
    assert start.elapsed_time(ended) == pytest.approx(5.001)


def test_a_reused_host_buffer_is_waited_for_by_the_copy_stream_not_the_host(monkeypatch):
    """An offload that reuses the pinned buffer a prefetch read waits for that prefetch on its copy
    stream (duplex: the prefetch ran on the other one); the host does not wait, so what it issues
    next is not held back (it was: the forward after moDNN's offload started only once the prefetch
    before it was over). Nothing races, and the data comes back intact."""
    from harness.executors._torch_copies import Clock, CudaCopies, HostPool
    from harness.executors._torch_store import Block, flat_bytes

    fake = FakeCuda(events_complete="in time", link_bps=(1e6, 1e6)).install(monkeypatch)
    nbytes = 1000  # 1 ms a copy
    with fake.checking():
        copies = CudaCopies(torch.device("cpu"), HostPool(pinned=True), Clock(True), duplex=True)
        copies.clock.start(copies.compute)
        first = Block(torch.ones(nbytes, dtype=torch.uint8).untyped_storage(), nbytes, (0, 0))
        copies.offload([(first, nbytes)], "offload 0")
        copies.prefetch([first], "prefetch 0")  # reads the buffer, 1-2 ms
        data = torch.full((nbytes,), 7, dtype=torch.uint8)
        second = Block(data.untyped_storage(), nbytes, (0, 1))
        copies.offload([(second, nbytes)], "offload 1")  # the same buffer, once the prefetch is over
        assert fake.host_t == 0.0
        copies.wait(copies.prefetch([second], "prefetch 1"))
        back = flat_bytes(second.storage).clone()
    spans = {label: (copies.clock.seconds(a), copies.clock.seconds(b)) for label, _, a, b in copies.clock.spans}
    assert spans["offload 1"][0] == pytest.approx(spans["prefetch 0"][1]) == pytest.approx(0.002)
    assert torch.equal(back, torch.full((nbytes,), 7, dtype=torch.uint8))
    assert fake.races == [], "\n".join(fake.races)


# --------------------------------------------------------------------------- the executor, timed
@pytest.mark.parametrize("planner,duplex", [(p, None) for p in PLANNERS] + [("vdnn-all", True), ("hybrid", True)])
@pytest.mark.parametrize("model", MODELS)
def test_the_executor_takes_the_simulators_time_on_a_device_that_runs_the_profile(monkeypatch, model, planner, duplex):
    """Every planner's schedule (and two on duplex copy engines), through the executor's CUDA path on
    the timed FakeCuda: the iteration takes the simulator's time to a nanosecond, every operation
    starts and ends where the simulator has it (the time gap has no idle time and no compute
    difference), and nothing races."""
    run, fake, schedule, profile = timed_run(monkeypatch, model, planner, duplex)
    assert run.status == "ok", run.message
    assert fake.races == [], "\n".join(fake.races)
    predicted = torch_executor.predict(schedule, profile, duplex)
    assert run.makespan == pytest.approx(predicted.makespan, rel=1e-9, abs=1e-12), run.metrics
    assert abs(run.metrics["prediction_error"]) < 1e-9
    model_timeline = simulate(schedule, profile, duplex=duplex, offload_start=DEVICE_OFFLOAD_START).timeline
    gap = time_gap(run.timeline, model_timeline)
    assert abs(gap.idle_s) < 1e-12 and all(abs(v) < 1e-12 for v in gap.compute_s.values()), gap


def _room_counting_offloads_as_seen(self, group, j=None) -> bool:
    """The prefetch's room as it was: offloads count as copying until the host sees them end."""
    need = sum(b.moved for b in self.store.blocks(group))
    return self._in_use(self.next_op) + self._releasing_bytes() + need <= self.schedule.budget_bytes


H200_PROFILES = Path(__file__).resolve().parents[1] / "results/gpu-smoke/published-2/profiles"


def h200_ratios(model: str) -> Profile:
    """The model's CPU profile (``setup``) with the stage times the H200 measured at batch 256
    (``results/gpu-smoke/published-2/profiles``) and the host link's rate scaled by the ratio of the
    saved bytes: the H200's ratio of copy to compute at a size the CPU runs."""
    _, small = setup(model)
    big = load(Profile, H200_PROFILES / f"{model.replace(':', '_')}-b256-3x224x224-float32.json")
    assert big.n_stages == small.n_stages
    ratio = sum(s.saved_bytes for s in small.stages) / sum(s.saved_bytes for s in big.stages)
    stages = tuple(replace(s, fwd_time=b.fwd_time, bwd_time=b.bwd_time, algorithms=())
                   for s, b in zip(small.stages, big.stages))
    return replace(small, stages=stages, d2h_bandwidth=big.d2h_bandwidth * ratio,
                   h2d_bandwidth=big.h2d_bandwidth * ratio, variants=())


# What the executor still departs by at these ratios, and why (docs/gpu.md, "What the check still
# shows"): a prefetch the simulator starts in the middle of an operation, the instant an offload before
# it on the engine frees its memory; the executor allocates a prefetch's memory when it issues it, so it
# can only have the host wait for that offload before the operation or issue the prefetch after it.
STILL_DEPARTS = {
    ("torchvision:vit_b_16", "modnn", 0.25): 0.002,  # +0.18%: the prefetch of stage 22, in B25
    ("torchvision:vit_b_16", "vdnn-chain", 0.75): 0.004,  # +0.37%: the prefetch of stage 25, in B26
}


@pytest.mark.parametrize("fraction", [0.25, 0.75])
@pytest.mark.parametrize("model", ["torchvision:resnet50", "torchvision:vit_b_16"])
def test_at_the_h200s_ratio_of_copy_to_compute_too(monkeypatch, model, fraction):
    """The smoke suite's models with the H200's stage times (``h200_ratios``), at a quarter or three
    quarters of the span as the smoke suite budgets them: every planner's schedule that fits takes the
    simulator's time, but for the two departures of ``STILL_DEPARTS``, each within its bound. Before,
    vdnn-all and vdnnpp-dyn came out +8-9% (ResNet-50) and +28-33% (ViT-B/16), moDNN +0.8% (the host
    waited for an offload before a forward that the simulator runs meanwhile) and -0.6% (transfers in
    issue order, not list order) on ResNet-50, and +2.5% on ViT-B/16."""
    profile = h200_ratios(model)
    chain, _ = setup(model)
    lo, hi = min_memory(profile), peak_memory(profile)
    errors, refused = {}, []
    for planner in PLANNERS:
        try:
            schedule = registry().planner(planner).plan(profile, int(lo + fraction * (hi - lo)))
        except InfeasibleBudget:
            refused.append(planner)
            continue
        with monkeypatch.context() as patched:
            fake = timed_cuda(patched, schedule, profile)
            with fake.checking():
                run = TorchExecutor(warmup=1, iterations=1, grad_check=False).execute(schedule, profile, chain)
        assert run.status == "ok", (planner, run.message)
        assert fake.races == [], "\n".join(fake.races)
        errors[planner] = run.metrics["prediction_error"]
    assert len(errors) >= len(PLANNERS) // 2, refused  # the sweep ran most of the planners
    off = {p: e for p, e in errors.items()
           if not abs(e) <= STILL_DEPARTS.get((model, p, fraction), 1e-9)}
    assert not off, off


FAULTS = {
    # the backward's prefetches wait for offloads the device finished long before: they start at the
    # end of the operation they were issued with, not at its start
    "vdnn-all": ("_room", _room_counting_offloads_as_seen, 0.05),
    # only the saved bytes counted as in use: the prefetches start before the memory is free
    "greedy": ("_in_use", lambda self, k: self.weights + sum(self.store.device_bytes().values()), -0.02),
}


@pytest.mark.parametrize("planner", list(FAULTS))
def test_the_timing_check_sees_an_executor_that_departs_from_the_simulator(monkeypatch, planner):
    """The test above can fail: with each fault the executor had before it, put back, the timed run
    leaves the simulator's time by the sign and at least the size it did then."""
    method, fault, error = FAULTS[planner]
    monkeypatch.setattr(torch_executor._Execution, method, fault)
    run, fake, _, _ = timed_run(monkeypatch, MODELS[0], planner)
    assert run.status == "ok", run.message
    got = run.metrics["prediction_error"]
    assert (got > error) if error > 0 else (got < error), got
