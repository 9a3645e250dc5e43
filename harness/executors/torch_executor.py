"""The ``torch`` executor: run any schedule on the real model and measure it.

It trains with exactly the schedule's decisions, operation by operation in
``Schedule.ops`` order, the chain cut as the profilers cut it (``_torch_chain``):

- F_i runs stage i under ``saved_tensors_hooks`` that put what it saves in the
  ``SavedStore`` (grouped per stage, by storage, with the profiler's attribution rule);
  Fc_i and Fn_i run it under ``torch.no_grad`` (Fc_i keeping its input, the checkpoint),
  and R_i runs it again before B_i, from that input or from R_{i-1}'s output, with the
  random state of its first run, saving into the store like F_i (``_torch_chain``);
- a transfer is issued at the start or end of its ``issue_op``; an offload whose data
  is not produced yet (issued at the start of F_i) goes when F_i is over; offloads and
  prefetches run on side CUDA streams into pinned host buffers reused across
  iterations (``_torch_copies``), each engine's in list order; the compute stream waits
  for a copy only before its ``wait_op`` (vDNN's per-layer synchronisation), before the
  backward that reads the data (before R_i for a checkpoint: a transfer of an ``Fc``
  stage moves the input x_i that Fc_i keeps, held in the store as a block of the stage
  from Fc_i to R_i) and, for a block that kept its head, before the prefetch regrows it
  (its offload must be over); a prefetch that does not fit waits for memory, holding back
  the copies listed after it on its engine: it is retried after every later operation and
  forced before its ``wait_op``, its backward, or a later copy on its engine that an
  operation waits for (with a device synchronisation only if the allocator refuses it);
- B_i runs the backward of stage i from its output's gradient to its input's;
- sub-batches are gradient accumulation (``Schedule.sub_batches``: the batch split in
  that many parts, gradients summed);
- each stage runs with its algorithm where PyTorch lets one choose (``Schedule.algorithms``
  indices into the profile's ``Stage.algorithms``, by name: cuDNN heuristic,
  autotuned or off on CUDA; oneDNN or native on the CPU; others run the default);
- nothing else: it reads no ``Schedule.options`` and does not know which planner made
  the schedule. Its own option ``save_on_cpu`` runs every forward's saving through
  PyTorch's ``torch.autograd.graph.save_on_cpu`` instead of the store (the schedule's
  transfers then do not run: PyTorch's hooks copy everything).

The budget is enforced for real on CUDA (``torch.cuda.set_per_process_memory_fraction``):
an out-of-memory is a Run with status ``oom``. On both devices a prefetch waits, in list
order on its engine, until the simulator's memory as the operation about to run starts
(every saved tensor on the device, less the bytes the store has on the host:
``Lowered.resident_in_use``) and its own bytes fit the schedule's (chain) budget; where only
offloads still copying keep it out, the host waits for the oldest of them, unless the
simulator starts the prefetch past the middle of that operation (then it is tried again once
the operation is issued). On CUDA an operation likewise waits for the oldest offloads still
copying until its allocation fits. On the CPU the same code runs with host memory standing in for device
memory; ``emulate_budget`` then checks the bytes held (weights + saved data, measured on the
storages) against the budget after every operation.

Measured per run (``Run.metrics``): iteration time (median, min, max, interquartile
range) over ``iterations`` timed iterations after ``warmup`` ones, bytes moved, stall
time (the compute stream waiting for copies), ``max_memory_allocated`` and
``max_memory_reserved`` on CUDA, the most saved bytes held; beside them the
simulator's prediction for the same schedule (recomputation charged) and the
prediction error.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ContextManager, Iterator

import numpy as np
import torch

from harness.errors import MembudgetError
from harness.executors._torch_chain import ChainPass, TorchChain, build_chain, output_gradient
from harness.executors._torch_copies import Clock, CpuCopies, CudaCopies, HostPool
from harness.chain.extract import concrete
from harness.executors._torch_store import GroupKey, SavedStore, split_offload
from harness.executors.grad_check import ReferenceCache, gradient_error
from harness.memory import movable_bytes, stage_memory
from harness.model import DEVICE_OFFLOAD_START, Profile, Run, Schedule, TimelineEvent, chosen_algorithms, duplex_of
from harness.protocols import Workload
from harness.simulate.lowering import pass_profiles, stage_profile
from harness.simulate.reference import Timing


class ScheduleMismatch(MembudgetError):
    """The schedule, the profile and the model do not describe the same chain."""


class BudgetExceeded(MembudgetError):
    """On the CPU with ``emulate_budget``: the bytes held went above the budget."""


@dataclass
class ExecutionRecord:
    """What the last run did, for tests and reports (the recorded iteration is the last one).

    ``held[k]``: bytes each group (sub_batch, stage) held on the device after operation
    k and the transfers issued at its end; ``held_before[k]``: the same just before
    operation k ran (its start-issued transfers done); ``group_bytes``: each group's full size when its forward was over; ``times``: the
    seconds of every timed iteration.
    """

    held: list[dict[GroupKey, int]] = field(default_factory=list)
    held_before: list[dict[GroupKey, int]] = field(default_factory=list)
    group_bytes: dict[GroupKey, int] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)
    algorithms: dict[int, str] = field(default_factory=dict)
    timeline: tuple[TimelineEvent, ...] = ()


def algorithm_context(name: str | None, device: torch.device) -> ContextManager | None:
    """The context that runs a stage with the algorithm ``name``; None when PyTorch has no such switch."""
    if name is None:
        return None
    if device.type == "cuda":
        cudnn = torch.backends.cudnn
        keep = {"deterministic": cudnn.deterministic, "allow_tf32": cudnn.allow_tf32}
        choices = {
            "cudnn_heuristic": lambda: cudnn.flags(enabled=True, benchmark=False, **keep),
            "cudnn_autotuned": lambda: cudnn.flags(enabled=True, benchmark=True, **keep),
            "native": lambda: cudnn.flags(enabled=False, benchmark=False, **keep),
        }
    else:
        choices = {
            "onednn": nullcontext,
            "native": lambda: torch.backends.mkldnn.flags(enabled=False),
        }
    make = choices.get(name)
    return make() if make is not None else None


def on_cuda(device: torch.device) -> bool:
    """Whether an execution on ``device`` takes the CUDA path: side streams, events, pinned buffers, the
    allocator's cap and statistics (``tests/fake_cuda.py`` runs that path on the CPU)."""
    return device.type == "cuda"


