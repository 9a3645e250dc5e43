"""The torch executor's CUDA path, run on the CPU against a stand-in of the CUDA runtime.

``tests/fake_cuda.py`` stands in for the streams, events and allocator statistics the executor
uses on a GPU and checks that every memory access is ordered after the conflicting ones before
it (the happens-before relation of streams and events, and two of the caching allocator's
rules). So the CPU suite runs, for every planner, the code a GPU run would: the copies on their
side streams (``CudaCopies``), the waits the schedule asks for, the prefetches allocated on the
compute stream, the offloads that free their memory, the waits for memory; and it asserts that
the gradients are the unmodified model's and that no access races. The first tests show that the
check finds the races it is there to find.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from harness.executors import torch_executor  # noqa: E402
from harness.executors._torch_copies import Clock, CudaCopies, HostPool  # noqa: E402
from harness.executors._torch_store import Block, flat_bytes  # noqa: E402
from harness.executors.torch_executor import TorchExecutor  # noqa: E402
from harness.model import Schedule, Transfer, training_ops  # noqa: E402
from harness.plugins import registry  # noqa: E402
from harness.schedules import ordered_schedule  # noqa: E402
from tests.fake_cuda import FakeCuda  # noqa: E402
from tests.test_torch_executor import assert_gradients_equal, cached_reference, plan_tight  # noqa: E402
from tests.torch_cases import one_thread, setup  # noqa: E402,F401 (one_thread: an autouse fixture)

MODEL = "torchvision:resnet18"


@pytest.fixture
def fake(monkeypatch):
    return FakeCuda().install(monkeypatch)


# --------------------------------------------------------------------------- the check itself
def test_a_read_on_a_side_stream_must_wait_for_the_write_before_it(fake):
    side = torch.cuda.Stream()
    with fake.checking():
        x = torch.ones(1024)
        x.mul_(2)  # on the compute stream
        with torch.cuda.stream(side):
            x.sum()
    assert len(fake.races) == 1 and "reads" in fake.races[0] and "after aten.mul_" in fake.races[0], fake.races

    fake.races.clear()
    with fake.checking():
        y = torch.ones(1024)
        y.mul_(2)
        done = torch.cuda.Event()
        done.record()
        with torch.cuda.stream(side):
            side.wait_event(done)
            y.sum()
    assert fake.races == []


def test_memory_a_stream_allocates_is_its_last_operations_until_another_stream_waits(fake):
    """The caching allocator hands memory freed on a stream out at once on that stream: a copy
    on another stream that writes a block just allocated may overwrite what an earlier kernel
    still reads, unless it waits for the compute issued before it."""
    side = torch.cuda.Stream()
    host = torch.ones(4096, dtype=torch.uint8).pin_memory()
    with fake.checking():
        storage = torch.empty(0, dtype=torch.uint8).untyped_storage()
        storage.resize_(4096)  # allocated on the compute stream
        with torch.cuda.stream(side):
            flat_bytes(storage).copy_(host, non_blocking=True)
    assert len(fake.races) == 1 and "the allocator's reuse" in fake.races[0], fake.races


def test_memory_freed_while_another_stream_reads_it_needs_record_stream(fake):
    side = torch.cuda.Stream()
    for recorded in (False, True):
        fake.races.clear()
        with fake.checking():
            x = torch.ones(4096, dtype=torch.uint8)
            storage = x.untyped_storage()
            host = torch.empty(4096, dtype=torch.uint8, pin_memory=True)
            ready = torch.cuda.Event()
            ready.record()
            with torch.cuda.stream(side):
                side.wait_event(ready)
                host.copy_(flat_bytes(storage), non_blocking=True)
                if recorded:
                    flat_bytes(storage).record_stream(side)
                storage.resize_(0)  # freed to the compute stream's pool while the copy may still read it
        assert (fake.races == []) == recorded, fake.races


@pytest.mark.parametrize("waited", [False, True])
def test_memory_freed_by_its_last_reference_while_another_stream_writes_it_is_seen(fake, waited):
    """A prefetched block is freed when autograd lets it go: the compute stream must have waited for
    the copy that wrote it, else its pool hands out memory the copy may still be writing."""
    side = torch.cuda.Stream()
    host = torch.ones(4096, dtype=torch.uint8).pin_memory()
    with fake.checking():
        storage = torch.empty(0, dtype=torch.uint8).untyped_storage()
        storage.resize_(4096)
        issued = torch.cuda.Event()
        issued.record()
        with torch.cuda.stream(side):
            side.wait_event(issued)
            flat_bytes(storage).copy_(host, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        if waited:
            torch.cuda.current_stream().wait_event(done)
        del storage
        torch.ones(1)  # the next operation: the free is seen there
    assert (fake.races == []) == waited, fake.races
    assert waited or "the last reference dropped" in fake.races[0]


# --------------------------------------------------------------------------- the copy engines
@pytest.mark.parametrize("keep", [0, 1 << 12])
def test_an_offloaded_block_comes_back_intact_in_stream_order(fake, keep):
    """CudaCopies' offload and prefetch of one block (whole, or keeping its head), the block's
    users waiting for the prefetch as the executor does: the data returns and nothing races."""
    nbytes = 1 << 14
    with fake.checking():
        data = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
        expected = data.clone()
        block = Block(data.untyped_storage(), nbytes, (0, 0))
        copies = CudaCopies(torch.device("cpu"), HostPool(pinned=True), Clock(True), duplex=True)
        copies.offload([(block, nbytes - keep)], "offload 0")
        del data
        assert block.device_bytes == keep
        copies.prefetch([block], "prefetch 0")
        copies.wait(block.ready)
        back = flat_bytes(block.storage).clone()
    assert torch.equal(back, expected)
    assert fake.races == []


def test_the_check_sees_the_prefetch_wait_for_the_compute_issued_before_it(monkeypatch):
    """Without the copy's wait for the compute stream (the order the 2026-11-30 change gave it),
    the prefetch's copy writes memory the compute stream has just allocated: a race."""
    fake = FakeCuda(ignore_wait=lambda stream, event: stream.cuda_stream == 2).install(monkeypatch)
    nbytes = 1 << 14
    with fake.checking():
        data = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
        block = Block(data.untyped_storage(), nbytes, (0, 0))
        copies = CudaCopies(torch.device("cpu"), HostPool(pinned=True), Clock(True), duplex=True)
        assert copies.h2d.cuda_stream == 2
        copies.offload([(block, nbytes)], "offload 0")
        del data
        copies.prefetch([block], "prefetch 0")
    assert any("the allocator's reuse" in race for race in fake.races), fake.races


