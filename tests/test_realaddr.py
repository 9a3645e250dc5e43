"""The real-address path on the CPU (issue #18): recorded H100 traces through RealAddressAllocator.

Each test plays the allocation sequence of a recorded CUDA training iteration
(``results/traces/h100``, ResNet-50 and VGG-16 at batch 32) through the allocator with a
fake address space, checking every served address against the live ones
(``realaddr.replay``), then perturbs the sequence the ways papers/003 section 4.3 names.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.allocators.greedy_by_size import GreedyBySize
from harness.allocators.realaddr import FakeMemory, RealAddressAllocator, replay, trace_events
from harness.allocators.trace import read_csv
from membudget_bestfit import BestFit

TRACES = Path(__file__).resolve().parents[1] / "results" / "traces" / "h100"
ALIGN = 512


def events_of(name: str):
    return trace_events(read_csv(TRACES / f"trace-{name}-b32-training.csv"))


@pytest.fixture(scope="module", params=["resnet50", "vgg16"])
def recorded(request):
    return request.param, events_of(request.param)


def allocator(events, planner=None):
    memory = FakeMemory(alignment=ALIGN)
    return RealAddressAllocator(planner or BestFit(), memory, alignment=ALIGN), memory


def test_the_profiled_sequence_is_served_entirely_at_planned_addresses(recorded):
    name, events = recorded
    real, memory = allocator(events)
    replay(real, events)  # the profiling iteration: everything recorded, from the fallback
    n = sum(1 for e in events if e[0] == "alloc")
    assert real.stats.recorded == n and real.session.stats.planned == 0
    assert real.arena_base is not None and real.stats.arena_allocations == 1
    mallocs = memory.mallocs
    for _ in range(3):
        replay(real, events)
    assert real.session.stats.planned == 3 * n and real.stats.departures == 0
    assert memory.mallocs == mallocs  # planned iterations allocate nothing from the device
    assert real.session.stats.reoptimizations == 0
    # the arena is the plan's, the plan is a valid placement of the aligned trace
    assert real.arena_capacity == real.plan_bytes
    plan = real.session.plan
    assert plan.arena_bytes >= plan.max_live_bytes
    assert all(o % ALIGN == 0 for o in plan.offsets)
    # best-fit on these traces stays within 2% of max-live (tests/test_allocators_real_traces.py)
    assert plan.arena_bytes <= 1.02 * plan.max_live_bytes
    # the reserve reported is what the device memory held at once: the profiling iteration's
    # fallback blocks were given back before the arena was obtained, so never arena + their peak
    assert real.stats.process_peak_bytes == memory.peak_bytes
    assert real.reserved_bytes <= memory.peak_bytes < real.arena_capacity + real.stats.fallback_peak_bytes


def test_the_reserve_of_the_timed_iterations_is_the_arena_and_the_fallback_blocks_they_hold(recorded):
    """After ``reset_peaks`` (the planned process calls it before its timed iterations, as the caching
    run resets ``max_memory_reserved``), the reserve is the arena and what the fallback holds then:
    not the profiling iteration's fallback peak added to the arena (issue: the H200 rows reported
    5.74 GB beside a 2.80 GB arena and a 2.94 GB profiling peak, which never coexisted)."""
    name, events = recorded
    real, memory = allocator(events)
    replay(real, events)  # profiling: everything from the fallback, given back as it is freed
    profiling_peak = real.stats.fallback_peak_bytes
    real.reset_peaks()
    for _ in range(3):
        replay(real, events)
    m = real.summary()
    assert m["fallback_peak_bytes"] == 0 and m["planned_reserved_bytes"] == m["arena_bytes"]
    assert m["planned_process_peak_bytes"] == memory.peak_bytes >= max(profiling_peak, m["arena_bytes"])
    assert m["planned_process_peak_bytes"] < m["arena_bytes"] + profiling_peak
    assert real.stats.fallback_live_bytes == 0  # every request freed: the fallback holds nothing


def test_any_allocator_plugin_plans_the_arena():
    events = events_of("vgg16")
    real, _ = allocator(events, GreedyBySize())
    replay(real, events)
    replay(real, events)
    assert real.session.plan.allocator == "greedy-by-size"
    assert real.stats.departures == 0 and real.session.stats.planned == sum(1 for e in events if e[0] == "alloc")


def grow(events, index, factor=2):
    """``events`` with the ``index``-th allocation ``factor`` times larger."""
    out, k = [], 0
    for kind, key, size in events:
        if kind == "alloc":
            if k == index:
                size *= factor
            k += 1
        out.append((kind, key, size))
    return out


def test_a_larger_request_departs_to_the_fallback_then_is_replanned(recorded):
    name, events = recorded
    real, _ = allocator(events)
    replay(real, events)
    replay(real, events)
    bigger = grow(events, 5)
    before = real.stats.departures
    replay(real, bigger)  # overlaps are checked inside
    assert real.stats.departures - before >= 1
    assert any("planned" in r for r in real.session.stats.reasons)
    assert real.session.stats.reoptimizations == 1
    planned = real.session.stats.planned
    replay(real, bigger)  # re-planned from the sequence just seen: all planned again
    assert real.stats.departures_by_iteration[-1] == 0
    assert real.session.stats.planned - planned == sum(1 for e in events if e[0] == "alloc")


def test_an_extra_request_departs_and_the_next_iteration_plans_it(recorded):
    name, events = recorded
    real, _ = allocator(events)
    replay(real, events)
    extra = events[:10] + [("alloc", "extra", 3 << 20), ("free", "extra", 0)] + events[10:]
    replay(real, extra)
    # every request after the extra one is off by one: it departs as soon as it is larger
    # than what its index planned or its planned addresses are taken
    assert real.stats.departures_by_iteration[-1] >= 1
    assert real.session.stats.reoptimizations == 1
    replay(real, extra)
    assert real.stats.departures_by_iteration[-1] == 0


def test_a_request_beyond_the_sequence_departs():
    events = events_of("vgg16")
    real, _ = allocator(events)
    replay(real, events)
    longer = events + [("alloc", "tail", 1 << 20), ("free", "tail", 0)]
    replay(real, longer)
    assert real.stats.departures_by_iteration[-1] == 1
    assert any("beyond" in r for r in real.session.stats.reasons)
    replay(real, longer)
    assert real.stats.departures_by_iteration[-1] == 0


def test_a_missing_free_keeps_its_addresses_taken_until_it_is_freed(recorded):
    name, events = recorded
    real, memory = allocator(events)
    replay(real, events)
    # drop the free of the largest block: it stays alive, and the requests the plan put on
    # its addresses after its planned free find them taken
    sizes = {key: size for kind, key, size in events if kind == "alloc"}
    big = max(sizes, key=sizes.get)
    leaky = [e for e in events if not (e[0] == "free" and e[1] == big)]
    kept = replay(real, leaky)  # no two live requests overlap (checked inside)
    assert big in kept and real.in_arena(kept[big])
    assert real.stats.departures_by_iteration[-1] >= 1
    assert any("still in use" in r for r in real.session.stats.reasons)
    real.free(kept[big], sizes[big])  # the program lets it go (outside an iteration)
    replay(real, events)  # planned from the leaky iteration: the block lives to the end there
    replay(real, events)
    assert real.stats.departures_by_iteration[-1] == 0
    assert memory.live_bytes == real.arena_capacity  # nothing left in the fallback


def test_the_interrupted_region_is_not_monitored():
    events = events_of("vgg16")
    real, _ = allocator(events)
    replay(real, events)
    real.begin_iteration()
    live = {}
    for k, (kind, key, size) in enumerate(events):
        if kind == "alloc":
            live[key] = real.alloc(size)
        else:
            real.free(live.pop(key))
        if k == 20:  # a non-hot part: served by the fallback, lambda untouched
            with real.unmonitored():
                side = [real.alloc(s) for s in (1 << 20, 7 << 20, 12345)]
                assert not any(real.in_arena(p) for p in side)
                for p in side:
                    real.free(p)
    real.end_iteration()
    assert real.session.stats.unmonitored == 3
    assert real.stats.departures == 0 and real.session.stats.reoptimizations == 0


def test_outside_iterations_and_unknown_frees():
    real, memory = allocator(events_of("vgg16"))
    w = real.alloc(1000)  # weights: before any iteration, unmonitored
    assert w % ALIGN == 0 and real.session.stats.unmonitored == 1
    real.free(0xDEAD)  # never raised (it runs inside a C callback on CUDA): recorded
    assert real.stats.errors
    real.free(w)
    assert memory.live_bytes == 0


def test_an_arena_that_cannot_grow_makes_requests_beyond_it_depart():
    events = events_of("vgg16")
    real, _ = allocator(events)
    replay(real, events)
    cap = real.arena_capacity
    # a planned block alive across the re-plan pins the arena; the grown plan departs beyond it
    real.begin_iteration()
    pin = real.alloc(events[0][2])
    assert real.in_arena(pin)
    real.end_iteration()
    replay(real, grow(events, 0, factor=8))
    assert real.arena_capacity == cap
    replay(real, grow(events, 0, factor=8))
    assert real.stats.departures_by_iteration[-1] >= 1
    real.free(pin)
    replay(real, grow(events, 0, factor=8))
    replay(real, grow(events, 0, factor=8))
    assert real.arena_capacity > cap and real.stats.departures_by_iteration[-1] == 0



def _in_a_thread(call, seconds: float = 10.0):
    """Run ``call`` in a daemon thread; fail (instead of hanging the suite) if it does not return."""
    import threading

    done: list = []
    worker = threading.Thread(target=lambda: done.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert done, f"still running after {seconds} s: a deadlock"
    return done[0]


class _CollectingMemory(FakeMemory):
    """Device memory whose next ``malloc`` frees ``victim`` first, as a garbage collection inside
    the allocator would on CUDA (the collected tensor's free callback comes back on this thread)."""

    real: RealAddressAllocator | None = None
    victim: int | None = None

    def malloc(self, size: int) -> int:
        if self.victim is not None and self.real is not None:
            victim, self.victim = self.victim, None
            self.real.free(victim)
            assert victim in self.real._by_ptr, "freed in the middle of another call"
        return super().malloc(size)


def test_a_free_from_inside_another_call_waits_for_it_instead_of_deadlocking():
    """On CUDA a collection during ``alloc`` or the planning in ``end_iteration`` can release a
    device tensor whose free callback re-enters the allocator on the same thread; with a plain lock
    that thread waited for itself forever. The free is deferred to the end of the call it interrupted."""
    memory = _CollectingMemory(alignment=ALIGN)
    real = RealAddressAllocator(BestFit(), memory, alignment=ALIGN)
    memory.real = real
    first = real.alloc(4096)
    memory.victim = first
    second = _in_a_thread(lambda: real.alloc(8192))  # its fallback malloc frees ``first``
    assert first not in real._by_ptr and second in real._by_ptr
    assert memory.live_bytes == 8192 and not real.stats.errors
    # the same inside the planning of end_iteration (the arena's malloc), with a monitored block
    real.begin_iteration()
    block = real.alloc(1 << 16)
    real.free(block)
    kept = real.alloc(1 << 12)  # alive across the iteration's end
    memory.victim = kept
    assert _in_a_thread(real.end_iteration) is True  # planned, and obtained the arena
    assert kept not in real._by_ptr and real.arena_base is not None
    real.free(second)
    real.close()
    assert memory.live_bytes == 0 and not real.stats.errors


class _FailingMemory(_CollectingMemory):
    """Once ``victim`` is set: frees it (a collection) and has no memory left."""

    def malloc(self, size: int) -> int:
        if self.victim is not None:
            super().malloc(size)  # frees the victim on the way, then allocates: give that back
            self.live_bytes -= self.live.pop(max(self.live))
            raise MemoryError("fake device memory: full")
        return super().malloc(size)


def test_a_free_deferred_inside_a_call_that_fails_still_happens_and_a_nested_request_is_refused():
    """The deferred frees run when the interrupted call ends, also when it raised (they waited for a later
    call); a request other than a free inside another call would run in the middle of its bookkeeping:
    refused, so that on CUDA the callback serves it with cudaMalloc instead."""
    memory = _FailingMemory(alignment=ALIGN)
    real = RealAddressAllocator(BestFit(), memory, alignment=ALIGN)
    memory.real = real
    victim = real.alloc(4096)
    memory.victim = victim
    with pytest.raises(MemoryError):
        real.alloc(8192)
    assert victim not in real._by_ptr and not real._deferred and memory.live_bytes == 0
    assert not real.stats.errors

    class Nested(FakeMemory):
        def malloc(self, size: int) -> int:
            with pytest.raises(RuntimeError, match="inside another one"):
                real.alloc(64)
            return super().malloc(size)

    real.fallback = Nested(alignment=ALIGN)
    assert real.alloc(128)


# --------------------------------------------------------------------------- the executor and the glue


def test_cuda_glue_imports_on_the_cpu_and_refuses_in_one_line():
    import ctypes

    torch = pytest.importorskip("torch")
    from harness.executors._cuda_pluggable import ALLOC_FN, FREE_FN, PlannedPathError, PluggableAllocator

    # the pluggable allocator's C signatures
    assert ALLOC_FN._restype_ is ctypes.c_void_p
    assert ALLOC_FN._argtypes_ == (ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
    assert FREE_FN._restype_ is None
    assert FREE_FN._argtypes_ == (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
    real, memory = allocator([])

    class Runtime:  # cudaMalloc stand-in for the emergency path
        def __init__(self):
            self.fake = FakeMemory(base=1 << 44)

        def malloc(self, size):
            return self.fake.malloc(size)

        def free(self, ptr, size):
            self.fake.free(ptr, size)

        def synchronize(self, stream):
            pass

    hook = PluggableAllocator(real, Runtime())
    assert hook.alloc_ptr and hook.free_ptr
    # through the C function pointers, as torch would call them
    c_alloc = ALLOC_FN(hook.alloc_ptr)
    c_free = FREE_FN(hook.free_ptr)
    p = c_alloc(4096, 0, None)
    assert p and p % ALIGN == 0 and memory.live_bytes == 4096
    c_free(p, 4096, 0, None)
    assert memory.live_bytes == 0 and not hook.errors
    # an exception inside the allocator never reaches C: the request is served anyway
    real.fallback = None
    p = c_alloc(1000, 0, None)
    assert p and hook.errors and hook.out_of_memory is None
    c_free(p, 1000, 0, None)
    # nothing can serve it: torch gets NULL (it does not check), and the allocator says so
    hook.runtime.fake.capacity = 0
    assert c_alloc(1000, 0, None) is None and "could not serve 1000 bytes" in hook.out_of_memory
    if not torch.cuda.is_available():
        with pytest.raises(PlannedPathError, match="needs a CUDA GPU"):
            hook.install()


def test_only_cudas_out_of_memory_error_is_an_out_of_memory():
    """After a kernel's illegal access every cudaMalloc fails with error 700: that is a fault, not a
    full device, and must not turn the row into an oom (as_out_of_memory reads out_of_memory)."""
    from harness.executors._cuda_pluggable import CUDA_ERROR_MEMORY_ALLOCATION, CudaRuntime, PluggableAllocator

    runtime = CudaRuntime.__new__(CudaRuntime)  # no libcudart here: cudaMalloc stubbed with its error codes
    codes = iter([CUDA_ERROR_MEMORY_ALLOCATION, 700])
    runtime._malloc = lambda out, size: next(codes)
    cleared = []  # cudaGetLastError: a failed cudaMalloc's error must not wait for torch's next launch check
    runtime._last_error = lambda: cleared.append(1) or 0
    with pytest.raises(MemoryError, match="out of device memory"):
        runtime.malloc(4096)
    with pytest.raises(RuntimeError, match="CUDA error 700"):
        runtime.malloc(4096)
    assert len(cleared) == 2
    real, _ = allocator([])
    real.fallback = None  # the allocator fails, and so does the emergency cudaMalloc: error 700
    runtime._malloc = lambda out, size: 700
    hook = PluggableAllocator(real, runtime)
    assert hook._alloc(4096, 0, None) == 0 and hook.out_of_memory is None and hook.errors
    runtime._malloc = lambda out, size: CUDA_ERROR_MEMORY_ALLOCATION
    assert hook._alloc(4096, 0, None) == 0 and "could not serve 4096 bytes" in hook.out_of_memory


def test_the_planned_executor_on_the_cpu_emulates_the_arena():
    """The CPU path's plumbing: the torch executor's run (time, gradients) and the simulator's trace
    replayed through the real-address allocator, whose metrics reach the run. The replay repeats
    one trace, so departures are 0 by construction here; departures are tested above."""
    pytest.importorskip("torchvision")
    from harness.plugins import registry
    from tests.torch_cases import setup

    chain, profile = setup("builtin:tiny-cnn")
    schedule = registry().planner("keep-all").plan(profile, 10**12)
    ex = registry().executor("torch-planned")
    assert ex.name == "torch-planned"
    from harness.executors.planned import TorchPlannedExecutor

    run = TorchPlannedExecutor(device="cpu", warmup=2, iterations=2).run(schedule, profile)
    m = run.metrics
    assert run.status == "ok" and run.executor == "torch-planned" and m["emulated"] == 1.0
    assert m["departures"] == 0 and m["planned_requests"] > 0
    assert m["plan_max_live_bytes"] <= m["arena_bytes"] <= m["caching_reserved_bytes"]
    assert m["grad_error"] < 1e-5
    counts = ("departures", "planned_requests", "requests", "arena_bytes", "caching_reserved_bytes", "iterations")
    assert all(type(m[k]) is int for k in counts), {k: m[k] for k in counts}  # QA: rows.csv's JSON said 120.0


def test_a_planned_run_is_judged_by_its_gradients_departures_and_arena():
    """``planned_run_problems``, what the GPU test asserts and benchmarks/gpu/planned_placement.py
    reports of each run, since the GPU session no longer runs that test beside the script: a sound
    run has no problem; each fault is named; a missing caching comparison is a fault, not a pass."""
    from harness.executors.planned import GRAD_TOLERANCE, planned_run_problems

    sound = {"grad_error_vs_caching": 0.0, "departures": 0.0, "planned_requests": 120.0,
             "plan_max_live_bytes": 900.0, "plan_bytes": 1000.0, "arena_bytes": 1024.0}
    assert planned_run_problems(sound) == []
    faults = {"grad_error_vs_caching": 10 * GRAD_TOLERANCE, "departures": 3.0, "planned_requests": 0.0,
              "arena_bytes": 512.0, "allocator_errors": 1.0}
    for key, value in faults.items():
        (problem,) = planned_run_problems({**sound, key: value})
        assert key.split("_")[0] in problem or key == "planned_requests" and "no request" in problem, problem
    (problem,) = planned_run_problems({**sound, "predicted_peak_bytes": 600.0})  # the run held more than planned
    assert "predicted peak" in problem, problem
    assert planned_run_problems({**sound, "predicted_peak_bytes": 900.0}) == []
    no_caching_run = {k: v for k, v in sound.items() if k != "grad_error_vs_caching"}
    assert planned_run_problems(no_caching_run) == ["grad_error_vs_caching nan > 0.01"]


def test_the_planned_process_runs_the_torch_executors_iterations(monkeypatch):
    """The planned process's execution (``harness.executors.planned``: the torch executor's, each
    iteration but the first monitored by the real-address allocator) run on the CPU, CUDA's
    synchronisation stubbed: its overrides take what the torch executor's ``measure`` passes
    them (``_iteration`` once lost ``timeline``, and every planned run on a GPU was a TypeError),
    every timed iteration is an allocator iteration, and the run keeps its timeline."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from harness.executors.planned import _planned_execution_class
    from harness.executors.torch_executor import TorchExecutor
    from harness.plugins import registry
    from tests.torch_cases import setup

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    chain, profile = setup("builtin:tiny-cnn")
    schedule = registry().planner("keep-all").plan(profile, 10**12)
    ex = TorchExecutor(device="cpu", warmup=2, iterations=3, grad_check=False)
    execution = _planned_execution_class()(ex, schedule, profile, chain)
    execution.real = real = RealAddressAllocator(BestFit(), FakeMemory())
    begun, resets = [], []
    begin = real.begin_iteration
    monkeypatch.setattr(real, "begin_iteration", lambda: (begun.append(1), begin())[1])
    monkeypatch.setattr(real, "reset_peaks", lambda: resets.append(len(begun)))
    try:
        run = execution.measure(None)
    finally:
        execution.close()
    assert run.status == "ok" and run.executor == "torch-planned", run.message
    assert len(begun) == ex.warmup + ex.iterations - 1  # the first iteration is not monitored
    assert resets == [0, ex.warmup - 1]  # the reserve reported is the timed iterations', as the caching run's
    assert run.metrics["iterations"] == ex.iterations and "planned_requests" in run.metrics
    assert [e.label for e in run.timeline if e.stream == "compute"] == [op.label for op in schedule.ops]


def test_a_block_carried_into_the_next_iteration_is_planned_apart_after_one_replan():
    """A block allocated in iteration t and freed in t+1 after its first request (an output kept
    across iterations) takes planned addresses the next iteration's plan knew nothing of: the
    session marks it carried, re-plans once with it alive from the iteration's start, and then
    every request is planned again (no re-plan each iteration, no endless list of reasons)."""
    real = RealAddressAllocator(BestFit(), FakeMemory())
    carry = None
    for _ in range(8):
        real.begin_iteration()
        a = real.alloc(1000)  # lambda 0: a temporary
        real.free(a)
        if carry is not None:
            real.free(carry)  # the previous iteration's output, freed after lambda 0
        carry = real.alloc(1000)  # lambda 1: lives into the next iteration
        real.end_iteration()
    assert real.stats.departures_by_iteration[-3:] == [0, 0, 0]
    assert real.session.stats.reoptimizations <= 2
    assert len(real.session.stats.reasons) <= 3


def test_an_arena_that_cannot_be_obtained_sends_planned_requests_to_the_fallback():
    """When the device refuses the arena's malloc, nothing is served at a missing base: every
    request of the next iteration departs to the fallback, counted, and nothing crashes."""
    memory = FakeMemory()
    real = RealAddressAllocator(BestFit(), memory)
    refuse = {"on": False}
    malloc = memory.malloc

    def malloc_unless_refused(size: int) -> int:
        if refuse["on"] and size >= 4096:
            raise MemoryError("no arena")
        return malloc(size)

    memory.malloc = malloc_unless_refused
    refuse["on"] = True
    for _ in range(3):
        real.begin_iteration()
        blocks = [real.alloc(2048) for _ in range(3)]
        for b in blocks:
            real.free(b)
        try:
            real.end_iteration()
        except MemoryError:
            pass
    assert real.arena_base is None
    assert real.stats.departures_by_iteration[-1] == 3


def test_the_planned_executor_runs_on_the_layout_the_case_planned_for():
    """torch-planned names no copy-engine layout of its own, so a case records the planner's on the
    schedule (``harness.case.copy_layout``) and the planned run reads it from there."""
    from harness.case import copy_layout
    from harness.executors.planned import TorchPlannedExecutor

    ex = TorchPlannedExecutor()
    assert ex.duplex is None
    assert copy_layout(ex, {"duplex": True}) is True and copy_layout(ex, {}) is False


def test_what_follows_a_null_handed_to_torch_is_an_out_of_memory():
    """torch does not check the NULL an exhausted device leaves the pluggable allocator to return; the
    kernel that writes there fails later (an illegal memory access). The planned run reports that
    error as the out-of-memory it is, with the request that could not be served: an ``oom`` row,
    as the torch executor's ``measure`` turns ``MemoryError`` into one."""
    from harness.executors._cuda_pluggable import as_out_of_memory

    class Hook:
        out_of_memory = None

    hook = Hook()
    crash = RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors ...")
    assert as_out_of_memory(crash, hook) is crash  # no NULL was handed out: the error is what it says
    hook.out_of_memory = "the device could not serve 1000 bytes (arena 0 bytes held): MemoryError: out"
    meant = as_out_of_memory(crash, hook)
    assert isinstance(meant, MemoryError)
    assert str(meant).startswith(hook.out_of_memory) and "illegal memory access was encountered)" in str(meant)
    interrupt = KeyboardInterrupt()
    assert as_out_of_memory(interrupt, hook) is interrupt  # a Ctrl-C stays one


@pytest.mark.parametrize("nothing_left", [False, True])
def test_the_planned_process_writes_its_row_and_the_gradients_of_an_ok_run(monkeypatch, tmp_path, nothing_left):
    """``python -m harness.executors.planned JOB`` end to end on the CPU, with the CUDA runtime, the
    allocator's installation and CUDA's synchronisation stubbed: an ok run writes its row and its
    gradients; a run after which the allocator had to hand torch a NULL is an ``oom`` row naming the
    request, with no gradients to compare."""
    import json

    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    import harness.executors._cuda_pluggable as glue
    from harness.executors import planned
    from harness.model import from_dict, to_dict, Run
    from harness.plugins import registry
    from tests.torch_cases import BATCH, SIZE, setup

    class Runtime(FakeMemory):
        def synchronize(self, stream):
            pass

    def install(hook):
        if nothing_left:
            hook.out_of_memory = "the device could not serve 4096 bytes (arena 0 bytes held): MemoryError: full"

    monkeypatch.setattr(glue, "CudaRuntime", lambda *args, **kwargs: Runtime())
    monkeypatch.setattr(glue.PluggableAllocator, "install", install)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    _, profile = setup("builtin:tiny-cnn")
    schedule = registry().planner("keep-all").plan(profile, 10**12)
    job = {"schedule": to_dict(schedule), "profile": to_dict(profile),
           "workload": {"model": "builtin:tiny-cnn", "batch_size": BATCH, "input_size": list(SIZE), "device": "cpu",
                        "dtype": "float32"},
           "options": {"allocator": "bestfit", "warmup": 2, "iterations": 2, "alignment": ALIGN, "seed": 0,
                       "duplex": False},
           "out": str(tmp_path)}
    (tmp_path / "job.json").write_text(json.dumps(job))
    assert planned.main([str(tmp_path / "job.json")]) == 0
    run = from_dict(Run, json.loads((tmp_path / "run.json").read_text()))
    if nothing_left:
        assert run.status == "oom" and "could not serve 4096 bytes" in run.message, run.message
        assert run.message.startswith("the device ran out of memory (planned placement"), run.message
        assert not (tmp_path / "grads.pt").exists()
    else:
        assert run.status == "ok" and run.executor == "torch-planned", run.message
        grads = torch.load(tmp_path / "grads.pt")
        assert grads and all(torch.isfinite(g).all() for g in grads.values())


def test_a_schedule_with_cudnns_autotuned_algorithm_is_refused_by_the_planned_path_before_its_process():
    """cuDNN's benchmark search asks the allocator for cacheInfo, which PyTorch's pluggable allocator
    does not have: the planned process would fail inside cuDNN. The row says so and names the stages."""
    from harness.executors.planned import TorchPlannedExecutor, autotuned_stages
    from harness.model import Algorithm, Profile, Schedule, Stage, training_ops
    from harness.protocols import Workload

    algorithms = (Algorithm("cudnn_heuristic", 1.0, 1.0, 0, 0), Algorithm("cudnn_autotuned", 0.8, 0.8, 0, 0))
    stages = tuple(Stage(f"c{i}", "conv", 1.0, 1.0, 100, 100, 100, algorithms=algorithms) for i in range(3))
    profile = Profile("t", 1, (1,), "x", 10**9, 1.0, 1.0, 0, 100, stages)
    workload = Workload("t", 1, (1,), "cuda")
    tuned = Schedule("t", 10**6, training_ops(3), algorithms=(0, 1, 1))
    run = TorchPlannedExecutor()._run_cuda(tuned, profile, workload)
    assert run.status == "error" and "cuDNN's autotuned algorithm (stage 1, 2)" in run.message
    plain = Schedule("t", 10**6, training_ops(3), algorithms=(0, 0, -1))
    assert autotuned_stages(plain, profile) == []


# --------------------------------------------------------------------------- QA: mutants that no test killed


def test_requests_of_zero_bytes_get_addresses_of_their_own():
    """A request of 0 bytes is served one alignment unit (module docstring), so that two of them alive at
    once, and the block beside them, never share an address: in the profiling iteration (the fallback)
    and at planned addresses. ``replay`` checks every live range (a 0-byte one as one byte)."""
    real, _ = allocator([])
    events = [("alloc", "a", 1000), ("alloc", "z1", 0), ("alloc", "z2", 0),
              ("free", "z1", 0), ("free", "a", 0), ("free", "z2", 0)]
    for _ in range(3):
        replay(real, events)  # raises AssertionError where two live requests share an address
    assert real.session.stats.planned == 6 and real.stats.departures == 0


class _Scripted:
    """An 'allocator' that serves the addresses it is given, whatever they overlap: what replay must catch."""

    def __init__(self, addresses):
        self.addresses = iter(addresses)

    def begin_iteration(self):
        pass

    def end_iteration(self):
        pass

    def alloc(self, size):
        return next(self.addresses)

    def free(self, ptr, size=0):
        pass


@pytest.mark.parametrize("addresses", [(4096, 4096 + 64), (4096 + 64, 4096)], ids=["below", "above"])
def test_replay_finds_two_live_requests_that_share_bytes(addresses):
    """``replay`` is what the CPU emulation of the planned path and the tests above trust to find a plan
    that hands out one address twice: an overlap with the live request just below the new one, or just
    above it, is reported, also when that request is the only one alive."""
    events = [("alloc", "x", 128), ("alloc", "y", 128)]
    with pytest.raises(AssertionError, match="overlaps a live one"):
        replay(_Scripted(addresses), events)
    assert replay(_Scripted((4096, 4096 + 128)), events) == {"x": 4096, "y": 4096 + 128}  # adjacent: no overlap


def test_a_request_the_fallback_refuses_holds_nothing_in_the_next_plan():
    """A request the fallback cannot serve raises, and leaves nothing behind in the session: the plan made
    from that iteration keeps it only for the moment it was asked for, not to the iteration's end (where
    it would sit beside every later request and inflate the arena)."""
    fallback = FakeMemory(base=1 << 44, alignment=ALIGN, capacity=1 << 20)
    real = RealAddressAllocator(BestFit(), FakeMemory(alignment=ALIGN), fallback=fallback, alignment=ALIGN)
    real.begin_iteration()
    with pytest.raises(MemoryError):
        real.alloc(2 << 20)  # more than the fallback has
    real.free(real.alloc(4096))
    real.end_iteration()
    assert real.session.plan.max_live_bytes == 2 << 20  # the refused request alone, not it and the next one
    assert fallback.live_bytes == 0 and not real.stats.errors


def test_after_the_arena_is_given_back_requests_depart_and_the_next_plan_gets_a_new_one():
    """``release_arena`` (nothing planned alive) leaves no planned address without an arena: the next
    iteration's requests depart to the fallback (counted, never a planned address at a missing base),
    its end obtains an arena again, and the iteration after is planned."""
    events = [("alloc", "a", 4096), ("alloc", "b", 8192), ("free", "a", 0), ("free", "b", 0)]
    real, memory = allocator(events)
    replay(real, events)
    replay(real, events)
    real.release_arena()
    assert real.arena_base is None and memory.live_bytes == 0
    replay(real, events)  # would raise "a planned request with no arena"
    assert real.stats.departures_by_iteration[-1] == 2 and real.arena_base is not None
    replay(real, events)
    assert real.stats.departures_by_iteration[-1] == 0 and real.stats.arena_allocations == 2


def test_a_planned_run_is_judged_at_the_edges_of_its_tolerances():
    """``planned_run_problems`` beyond one fault at a time: a plan smaller than its own trace's max-live
    bytes is no placement (a fault even when the arena holds the plan); a profiled max-live within
    ``PEAK_TOLERANCE`` of the schedule's predicted peak passes and one beyond it does not; a row that
    does not say how many timed requests departed is a fault, not a pass (as a missing gradient check)."""
    from harness.executors.planned import PEAK_TOLERANCE, planned_run_problems

    sound = {"grad_error_vs_caching": 0.0, "departures": 0, "planned_requests": 120,
             "plan_max_live_bytes": 900, "plan_bytes": 1000, "arena_bytes": 1024}
    (problem,) = planned_run_problems({**sound, "plan_bytes": 800})
    assert "not max-live 900 <= plan 800" in problem, problem
    within = 900 / PEAK_TOLERANCE + 1  # the max-live a little above the prediction, inside the tolerance
    assert within < 900 and planned_run_problems({**sound, "predicted_peak_bytes": within}) == []
    (problem,) = planned_run_problems({**sound, "predicted_peak_bytes": 900 / PEAK_TOLERANCE - 1})
    assert "predicted peak" in problem, problem
    no_departures = {k: v for k, v in sound.items() if k != "departures"}
    assert planned_run_problems(no_departures) == ["departures None"]


def _planned_execution(monkeypatch, warmup, iterations):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from harness.executors.planned import _planned_execution_class
    from harness.executors.torch_executor import TorchExecutor
    from harness.plugins import registry
    from tests.torch_cases import setup

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    chain, profile = setup("builtin:tiny-cnn")
    schedule = registry().planner("keep-all").plan(profile, 10**12)
    ex = TorchExecutor(device="cpu", warmup=warmup, iterations=iterations, grad_check=False)
    execution = _planned_execution_class()(ex, schedule, profile, chain)
    execution.real = RealAddressAllocator(BestFit(), FakeMemory())
    return execution


def test_the_planned_rows_departures_are_the_timed_iterations_alone(monkeypatch):
    """A warm-up iteration after the profiling one may depart and re-plan (papers/003 section 4.3: the
    planned process re-plans while a warm-up iteration departs); the row's ``departures``, by which
    ``planned_run_problems`` judges the run, counts the timed iterations' requests only. On the CPU no
    tensor reaches the allocator: each monitored iteration makes one request of its own."""
    execution = _planned_execution(monkeypatch, warmup=3, iterations=2)
    real = execution.real
    sizes = iter([1000, 5000, 5000, 5000])  # profiling, a warm-up larger than profiled (departs), 2 timed
    begin = real.begin_iteration

    def begin_with_a_request():
        begin()
        real.free(real.alloc(next(sizes)))

    monkeypatch.setattr(real, "begin_iteration", begin_with_a_request)
    try:
        run = execution.measure(None)
    finally:
        execution.close()
    assert run.status == "ok", run.message
    assert real.stats.departures_by_iteration == [0, 1, 0, 0]
    assert run.metrics["departures"] == 0 and run.metrics["reoptimizations"] == 1


def test_an_iteration_that_fails_still_ends_the_allocators_iteration(monkeypatch):
    """A monitored iteration that fails (here: the allocator had handed torch a NULL) is closed before the
    error goes on to become the oom row: the allocator is not left monitoring, as if the iteration were
    still under way, and the row's figures count it."""
    from types import SimpleNamespace

    execution = _planned_execution(monkeypatch, warmup=2, iterations=1)
    real = execution.real
    execution.hook = hook = SimpleNamespace(out_of_memory=None, errors=[])
    begin = real.begin_iteration

    def begin_then_nothing_left():
        begin()
        hook.out_of_memory = "the device could not serve 4096 bytes (arena 0 bytes held): MemoryError: full"

    monkeypatch.setattr(real, "begin_iteration", begin_then_nothing_left)
    try:
        run = execution.measure(None)
    finally:
        execution.close()
    assert run.status == "oom" and "could not serve 4096 bytes" in run.message, run.message
    assert not real.session.monitoring and real.session.stats.iterations == 1
    assert real.stats.departures_by_iteration == [0]


class _Runtime(FakeMemory):
    """cudaMalloc/cudaFree/cudaStreamSynchronize stand-in: an address space of its own, synchronisations recorded."""

    def __init__(self):
        super().__init__(base=1 << 44, alignment=ALIGN)
        self.synced: list[int] = []

    def synchronize(self, stream):
        self.synced.append(stream)


def test_side_streams_are_synchronised_before_an_arena_block_is_freed_or_a_side_stream_allocates():
    """``_cuda_pluggable`` assumption 4: the pluggable allocator ignores ``record_stream``, so freeing a
    planned (arena) address first waits for the copy streams that may still read it, and a request made
    on a copy stream first waits for the compute stream. Only those: a request on the compute stream and
    the free of a fallback block (never handed out again before cudaFree returns) wait for nothing."""
    from harness.executors._cuda_pluggable import PluggableAllocator

    COMPUTE, D2H, H2D = 11, 22, 33
    real, _ = allocator([])
    runtime = _Runtime()
    hook = PluggableAllocator(real, runtime)
    hook.set_streams(COMPUTE, [D2H, H2D, COMPUTE])  # the compute stream among them is not a side stream
    for _ in range(2):  # profile, then planned
        real.begin_iteration()
        planned = hook._alloc(4096, 0, COMPUTE)
        assert runtime.synced == []
        if real.in_arena(planned):
            break
        hook._free(planned, 4096, 0, COMPUTE)
        real.end_iteration()
    assert real.in_arena(planned)
    weights = hook._alloc(1000, 0, D2H)  # e.g. a prefetch's destination, outside the plan's sequence
    assert runtime.synced == [COMPUTE] and not real.in_arena(weights)
    runtime.synced.clear()
    hook._free(weights, 1000, 0, D2H)
    assert runtime.synced == []
    hook._free(planned, 4096, 0, COMPUTE)
    assert runtime.synced == [D2H, H2D]
    real.end_iteration()
    assert not hook.errors and not real.stats.errors


def test_an_emergency_block_goes_back_to_cuda_and_the_first_request_nothing_served_is_the_one_named():
    """A request the allocator failed is served by cudaMalloc (assumption 3); its free goes back to
    cudaFree alone, never also to the allocator (which did not serve it: an error). When nothing can
    serve a request, ``out_of_memory`` names the first such request, not a later one."""
    from harness.executors._cuda_pluggable import PluggableAllocator

    real, memory = allocator([])
    runtime = _Runtime()
    hook = PluggableAllocator(real, runtime)
    real.fallback = None  # the allocator fails every request
    p = hook._alloc(1000, 0, 0)
    assert p and runtime.live_bytes == 1000 and len(hook.errors) == 1
    hook._free(p, 1000, 0, 0)
    assert runtime.live_bytes == 0 and len(hook.errors) == 1 and not real.stats.errors
    runtime.capacity = 0
    assert hook._alloc(3000, 0, 0) == 0 and hook._alloc(5000, 0, 0) == 0
    assert "could not serve 3000 bytes" in hook.out_of_memory