def resolve_device(workload: Workload | None, device: str | None) -> torch.device:
    """The torch device to run on: ``device`` if given, the workload's if it is one, else cuda or cpu."""
    for candidate in (device, workload.device if workload else None):
        if not candidate:
            continue
        try:
            resolved = torch.device(candidate)
        except RuntimeError:
            continue  # a device-spec name (V100-PCIe): not a torch device
        if resolved.type == "cuda" and not torch.cuda.is_available():
            raise MembudgetError("the torch executor was asked for cuda, but no CUDA GPU is available here")
        return resolved
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def workload_on(workload: Workload | None, profile: Profile, device: torch.device) -> Workload:
    """``workload`` (or, when None, the profile's model, batch, input and dtype) on ``device``."""
    if workload is None:
        return Workload.of(profile, str(device))
    return workload


def check_compatible(schedule: Schedule, profile: Profile, chain: TorchChain | None = None) -> None:
    """Raise ``ScheduleMismatch`` unless schedule, profile and model describe the same chain."""
    from harness.validate import check_structure

    stages = {op.stage for op in schedule.ops}
    planned = max(stages) + 1 if stages else 0
    if planned != profile.n_stages:
        raise ScheduleMismatch(
            f"the schedule of {schedule.planner} was planned for a chain of {planned} stages, but the profile of "
            f"{profile.model} at batch {profile.batch_size} has {profile.n_stages}: plan it for this profile"
        )
    if chain is not None:
        if chain.n_stages != profile.n_stages:
            raise ScheduleMismatch(
                f"the profile of {profile.model} has {profile.n_stages} stages but the model cuts into "
                f"{chain.n_stages} at batch {chain.workload.batch_size}, input {list(chain.workload.input_size)}: "
                "profile the same model and input"
            )
        if chain.example.shape[0] != profile.batch_size:
            raise ScheduleMismatch(
                f"the profile is for batch {profile.batch_size} but the workload's batch is {chain.example.shape[0]}"
            )
    problems = check_structure(schedule, profile)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ScheduleMismatch(f"the schedule of {schedule.planner} cannot run on this chain: {problems[0]}{more}")
    if schedule.sub_batches > profile.batch_size:
        raise ScheduleMismatch(f"{schedule.sub_batches} sub-batches for a batch of {profile.batch_size}")


def predict(schedule: Schedule, profile: Profile, duplex: bool | None = None) -> Run:
    """The simulator's run of ``schedule`` as this executor runs it, without trace (copy engines
    ``duplex``, default: the schedule's). Its offloads start once the forward that produces the
    stage's saved data has run (``_after_forward``), where papers/004's rule, the simulator's
    default, lets them overlap that forward: so it predicts under ``DEVICE_OFFLOAD_START``. On the
    H200's 2026-11-29 rows that takes the median |prediction_error| from 0.149 to 0.096
    (benchmarks/gpu/offload_rule.py)."""
    from harness.simulate.executor import simulate

    return simulate(schedule, profile, duplex=duplex, offload_start=DEVICE_OFFLOAD_START, with_trace=False)