# --------------------------------------------------------------------------- the executor
MOVING = ("vdnn-all", "greedy", "dynprog", "capacity", "modnn", "vdnnpp-dyn", "hybrid", "recompute",
          "torch-save-on-cpu", "torch-checkpoint")
EVENTS = ["at once", "when waited"]


def _cuda_path(monkeypatch, **fake_options) -> FakeCuda:
    """A FakeCuda installed, and the executor sent down its CUDA path on the CPU."""
    monkeypatch.setattr(torch_executor, "on_cuda", lambda device: True)
    return FakeCuda(**fake_options).install(monkeypatch)


def _run(monkeypatch, schedule, model=MODEL, fake=None, events="at once", faults=None, **options):
    """``schedule`` through the executor's CUDA path under ``fake`` (a new FakeCuda if None), checked."""
    chain, profile = setup(model)
    fake = fake or _cuda_path(monkeypatch, events_complete=events, **(faults or {}))
    with fake.checking():
        run = TorchExecutor(warmup=1, iterations=1, grad_check=False, **options).execute(schedule, profile, chain)
    return run, fake


@pytest.mark.parametrize("events", EVENTS)
@pytest.mark.parametrize("planner", [p for p in MOVING if p in registry().names("planner")])
@pytest.mark.parametrize("model", [MODEL, "torchvision:vit_b_16"])  # the GPU smoke suite's two families
def test_the_cuda_path_gives_the_plain_gradients_with_every_access_in_stream_order(monkeypatch, model, planner, events):
    """Each planner's schedule at a tight budget through the executor's CUDA path (copies complete at
    once, or only when the host waits for them, so that every wait for memory runs): the run is ok,
    the gradients are the unmodified model's, the copies ran on their side streams, nothing raced."""
    chain, profile = setup(model)
    schedule = plan_tight(profile, planner)
    expected = cached_reference(model, schedule.sub_batches)  # before the run: it clears the gradients
    run, fake = _run(monkeypatch, schedule, model, events=events)
    assert run.status == "ok", run.message
    assert fake.races == [], "\n".join(fake.races)
    assert_gradients_equal(chain, expected)
    if schedule.transfers:
        assert run.moved_bytes > 0
        assert {event.stream for event in run.timeline} == {"compute", "copy"}