class TorchExecutor:
    """Runs a schedule on the real model with PyTorch (CUDA, or the CPU standing in for it).

    Options: ``device`` (default: the workload's torch device, else cuda if available,
    else cpu), ``warmup`` and ``iterations`` (untimed and timed iterations), ``duplex``
    (one copy stream per direction; default None: the schedule's layout, ``Schedule.duplex``),
    ``enforce_budget`` (CUDA memory cap), ``cap_bytes`` (CUDA: the cap to enforce instead of the schedule's budget, e.g. the
    budget plus what the framework holds beyond the chain model), ``expandable_segments``
    (CUDA: the caching allocator maps memory in expandable segments during the run, as
    ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` does, so that less of the budget
    is lost to fragmentation), ``emulate_budget`` (CPU check), ``seed`` (reseeded at every
    iteration, so that each iteration computes the same gradients), ``record`` (keep the bytes held after every
    operation in ``last_record``), ``save_on_cpu`` (PyTorch's ``save_on_cpu`` hooks instead of the
    schedule's transfers: every saved tensor to the host as it is saved, back when it is used),
    ``grad_check`` (after the timed iterations, compare the gradients with the unmodified
    model's on the same batch: metric ``grad_error``, ``harness.executors.grad_check``).
    """

    name = "torch"
    description = "Runs the schedule on the real model: saved-tensor hooks, side CUDA streams, pinned buffers"

    def __init__(self, device: str | None = None, warmup: int = 2, iterations: int = 5, duplex: bool | None = None,
                 enforce_budget: bool = True, emulate_budget: bool = False, seed: int = 0, record: bool = False,
                 expandable_segments: bool = False, cap_bytes: int | None = None, save_on_cpu: bool = False,
                 grad_check: bool = True):
        self.device, self.warmup, self.iterations = device, warmup, iterations
        self.duplex, self.enforce_budget, self.emulate_budget = duplex, enforce_budget, emulate_budget
        self.expandable_segments, self.cap_bytes = expandable_segments, cap_bytes
        self.seed, self.record, self.save_on_cpu, self.grad_check = seed, record, save_on_cpu, grad_check
        self.last_record = ExecutionRecord()
        self._chain: TorchChain | None = None
        self._references = ReferenceCache()  # the chain's unmodified gradients, computed once (grad_check)

    # -- the Executor protocol
    def run(self, schedule: Schedule, profile: Profile, workload: Workload | None = None) -> Run:
        """Build (or reuse) the workload's model on the device and execute ``schedule`` on it."""
        check_compatible(schedule, profile)
        device = resolve_device(workload, self.device)
        return self.execute(schedule, profile, self.chain(workload_on(workload, profile, device), device))

    def chain(self, workload: Workload, device: torch.device) -> TorchChain:
        """The chain of ``workload`` on ``device``, kept for the next run of the same workload."""
        device = concrete(device)  # cuda -> cuda:0, as the chain records it: else no case reused it on CUDA
        key = (workload.model, workload.batch_size, tuple(workload.input_size), workload.dtype, str(device))
        cached = self._chain
        if cached is not None:
            w = cached.workload
            if (w.model, w.batch_size, tuple(w.input_size), w.dtype, str(cached.device)) == key:
                return cached
        self._chain = None
        self._references.clear()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        self._chain = build_chain(workload, device)
        return self._chain

    # -- execution
    def execute(self, schedule: Schedule, profile: Profile, chain: TorchChain) -> Run:
        """Run ``schedule`` on ``chain`` (warm-up, then timed iterations) and report it."""
        check_compatible(schedule, profile, chain)
        prediction = _safe_predict(schedule, profile, duplex_of(schedule, self.duplex))
        execution = _Execution(self, schedule, profile, chain)
        try:
            run = execution.measure(prediction)
        finally:
            execution.close()
        elsewhere = _timed_elsewhere(profile, chain.device)
        if elsewhere and run.status == "ok":
            run = replace(run, message=f"{run.message}; {elsewhere}" if run.message else elsewhere)
        if self.grad_check and run.status == "ok":  # after the memory statistics were read
            try:
                error = gradient_error(chain, schedule.sub_batches, self.seed, self._references)
            except RuntimeError as exc:
                if not ran_out_of_memory(exc):
                    raise
                error = None
            if error is None:  # out of the except block, so that the failed pass's tensors can go
                gc.collect()
                if execution.cuda:
                    torch.cuda.empty_cache()
                note = "no gradient check: the unmodified model does not fit the device"
                return replace(run, message=f"{run.message}; {note}" if run.message else note)
            run = replace(run, metrics={**run.metrics, "grad_error": error})
        return run


def _timed_elsewhere(profile: Profile, device: torch.device) -> str:
    """A note when ``profile``'s times are not this device's (an analytic V100 estimate run on the CPU): the
    row's ratios to them (x ideal, prediction_error) then compare two devices. Empty when it was measured here."""
    here = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if profile.measured and profile.device == here:
        return ""
    how = "measured" if profile.measured else profile.profiler
    return (f"the profile's times are {profile.device}'s ({how}), not this {here}'s: its ratios to them (x ideal, "
            "prediction_error) compare two devices")


def _safe_predict(schedule: Schedule, profile: Profile, duplex: bool) -> Run | None:
    try:
        return predict(schedule, profile, duplex)
    except (NotImplementedError, ValueError):
        return None


def _simulated(schedule: Schedule, profile: Profile, duplex: bool) -> tuple[np.ndarray | None, Timing | None]:
    """Per operation, the simulator's memory once it has started, every saved tensor on the device
    (``Lowered.resident_in_use``), and the simulator's timing of the schedule as this executor runs
    it (None where it gets stuck); both None when the schedule cannot be lowered on the profile (the
    executor runs it all the same)."""
    from harness.simulate.executor import timing

    try:
        low, tm = timing(schedule, profile, duplex=duplex, offload_start=DEVICE_OFFLOAD_START)
    except (NotImplementedError, ValueError):
        return None, None
    return low.resident_in_use(), (tm if tm.ok else None)