@pytest.mark.parametrize("events", EVENTS)
@pytest.mark.parametrize("planner", ["vdnn-all", "hybrid"])
def test_duplex_copies_run_on_two_streams_in_order(monkeypatch, planner, events):
    chain, profile = setup(MODEL)
    schedule = plan_tight(profile, planner)
    expected = cached_reference(MODEL, schedule.sub_batches)
    run, fake = _run(monkeypatch, schedule, events=events, duplex=True)
    assert run.status == "ok", run.message
    assert fake.races == [], "\n".join(fake.races)
    assert {event.stream for event in run.timeline} == {"compute", "d2h", "h2d"}
    assert_gradients_equal(chain, expected)


@pytest.mark.parametrize("duplex", [False, True])
def test_partial_offloads_keep_their_heads_in_stream_order(monkeypatch, duplex):
    """Half of every third stage's saved bytes moved: blocks keep their heads on the device (a new, smaller
    storage the copy stream allocates), regrown on the compute stream once their offload is over."""
    chain, profile = setup(MODEL)
    half = {i: s.saved_bytes // 2 for i, s in enumerate(profile.stages) if i % 3 == 0 and s.saved_bytes}
    schedule = ordered_schedule(profile, 10**12, half, planner="probe", prefetch_window=1)
    assert any(tr.nbytes for tr in schedule.transfers if tr.direction == "offload")
    expected = cached_reference(MODEL, 1)
    run, fake = _run(monkeypatch, schedule, events="when waited", duplex=duplex)
    assert run.status == "ok", run.message
    assert fake.races == [], "\n".join(fake.races)
    assert run.moved_bytes == 2 * sum(half.values())  # the halves, each way: heads kept
    assert_gradients_equal(chain, expected)


@pytest.mark.parametrize("path", ["cpu", "cuda"])
def test_the_host_buffers_of_one_iteration_serve_the_next(monkeypatch, path):
    """Pinned host memory is slow to allocate and counts against the host: the buffers a prefetch hands
    back are taken again by the offloads of the next iteration (``HostPool``), so over three
    iterations of offloading everything the pool holds one iteration's offloaded bytes."""
    chain, profile = setup(MODEL)
    schedule = ordered_schedule(profile, 10**12, set(range(profile.n_stages)), planner="all")
    fake = _cuda_path(monkeypatch, events_complete="when waited") if path == "cuda" else None
    with fake.checking() if fake else nullcontext():
        run = TorchExecutor(warmup=1, iterations=2, grad_check=False).execute(schedule, profile, chain)
    assert run.status == "ok", run.message
    assert fake is None or fake.races == [], "\n".join(fake.races)
    assert run.metrics["host_pool_bytes"] == run.moved_bytes // 2 == sum(s.saved_bytes for s in profile.stages)


def test_an_offload_that_reuses_a_host_buffer_waits_for_the_prefetch_that_read_it(monkeypatch):
    """Stage 3 goes to the host and comes back during the forward; then stage 4, of the same size, goes
    out into the buffers stage 3 left. On two copy streams the offload's copy must wait for the
    prefetch that read them (its event, handed back with the buffers), or it overwrites data the
    prefetch may still be reading."""
    chain, profile = setup(MODEL)
    n = profile.n_stages
    assert profile.stages[3].saved_bytes == profile.stages[4].saved_bytes
    transfers = (Transfer(3, "offload", 3), Transfer(3, "prefetch", 4), Transfer(4, "offload", 4),
                 Transfer(4, "prefetch", n))
    schedule = Schedule("reuse", 10**12, training_ops(n), transfers)
    expected = cached_reference(MODEL, 1)
    run, fake = _run(monkeypatch, schedule, events="when waited", duplex=True)
    assert run.status == "ok", run.message
    assert run.metrics["host_pool_bytes"] == profile.stages[3].saved_bytes  # stage 4 took stage 3's buffers
    assert fake.races == [], "\n".join(fake.races)
    assert_gradients_equal(chain, expected)


@pytest.mark.parametrize("duplex", [False, True])
def test_a_recomputation_waits_for_its_offloaded_checkpoint_to_come_back(monkeypatch, duplex):
    """The checkpoints x_0 and x_2 of two recomputed segments go to the host after Fc_i: R_i, which
    reads x_i, must wait on the compute stream for the prefetch that brings it back, as a backward
    waits for its saved data (``_Execution._resident``), or it reads a block still being written."""
    chain, profile = setup(MODEL)
    n = profile.n_stages
    planned = ordered_schedule(profile, 10**12, {0, 2}, planner="checkpoints", recompute=[(0, 2), (2, n // 2)],
                               prefetch_window=1)
    # no wait the schedule asks for (ordered_schedule's is at R_i): the executor's own before R_i remains
    schedule = replace(planned, transfers=tuple(replace(tr, wait_op=None) for tr in planned.transfers))
    assert {tr.stage for tr in schedule.transfers} == {0, 2}
    expected = cached_reference(MODEL, 1)
    run, fake = _run(monkeypatch, schedule, events="when waited", duplex=duplex)
    assert run.status == "ok", run.message
    assert fake.races == [], "\n".join(fake.races)
    assert_gradients_equal(chain, expected)


def test_an_offload_that_keeps_a_head_frees_its_whole_block_when_its_copy_is_over(monkeypatch):
    """A block that keeps its head gets a new, smaller storage at once (held), and its old storage goes
    back to the allocator only once the copy of the tail is over: until then the executor counts the
    whole block as in use (``_Execution.releasing``), not just the tail moved, or the operations after it
    would not wait for the memory they need."""
    _, profile = setup(MODEL)
    half = {i: s.saved_bytes // 2 for i, s in enumerate(profile.stages) if i % 3 == 0 and s.saved_bytes}
    schedule = ordered_schedule(profile, 10**12, half, planner="probe", prefetch_window=1)
    seen = []  # per offload: (bytes moved, bytes of the blocks it touches, bytes counted until its copy ends)
    copy, offload = CudaCopies.offload, torch_executor._Execution._offload

    def copying(self, plan, label):
        seen.append([sum(take for _, take in plan), sum(block.nbytes for block, _ in plan)])
        return copy(self, plan, label)

    def offloading(self, j):
        offload(self, j)
        seen[-1].append(self.releasing[-1][1])

    monkeypatch.setattr(CudaCopies, "offload", copying)
    monkeypatch.setattr(torch_executor._Execution, "_offload", offloading)
    run, fake = _run(monkeypatch, schedule, events="when waited")
    assert run.status == "ok", run.message
    assert any(moved < whole for moved, whole, _ in seen)  # some offload moved a block's tail only
    assert all(counted == whole for _, whole, counted in seen), seen


def test_operations_wait_for_the_offloads_that_free_their_memory(monkeypatch):
    """Copies that end only when the host waits for them: the operations wait (on the host) for the
    oldest offloads until their allocation fits the chain's budget, as the simulator has them."""
    run, fake = _run(monkeypatch, plan_tight(setup(MODEL)[1], "vdnn-all"), events="when waited")
    assert run.status == "ok", run.message
    assert run.metrics["room_waits"] > 0
    assert fake.races == [], "\n".join(fake.races)


def test_an_oom_in_warm_up_on_the_cuda_path_reports_its_own_peak(monkeypatch):
    """After an ok run, a run whose cap the first forwards exceed, on the same device, is an ``oom`` row
    naming the cap, with the peak it reached itself (the peaks are reset before the warm-up), and it
    leaves nothing racing behind."""
    schedule = plan_tight(setup(MODEL)[1], "vdnn-all")
    first, fake = _run(monkeypatch, schedule)
    assert first.status == "ok", first.message
    cap = schedule.budget_bytes // 4
    run, _ = _run(monkeypatch, schedule, fake=fake, cap_bytes=cap)
    assert run.status == "oom"
    assert "memory cap" in run.message and "FakeCuda out of memory" in run.message, run.message
    assert run.metrics["max_memory_reserved"] <= cap < first.metrics["max_memory_reserved"]
    assert fake.races == [], "\n".join(fake.races)


def test_the_cap_is_the_device_budget_where_the_schedule_has_one(monkeypatch):
    """The memory cap is the device budget (the chain's budget and what the runtime and the allocator
    hold beside it: ``Schedule.device_budget_bytes``), not the chain's budget alone, which would leave
    the runtime's bytes no room."""
    schedule = plan_tight(setup(MODEL)[1], "vdnn-all")
    assert schedule.device_budget_bytes is None  # the chain's budget is the cap
    plain, fake = _run(monkeypatch, schedule)
    device = replace(schedule, device_budget_bytes=3 * schedule.budget_bytes)
    wider, _ = _run(monkeypatch, device, fake=fake)
    assert plain.status == wider.status == "ok", (plain.message, wider.message)
    assert 0 < plain.metrics["memory_fraction"] < wider.metrics["memory_fraction"] < 1
    assert wider.metrics["memory_fraction"] == pytest.approx(3 * plain.metrics["memory_fraction"])


FAULTS = {
    # the compute stream deaf to its waits: the backwards read blocks their prefetch may still be writing
    "a backward that does not wait for its prefetch": ({"ignore_wait": lambda stream, event: stream.cuda_stream == 0},
                                                       False, "reads storage"),
    # record_stream a no-op: the offloads' shrinks free memory their copies may still be reading
    "an offload without record_stream": ({"ignore_record_stream": True}, False, "no record_stream"),
    # duplex: a prefetch's copy (h2d) that does not wait for the offload (d2h) of the same block
    "a prefetch that does not wait for its offload": (
        {"ignore_wait": lambda stream, event: stream.cuda_stream == 2 and event.stream.cuda_stream == 1},
        True, "reads storage"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_check_finds_a_fault_of_the_executors_order(monkeypatch, fault):
    """The executor tests above can fail: each fault of order, put in, is reported."""
    faults, duplex, expected = FAULTS[fault]
    schedule = plan_tight(setup(MODEL)[1], "vdnn-all")
    run, fake = _run(monkeypatch, schedule, events="when waited", faults=faults, duplex=duplex)
    assert run.status == "ok", run.message
    assert any(expected in race for race in fake.races), "\n".join(fake.races)


def test_the_planned_executions_iterations_run_their_cuda_path(monkeypatch):
    """torch-planned's execution (its own statistics, iterations monitored by the real-address allocator,
    report and peaks) on the CUDA path: the run is ok with the plain gradients and reports the allocator's
    metrics. No request reaches the allocator here (the pluggable allocator, which would route them,
    needs a GPU: ``tests/test_realaddr.py`` replays recorded CUDA traces through it)."""
    from types import SimpleNamespace

    from harness.allocators.realaddr import FakeMemory, RealAddressAllocator
    from harness.executors.planned import _planned_execution_class
    from membudget_bestfit import BestFit

    chain, profile = setup(MODEL)
    schedule = plan_tight(profile, "vdnn-all")
    expected = cached_reference(MODEL, schedule.sub_batches)
    fake = _cuda_path(monkeypatch)
    ex = TorchExecutor(warmup=2, iterations=1, enforce_budget=False, grad_check=False)
    execution = _planned_execution_class()(ex, schedule, profile, chain)
    execution.real = RealAddressAllocator(BestFit(), FakeMemory())
    execution.hook = SimpleNamespace(out_of_memory=None, errors=[])
    with fake.checking():
        try:
            run = execution.measure(torch_executor._safe_predict(schedule, profile, False))
        finally:
            execution.close()
    assert run.status == "ok", run.message
    assert run.executor == "torch-planned" and run.metrics["departures"] == 0
    assert {"arena_bytes", "plan_bytes"} <= set(run.metrics)
    assert fake.races == [], "\n".join(fake.races)
    assert_gradients_equal(chain, expected)