class _Execution:
    """One ``execute`` call: the state shared by its iterations."""

    # whether an offload's memory counts as in use until its copy's event says it is over (``_releasing_bytes``)
    tracks_copies_in_flight = True

    def __init__(self, executor: TorchExecutor, schedule: Schedule, profile: Profile, chain: TorchChain):
        self.ex, self.schedule, self.profile, self.chain = executor, schedule, profile, chain
        self.cuda = on_cuda(chain.device)
        self.sp = stage_profile(profile, schedule)
        self.passes = pass_profiles(profile, schedule)
        self.store = SavedStore(chain.weight_keys(), chain.device)
        self.pool = HostPool(pinned=self.cuda)
        self.clock = Clock(self.cuda)
        duplex = duplex_of(schedule, executor.duplex)
        self.copies = (CudaCopies(chain.device, self.pool, self.clock, duplex) if self.cuda
                       else CpuCopies(self.pool, self.clock))
        self.record = ExecutionRecord()
        self.native = executor.save_on_cpu
        self.native_moved = 0
        self.contexts = self._algorithms()
        self.issued: dict[tuple[int, str], list[int]] = {}
        self.waits: dict[int, list[int]] = {}
        # the copy engines' queues, in list order (one shared, or one per direction when duplex): a copy
        # starts once those before it on its engine have, as on the simulator's engines
        self.engines: list[list[int]] = [[], []] if duplex else [[]]
        self.engine_of: list[int] = []
        self.position: list[int] = []  # each transfer's place in its engine's queue
        self.prefetches_of: dict[GroupKey, list[int]] = {}
        for j, tr in enumerate(schedule.transfers):
            self.issued.setdefault((tr.issue_op, tr.issue_at), []).append(j)
            if tr.wait_op is not None:
                self.waits.setdefault(tr.wait_op, []).append(j)
            engine = 1 if duplex and tr.direction == "prefetch" else 0
            self.engine_of.append(engine)
            self.position.append(len(self.engines[engine]))
            self.engines[engine].append(j)
            if tr.direction == "prefetch":
                self.prefetches_of.setdefault((tr.sub_batch, tr.stage), []).append(j)
        inputs = list(torch.tensor_split(chain.example, schedule.sub_batches))
        self.inputs = inputs
        self.grads: list[torch.Tensor] | None = None
        self.cap: float | None = None
        self.limit_bytes: int | None = None  # the cap as set, in bytes (CUDA, budget enforced)
        self.handles: dict[int, Any] = {}
        kinds = {(op.sub_batch, op.stage): op.kind for op in schedule.ops if op.is_forward}
        self.kinds = kinds
        # the checkpoints the schedule moves: their Fc_i keeps x_i in the store, from Fc_i to R_i
        self.moved_checkpoints = {(tr.sub_batch, tr.stage) for tr in schedule.transfers
                                  if kinds.get((tr.sub_batch, tr.stage)) == "Fc"}
        self.resident, self.planned = _simulated(schedule, profile, duplex)
        self.weights = chain.trained_weight_bytes()  # once: summing the storages costs a millisecond
        # the first operation of each sub-batch's last stage: its output gradient goes to the device there
        first: dict[int, int] = {}
        for k, op in enumerate(schedule.ops):
            if op.stage == profile.n_stages - 1:
                first.setdefault(op.sub_batch, k)
        self.grad_at = {k: sb for sb, k in first.items()}
        self.staged_grads: dict[int, torch.Tensor] = {}
        self.releasing: list[tuple[Any, int]] = []
        self._reset_queues()
        self._reset_counts()  # room_waits, room_wait_s: host waits for offloads (_wait_for_offloads)
        self.next_op = 0  # the operation the compute stream runs next (a prefetch's room counts its allocation)

    # -- setup
    def _algorithms(self) -> dict[int, Callable[[], ContextManager | None]]:
        contexts: dict[int, Callable[[], ContextManager | None]] = {}
        for i, name in chosen_algorithms(self.schedule, self.sp).items():
            if algorithm_context(name, self.chain.device) is not None:
                contexts[i] = lambda name=name: algorithm_context(name, self.chain.device)
                self.record.algorithms[i] = name
        return contexts

    def algorithm(self, stage: int) -> ContextManager:
        make = self.contexts.get(stage)
        return (make() or nullcontext()) if make is not None else nullcontext()

    def packing(self, sb: int, stage: int) -> ContextManager:
        if self.native:
            return self._native_save_on_cpu()
        return self.store.packing(sb, stage)

    @contextmanager
    def _native_save_on_cpu(self) -> Iterator[None]:
        native = torch.autograd.graph.save_on_cpu(pin_memory=self.cuda)

        def pack(t: torch.Tensor) -> Any:
            self.native_moved += t.numel() * t.element_size()
            return native.pack_hook(t)

        def unpack(packed: Any) -> torch.Tensor:
            t = native.unpack_hook(packed)
            self.native_moved += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    # -- measuring
    def measure(self, prediction: Run | None) -> Run:
        ex = self.ex
        times: list[float] = []
        moved_before = stall_before = 0.0
        try:
            self._drop_grads()  # the last case's gradients: not this case's memory, under its cap or in its peaks
            self._set_cap()
            self._reset_stats()  # an oom during warm-up reports this case's peaks, not the last case's
            for k in range(ex.warmup + ex.iterations):
                if k == ex.warmup:
                    self._reset_stats()
                    moved_before, stall_before = self.copies.moved_bytes + self.native_moved, self.copies.stall_s
                last = k == ex.warmup + ex.iterations - 1
                seconds = self._iteration(record=last and ex.record, timeline=last)
                if k >= ex.warmup:
                    times.append(seconds)
        except (torch.OutOfMemoryError, MemoryError, BudgetExceeded) as exc:
            return self._oom(exc, prediction)
        except RuntimeError as exc:
            if self.cap is None or not ran_out_of_memory(exc, capped=True):
                raise
            return self._oom(exc, prediction)
        finally:
            self._release_cap()
        n = max(len(times), 1)
        moved = int((self.copies.moved_bytes + self.native_moved - moved_before) / n)
        stall = (self.copies.stall_s - stall_before) / n
        self.record.times = times
        ex.last_record = self.record
        return self._report(times, moved, stall, prediction)

    def _set_cap(self) -> None:
        if self.cuda and self.ex.expandable_segments:
            torch.cuda.memory._set_allocator_settings("expandable_segments:True")
        if not (self.cuda and self.ex.enforce_budget):
            return
        gc.collect()
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(self.chain.device).total_memory
        cap = self.ex.cap_bytes if self.ex.cap_bytes is not None else (
            self.schedule.device_budget_bytes or self.schedule.budget_bytes)
        self.cap = min(1.0, cap / total)
        self.limit_bytes = int(self.cap * total)
        torch.cuda.set_per_process_memory_fraction(self.cap, self.chain.device)

    def _release_cap(self) -> None:
        if self.cuda and self.ex.expandable_segments:
            torch.cuda.memory._set_allocator_settings("expandable_segments:False")
        if self.cap is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, self.chain.device)

    def _drop_grads(self) -> None:
        for p in self.chain.graph.gm.parameters():
            p.grad = None

    def _reset_counts(self) -> None:
        """Start the executor's own peaks and counts again (the timed iterations report theirs)."""
        self.held_max = self.resident_max = 0  # resident_max, CPU: the most weights + saved bytes held after an op
        self.room_waits, self.room_wait_s = 0, 0.0

    def _reset_stats(self) -> None:
        self._reset_counts()
        if self.cuda:
            torch.cuda.synchronize(self.chain.device)
            torch.cuda.reset_peak_memory_stats(self.chain.device)

    def _iteration(self, record: bool, timeline: bool = False) -> float:
        """One training iteration in schedule order; returns its seconds. ``record``: keep the bytes
        held after every operation; ``timeline``: keep its operations and copies as measured (the
        marks are taken in every iteration, since the copies' stall time needs them)."""
        chain, schedule = self.chain, self.schedule
        self._drop_grads()
        self.store.clear()
        self.staged_grads.clear()
        self.releasing = []  # offloads in flight on CUDA: (their event, bytes)
        self._reset_queues()
        if record:
            self.record.held, self.record.held_before, self.record.group_bytes = [], [], {}
        torch.manual_seed(self.ex.seed)
        stream = torch.cuda.current_stream(chain.device) if self.cuda else None
        if self.cuda:
            torch.cuda.synchronize(chain.device)
        self.clock.start(stream)
        chain_pass = ChainPass(chain, self.inputs, self._grad, self.packing, self._forward_end, self.algorithm,
                               on_constant=self.store.note_constant)
        try:
            for k, op in enumerate(schedule.ops):
                self.next_op = k
                if k in self.grad_at:
                    self._stage_grad(self.grad_at[k])
                self._make_room(k)
                self._issue(k, "start")
                for j in self.waits.get(k, ()):
                    self._submit_through(j)
                    self.copies.wait(self.handles.get(j))
                group = (op.sub_batch, op.stage)
                if op.kind == "B" or (op.kind == "R" and group in self.moved_checkpoints):
                    self._resident(group)
                if record:
                    self.record.held_before.append(self.store.device_bytes())
                start = self.clock.mark(stream)
                if op.kind == "B":
                    chain_pass.backward(op.stage, op.sub_batch)
                elif op.kind == "R":
                    chain_pass.recompute(op.stage, op.sub_batch)
                    self.store.release(op.sub_batch, op.stage)
                    self._after_forward(op.sub_batch, op.stage)
                else:
                    chain_pass.forward(op.stage, op.sub_batch, op.kind)
                    if op.kind == "Fc" and group in self.moved_checkpoints and not self.native:
                        x = chain_pass.kept_input(op.stage, op.sub_batch)
                        if x is not None:
                            self.store.keep(op.sub_batch, op.stage, x)
                        self._after_forward(op.sub_batch, op.stage)
                    elif op.kind == "F":
                        self._after_forward(op.sub_batch, op.stage)
                self.clock.span(op.label, "compute", start, self.clock.mark(stream))
                self.next_op = k + 1
                self._issue(k, "end")
                self._start_copies()
                self._account(record)
            self.copies.join()
            end = self.clock.mark(stream)
            self.copies.synchronize()
            self.copies.resolve()
            seconds = self.clock.seconds(end)
            if timeline:
                self._timeline()
            return seconds
        except BaseException:
            if self.cuda:  # the copies still writing prefetched blocks end before the blocks are dropped
                try:
                    self.copies.synchronize()
                except RuntimeError:
                    pass  # a device fault: the error being raised says more
            raise
        finally:
            chain_pass.close()
            self.handles = {}

    def _grad(self, sb: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The output gradient of sub-batch ``sb``: a slice of the whole batch's (fixed by the seed),
        already on the device once ``_stage_grad`` has sent it."""
        if self.grads is None:
            full = output_gradient((self.chain.example.shape[0], *shape[1:]), dtype, self.ex.seed)
            if self.cuda:
                full = full.pin_memory()
            self.grads = list(torch.tensor_split(full, self.schedule.sub_batches))
        staged = self.staged_grads.pop(sb, None)
        return staged if staged is not None else self.grads[sb]

    def _stage_grad(self, sb: int) -> None:
        """On CUDA, send sub-batch ``sb``'s output gradient to the device as its last stage's first
        operation begins, before the transfers issued there. Copied inside the backward, it queued
        on the copy engine behind every prefetch issued at the backward's start, and the backward
        waited for them all (the H200's ViT-B/16 vDNN rows, 2026-11-29: B of the last stage took
        404 ms more than its profile, ResNet-50's 30 ms more, even under save_on_cpu)."""
        if self.cuda and self.grads is not None:
            self.staged_grads[sb] = self.grads[sb].to(self.chain.device, non_blocking=True)

    # -- transfers
    def _reset_queues(self) -> None:
        self.ready: set[int] = set()  # transfers whose issue point has passed
        self.heads = [0] * len(self.engines)  # per engine, the first transfer not yet started
        self.forwarded: set[GroupKey] = set()  # groups whose forward has produced their saved data
        self.late_offloads: dict[GroupKey, list[int]] = {}  # started out of order, for their forward's end

    def _issue(self, k: int, at: str) -> None:
        if self.native:
            return  # PyTorch's own hooks do the copies
        self.ready.update(self.issued.get((k, at), ()))
        self._start_copies()

    def _start_copies(self) -> None:
        """Start, on each engine in list order, every transfer that may: issued, and an offload once its
        forward has produced the data, a prefetch once the budget has room for it (``_prefetch``). The
        first that may not holds back those after it, as on the simulator's engine."""
        for engine, queue in enumerate(self.engines):
            while self.heads[engine] < len(queue):
                j = queue[self.heads[engine]]
                tr = self.schedule.transfers[j]
                if j not in self.ready:
                    break
                if tr.direction == "offload":
                    if (tr.sub_batch, tr.stage) not in self.forwarded:
                        break
                    self._offload(j)
                elif not self._prefetch(j):
                    break
                self.heads[engine] += 1

    def _submit_through(self, j: int) -> None:
        """Transfer ``j`` started, and every one before it on its engine, now (an operation waits for it):
        prefetches forced (``_force_prefetch``), an offload whose forward has not run yet left for its end."""
        if self.native:
            return
        engine = self.engine_of[j]
        queue = self.engines[engine]
        while self.heads[engine] <= self.position[j]:
            jj = queue[self.heads[engine]]
            tr = self.schedule.transfers[jj]
            group = (tr.sub_batch, tr.stage)
            if tr.direction == "prefetch":
                self._force_prefetch(jj)
            elif group in self.forwarded:
                self._offload(jj)
            else:
                self.late_offloads.setdefault(group, []).append(jj)
            self.heads[engine] += 1

    def _after_forward(self, sb: int, stage: int) -> None:
        """The stage's saved data exists: offloads issued before it may go now."""
        group = (sb, stage)
        self.forwarded.add(group)
        for j in self.late_offloads.pop(group, ()):
            self._offload(j)
        self._start_copies()

    def _forward_end(self, sb: int, stage: int, output: torch.Tensor | None) -> None:
        self.store.end_forward(sb, stage, output)
        if self.ex.record:
            self.record.group_bytes[(sb, stage)] = self.store.group_bytes((sb, stage))

    def _offload(self, j: int) -> None:
        tr = self.schedule.transfers[j]
        group = (tr.sub_batch, tr.stage)
        blocks = [b for b in self.store.blocks(group) if not b.moved]
        plan = split_offload(blocks, self._amount(tr.nbytes, group))
        if plan:
            # the device bytes the copies free when they are over: each block whole (a block that keeps its
            # head gets a new, smaller storage at once, counted as held; the old one goes with the copy)
            freed = sum(block.device_bytes for block, _ in plan)
            self.handles[j] = self.copies.offload(plan, f"offload {tr.stage}" + (f"/{tr.sub_batch}" if tr.sub_batch else ""))
            if self.handles[j] is not None and self.tracks_copies_in_flight:
                self.releasing.append((self.handles[j], freed))

    def _releasing_bytes(self) -> int:
        """The bytes of the offloads still copying (CUDA): their storages are shrunk already, but the
        allocator reuses the memory only once the copy is over (``record_stream``), as the simulator
        releases an offload's bytes at its end (papers/004 assumption E)."""
        while self.releasing and self.releasing[0][0].query():
            self.releasing.pop(0)
        return sum(nbytes for _, nbytes in self.releasing)

    def _make_room(self, k: int) -> None:
        """The simulator's rule for an operation: it starts once its allocation fits the budget
        beside the memory in use as it starts (``_in_use``) and the offloads still copying; so wait (on the
        host, where the allocator decides) for the oldest offloads until it fits. Without this a
        forward ran ahead of the copies freeing its memory, the allocator's reserve grew to the
        cap, and there it synchronised with every copy at once (the H200's vDNN++, capacity and
        moDNN forwards, 2026-11-29: 5-35 ms each, up to 160 ms in a stage)."""
        if self.releasing and self._wait_for_offloads(self._in_use(k)):
            self._start_copies()  # the memory freed may let a waiting prefetch start with the operation

    def _wait_for_offloads(self, base: int) -> bool:
        """Wait on the host for the oldest offloads still copying until ``base`` bytes and theirs fit the
        budget; whether it waited."""
        waited = False
        while self.releasing and base + self._releasing_bytes() > self.schedule.budget_bytes:
            start = time.perf_counter()
            self.releasing.pop(0)[0].synchronize()
            self.room_waits += 1
            self.room_wait_s += time.perf_counter() - start
            waited = True
        return waited

    def _amount(self, nbytes: int | None, group: GroupKey) -> int | None:
        """The bytes to move of a group: the schedule's, scaled if the real group differs from the profile's."""
        if nbytes is None:
            return None
        sb, i = group
        planned = movable_bytes(stage_memory(self.passes[sb], i, self.schedule.algorithm_of(i)), self.kinds.get(group, "F"))
        actual = self.store.group_bytes(group)
        if planned <= 0 or actual == planned:
            return nbytes
        return int(round(nbytes * actual / planned))

    def _prefetch(self, j: int, force: bool = False) -> bool:
        """Bring a group's moved bytes back, or (False) leave it waiting for memory: when it would
        not fit the budget (``_room``) unless ``force``, and on CUDA when the allocator refuses it."""
        tr = self.schedule.transfers[j]
        group = (tr.sub_batch, tr.stage)
        blocks = [b for b in self.store.blocks(group) if b.moved]
        if not blocks:
            return True
        if not (force or self._room(group, j)):
            return False
        try:
            self.handles[j] = self.copies.prefetch(blocks, f"prefetch {tr.stage}" + (f"/{tr.sub_batch}" if tr.sub_batch else ""))
        except torch.OutOfMemoryError:
            return False  # waits for memory (vDNN++'s blocking allocation)
        return True

    def _force_prefetch(self, j: int) -> None:
        """Prefetch ``j`` now, whatever the budget says (on the CPU over the budget if it must, where the
        peak says so and ``emulate_budget`` refuses it; on CUDA after a device synchronisation, or out of
        memory)."""
        if not self._prefetch(j, force=True):
            self.copies.synchronize()  # every offload done: all the memory they free is free
            gc.collect()
            if not self._prefetch(j, force=True):
                tr = self.schedule.transfers[j]
                raise torch.OutOfMemoryError(
                    f"the prefetch of stage {tr.stage} (sub-batch {tr.sub_batch}) does not fit in the budget before its backward")

    def _room(self, group: GroupKey, j: int | None = None) -> bool:
        """The simulator's rule for a prefetch (``harness.simulate.reference``): it starts when the
        memory in use as the operation about to run starts (``_in_use``: its allocation counts, the
        compute stream is served first), the offloads still copying and its own moved bytes fit the
        schedule's budget. Where only those offloads keep it out, the host waits for the oldest of
        them (``_wait_for_offloads``), unless the simulator starts it past the middle of that
        operation (``_after_next_op``): then it is left for the next try.

        The budget is the chain's (``Schedule.budget_bytes``), on CUDA too, where the allocator's cap
        is the device budget above it (the runtime's bytes and the allocator's fragmentation):
        a prefetch let in whenever the allocator accepted it took that margin, and the backward
        after it ran out of memory (11 of the 13 oom rows of the 2026-11-29 H200 run:
        ``benchmarks/gpu/oom_replay.py``). On the CPU, where nothing runs out,
        every prefetch issued at the start of the backward ran at once without this."""
        need = sum(b.moved for b in self.store.blocks(group))
        base = self._in_use(self.next_op) + need
        if base > self.schedule.budget_bytes:
            return False
        if j is not None and self._after_next_op(j) and base + self._releasing_bytes() > self.schedule.budget_bytes:
            return False  # tried again once the operation is issued: the host waits for nothing before it
        self._wait_for_offloads(base)
        return self._may_fit(need)

    def _after_next_op(self, j: int) -> bool:
        """Whether the simulator starts transfer ``j`` past the middle of the operation about to run.
        Such a prefetch, kept out only by offloads still copying, is left for later: a host wait for
        those offloads before the operation would hold it back (by up to the time from its start to
        the prefetch's), and after it the prefetch's copy follows it (by up to the time from the
        prefetch's start to its end, ``CudaCopies.prefetch``), so the wait goes where it costs less."""
        if self.planned is None or self.next_op >= len(self.schedule.ops):
            return False
        k = self.next_op
        return float(self.planned.tr_start[j]) > (float(self.planned.op_start[k]) + float(self.planned.op_end[k])) / 2

    def _in_use(self, k: int) -> int:
        """The simulator's memory as operation ``k`` starts (none past the last operation), offloads in
        flight aside: with every saved tensor on the device, less the bytes the store has on the host
        now. What the chain model holds beyond the saved data counts too (the gradients between
        backwards, the output and its gradient, the inputs a backward reads after its stage's): with
        the saved bytes alone, the prefetches of a backward started before the simulator's, and took
        memory it did not have. Without a lowering, the weights and the saved bytes held."""
        if self.resident is None or k >= len(self.resident):
            return self.weights + sum(self.store.device_bytes().values())
        return int(self.resident[k]) - self.store.host_bytes()

    def _may_fit(self, need: int) -> bool:
        """On CUDA under a cap, False when the bytes allocated now plus ``need`` are above it (a
        necessary condition). Asked anyway, the caching allocator would free every cached block
        and synchronise the device before refusing (its release_cached_blocks): time the
        simulator does not see."""
        if not self.cuda or self.limit_bytes is None:
            return True
        return torch.cuda.memory_allocated(self.chain.device) + need <= self.limit_bytes

    def _resident(self, group: GroupKey) -> None:
        """Before B of ``group`` (R, for a moved checkpoint): its data back (its prefetches, and those
        before them on their engine, forced if they waited), then wait for it."""
        for j in self.prefetches_of.get(group, ()):
            self._submit_through(j)  # nothing to do where it has started
        waited: set[int] = set()
        for block in self.store.blocks(group):
            if block.ready is not None and id(block.ready) not in waited:
                waited.add(id(block.ready))
                self.copies.wait(block.ready)

    # -- accounting
    def _counts_held(self, record: bool) -> bool:
        """Whether the bytes held are counted after each operation: on CUDA the allocator's
        statistics measure memory, unless an iteration is recorded or the budget emulated."""
        return not self.cuda or record or self.ex.emulate_budget

    def _account(self, record: bool) -> None:
        if not self._counts_held(record):
            return
        held = self.store.device_bytes()
        total = sum(held.values())
        self.held_max = max(self.held_max, total)
        if record:
            self.record.held.append(held)
        if not self.cuda:
            resident = self.chain.weight_bytes() + total
            self.resident_max = max(self.resident_max, resident)
            if self.ex.emulate_budget and resident > self.schedule.budget_bytes:
                raise BudgetExceeded(
                    f"emulated out of memory: {resident} bytes held (weights and saved data) after "
                    f"{f'operation {len(self.record.held)}' if record else 'an operation'}, above the budget of "
                    f"{self.schedule.budget_bytes}")

    def _timeline(self) -> None:
        self.record.timeline = tuple(
            TimelineEvent(label, stream, self.clock.seconds(a), self.clock.seconds(b))
            for label, stream, a, b in self.clock.spans
        )

    # -- results
    def _report(self, times: list[float], moved: int, stall: float, prediction: Run | None) -> Run:
        median = statistics.median(times) if times else float("nan")
        metrics: dict[str, float] = {
            "time_median_s": median,
            "time_min_s": min(times) if times else float("nan"),
            "time_max_s": max(times) if times else float("nan"),
            "time_iqr_s": _iqr(times),
            "iterations": len(times),
            "warmup": int(self.ex.warmup),
            "stall_s": stall,
            "moved_bytes": int(moved),
            "host_pool_bytes": int(self.pool.allocated_bytes),
            "algorithms_applied": len(self.record.algorithms),
        }
        if self._counts_held(self.ex.record):
            metrics["held_max_bytes"] = int(self.held_max)
        if self.cuda:
            metrics["max_memory_allocated"] = int(torch.cuda.max_memory_allocated(self.chain.device))
            metrics["max_memory_reserved"] = int(torch.cuda.max_memory_reserved(self.chain.device))
            if self.cap is not None:
                metrics["memory_fraction"] = self.cap
            # the host's waits for offloads to free their memory (before an operation or a prefetch),
            # over the timed iterations
            metrics["room_waits"] = int(self.room_waits)
            metrics["room_wait_s"] = self.room_wait_s
            peak = int(metrics["max_memory_allocated"])
        else:
            peak = self.resident_max
        compute = sum(p.compute_time for p in self.passes)
        if prediction is not None:
            compute = prediction.compute_time
            metrics["predicted_peak_bytes"] = int(prediction.peak_bytes)
            if self.cuda:  # what the device held beyond the chain model (workspaces, handles' buffers)
                metrics["unmodelled_bytes"] = metrics["max_memory_allocated"] - int(prediction.peak_bytes)
            if prediction.feasible:
                metrics["predicted_s"] = prediction.makespan
                metrics["prediction_error"] = median / prediction.makespan - 1 if prediction.makespan > 0 else math.nan
        return Run(
            executor="torch", planner=self.schedule.planner, status="ok", message="",
            makespan=median, compute_time=compute, peak_bytes=int(peak), moved_bytes=moved,
            timeline=self.record.timeline, metrics=metrics,
        )

    def _oom(self, exc: BaseException, prediction: Run | None) -> Run:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        metrics: dict[str, float] = {}
        peak = self.resident_max
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.chain.device)
            metrics["max_memory_reserved"] = int(torch.cuda.max_memory_reserved(self.chain.device))
        if prediction is not None and prediction.feasible:
            metrics["predicted_s"] = prediction.makespan
        return Run(
            executor="torch", planner=self.schedule.planner, status="oom",
            message=self._oom_message(text),
            makespan=float("nan"), compute_time=self.profile.compute_time, peak_bytes=int(peak),
            moved_bytes=int(self.copies.moved_bytes), metrics=metrics,
        )

    def _oom_message(self, text: str) -> str:
        """An ``oom`` row's message: the budget (and cap) it ran under, then what ran out."""
        cap = f" (memory cap {self.cap:.4f} of the device)" if self.cap is not None else ""
        return f"out of memory under the budget of {self.schedule.budget_bytes} bytes{cap}: {text}"

    def close(self) -> None:
        """Release the store, the host buffers and (on CUDA) the cached memory (every copy is over: an
        iteration ends with them, or, when it fails, waits for them before it drops its blocks)."""
        self.store.clear()
        self.pool.clear()
        self.handles = {}
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.chain.device)
            torch.cuda.empty_cache()


# what cuDNN and cuBLAS raise (a plain RuntimeError) when they cannot allocate their workspace: under the
# budget's cap that is the budget running out (an oom row), not a fault of the schedule
_LIBRARY_OUT_OF_MEMORY = ("CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED")
# cuDNN's frontend also says this when no engine's workspace fits, but as well for a configuration no
# engine supports: read as the budget only under a cap
_NO_ENGINE = "unable to find an engine to execute this computation"


def ran_out_of_memory(exc: BaseException, capped: bool = False) -> bool:
    """True for torch's ``OutOfMemoryError`` and for a ``RuntimeError`` of cuDNN or cuBLAS that says it
    could not allocate (``capped``: also cuDNN finding no engine, which under the budget's cap is mostly
    a workspace that does not fit)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (any(t in text for t in _LIBRARY_OUT_OF_MEMORY)
                                              or (capped and _NO_ENGINE in text))


def _iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]
