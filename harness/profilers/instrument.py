"""One instrumented training iteration, stage by stage: the sizes of a chain and its op counts.

Both profilers call ``record_chain``: the analytic one on the ``meta`` device (shapes
only, nothing allocated), the measured one on a real device. Because the same code
computes the sizes in both cases, the two agree exactly wherever the device runs the
same autograd formulas (the CPU does; CUDA may save different tensors, e.g. cuDNN's
batch-norm reserve).

How each figure is obtained (papers/004 section 3.1 notation):

- ``input_bytes`` |x_i|: the bytes of the memory block holding the stage input (a view
  counts its whole base: that is what stays allocated);
- ``saved_bytes``: every tensor autograd saves for the backward of the stage, seen
  through ``torch.autograd.graph.saved_tensors_hooks`` and deduplicated by storage,
  parameters and buffers excluded (they are weights);
- ``grad_bytes`` |y_i|: the gradient autograd computes for the stage input, as the block it
  lies in (a slice of a larger gradient keeps all of it allocated; 0 for the first stage:
  the data needs no gradient);
- ``fwd_workspace`` ex^F: the most bytes that F_i's operators hold at once beyond what
  the chain model counts elsewhere (the stage output, the saved data, the workload's
  constants); ``bwd_workspace`` ex^B: the same for B_i, beyond the gradients the chain model
  holds (y_{i+1}, y_i, the weights' gradients). Both are what the operators allocate, seen
  by ``harness.profilers.allocations`` (temporaries inside one operation included), on the
  device of the run: on ``meta`` that is autograd's allocations by size, which every device
  makes; the measured profiler replaces them with peak-memory deltas on CUDA, where kernels
  allocate workspaces of their own;
- tensors that depend neither on the input nor on a trainable parameter (a causal mask
  shared by every layer) are constants of the workload: when autograd saves them they
  count once, with the weights (``constant_bytes``), never in a stage, and the executor
  leaves them on the device. A tensor computed from a trainable parameter alone (Swin-V2's
  continuous position bias, an MLP of fixed coordinates, or a frozen layer's output that a
  parameter is added to in place) is not one: every forward makes it anew inside one stage
  (no cut passes it on, ``harness.chain.stages``), and what autograd saves of it is that
  stage's saved data, which the executor offloads or drops with the rest.

ATTRIBUTION RULE (no storage is counted in two stages): a boundary tensor x_{i+1} that
stage i saves for its own backward (a trailing ReLU keeps its output) is counted in
stage i+1's ``saved_bytes``, not in stage i's, together with whatever stage i+1 itself
saves of it; stage i's ``output_saved_bytes`` says how much of it B_i needs, and the
simulator holds that much from the end of B_{i+1} until B_i ends (in PyTorch the storage
lives until both backward steps are done). Only the last stage keeps a saved output of
its own (there is no stage after it).

Stages run in isolation: each receives a detached copy of its input through
``StageEntry`` (as in the torch executor), which takes the input's gradient as the previous
stage would, so its backward stops at its own input and its op counts, saved tensors,
gradient and workspaces belong to it alone.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from harness.chain.metafast import meta_modes
from harness.errors import ProfilingError
from harness.chain.entry import StageEntry
from harness.chain.graph import Graph, tensors_in
from harness.chain.stages import StagePlan, StageSpan, dense_bytes, storage_bytes, storage_key
from harness.profilers.allocations import Allocations

_aten = torch.ops.aten
_CONV = {_aten.convolution, _aten.convolution_backward, _aten._convolution}
_FREE = {_aten.empty, _aten.empty_like, _aten.empty_strided, _aten.detach, _aten.lift_fresh,
         _aten.alias, _aten._to_copy, _aten._unsafe_view, _aten._assert_tensor_metadata}


@dataclass
class OpStats:
    """Per aten operation of one forward or backward: FLOPs, bytes touched, whether a convolution."""

    flops: list[float] = field(default_factory=list)
    nbytes: list[float] = field(default_factory=list)
    conv: list[bool] = field(default_factory=list)

    @property
    def total_flops(self) -> float:
        """FLOPs of all operations (a multiply-add counts 2, as ``torch.utils.flop_counter``)."""
        return float(sum(self.flops))

    @property
    def n_ops(self) -> int:
        """Number of operations that do work (views and allocations excluded): kernel launches."""
        return len(self.flops)


class OpCounter(TorchDispatchMode):
    """Counts, for every aten operation run under it, its FLOPs and the bytes it reads and writes.

    FLOPs come from ``torch.utils.flop_counter.flop_registry`` (0 for operations it does not
    know, elementwise ones mostly); bytes are the sizes of the tensor arguments and results.
    Views, allocations and operations that launch no kernel (``_unsafe_view``, ``_assert_tensor_metadata``)
    are skipped. ``im2col_bytes`` records the largest per-sample
    im2col matrix a convolution would need (for the modelled algorithm alternatives).
    """

    def __init__(self) -> None:
        super().__init__()
        self.stats = OpStats()
        self.im2col_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view or func._overloadpacket in _FREE:
            return out
        packet = func._overloadpacket
        counter = flop_registry.get(packet)
        flops = float(counter(*args, **kwargs, out_val=out)) if counter is not None else 0.0
        moved = sum(t.numel() * t.element_size() for t in tensors_in((args, kwargs, out)))
        self.stats.flops.append(flops)
        self.stats.nbytes.append(float(moved))
        is_conv = packet in _CONV
        self.stats.conv.append(is_conv)
        if packet is _aten.convolution and isinstance(out, torch.Tensor):
            self.im2col_bytes = max(self.im2col_bytes, _im2col_bytes(args, out))
        return out


def _im2col_bytes(args: tuple, out: torch.Tensor) -> int:
    """Bytes of one sample's im2col matrix (C_in*kh*kw x H_out*W_out); 0 for a plain 1x1 conv."""
    weight, stride, padding, groups = args[1], args[3], args[4], args[8]
    kernel = tuple(weight.shape[2:])
    if all(k == 1 for k in kernel) and all(s == 1 for s in stride) and not any(padding):
        return 0
    rows = weight.shape[1] * groups * int(torch.Size(kernel).numel())
    cols = int(torch.Size(out.shape[2:]).numel())
    return rows * cols * out.element_size()


@dataclass
class StageRecord:
    """What one stage holds and does in one iteration (see the module docstring)."""

    span: StageSpan
    input_bytes: int
    saved_bytes: int
    grad_bytes: int
    fwd_workspace: int
    bwd_workspace: int
    im2col_bytes: int
    fwd: OpStats
    bwd: OpStats
    output_saved_bytes: int = 0


@dataclass
class ChainRecord:
    """A whole instrumented iteration: stages, output and weight bytes."""

    stages: list[StageRecord]
    output_bytes: int
    param_bytes: int
    grad_param_bytes: int
    buffer_bytes: int
    constant_bytes: int = 0

    @property
    def weight_bytes(self) -> int:
        """Resident for the whole iteration: parameters, their gradients, buffers, saved constants."""
        return self.param_bytes + self.grad_param_bytes + self.buffer_bytes + self.constant_bytes


def _weights(graph: Graph) -> tuple[set[int], int, int, int]:
    """Storage ids of all weights; parameter, parameter-gradient and buffer bytes."""
    keys: set[int] = set()
    params: dict[int, tuple[int, bool]] = {}
    buffers: dict[int, int] = {}
    for p in graph.gm.parameters():
        params[storage_key(p)] = (storage_bytes(p), p.requires_grad)
    for b in graph.gm.buffers():
        buffers[storage_key(b)] = storage_bytes(b)
    for c in graph.constants.values():
        for t in tensors_in(c):
            k = storage_key(t)
            if k not in params:
                if isinstance(t, torch.nn.Parameter):
                    params[k] = (storage_bytes(t), t.requires_grad)
                else:
                    buffers.setdefault(k, storage_bytes(t))
    keys.update(params, buffers)
    param_bytes = sum(b for b, _ in params.values())
    grad_bytes = sum(b for b, g in params.values() if g)
    buffer_bytes = sum(b for k, b in buffers.items() if k not in params)
    return keys, param_bytes, grad_bytes, buffer_bytes


def record_chain(graph: Graph, plan: StagePlan, example: torch.Tensor, count_ops: bool = True) -> ChainRecord:
    """Run one training iteration of ``graph`` stage by stage and measure every stage.

    ``example`` is the model input (on ``meta`` for the analytic profiler). With
    ``count_ops`` each forward and backward runs under an ``OpCounter``.
    """
    with meta_modes(example.device.type == "meta"):
        return _record(graph, plan, example, count_ops)


def _record(graph: Graph, plan: StagePlan, example: torch.Tensor, count_ops: bool) -> ChainRecord:
    iteration = _Iteration(graph, plan, count_ops)
    x = example
    for s in range(len(plan.stages)):
        x = iteration.forward(s, x)
    iteration.attribute()
    iteration.backward()
    return iteration.result()


class _Iteration:
    """The state of one instrumented iteration: forwards in order, then backwards in reverse."""

    def __init__(self, graph: Graph, plan: StagePlan, count_ops: bool) -> None:
        self.graph, self.plan, self.count_ops = graph, plan, count_ops
        self.weight_keys, self.param_bytes, self.grad_param_bytes, self.buffer_bytes = _weights(graph)
        n = len(plan.stages)
        self.env: dict[int, Any] = {}
        self.boxes: list[dict] = []  # per stage: its input's gradient y_i, once B_i ran (StageEntry)
        self.token: torch.Tensor | None = None
        self.outs: list[torch.Tensor | None] = []
        self.saved: list[dict[int, int]] = [{} for _ in range(n)]
        self.output_saved: list[int] = [0] * n
        self.in_keys: list[int] = []
        self.out_keys: list[int] = []
        self.input_bytes: list[int] = []
        self.grad_bytes = [0] * n
        self.fwd_stats: list[OpStats] = []
        self.bwd_stats = [OpStats() for _ in range(n)]
        self.im2col: list[int] = []
        self.fwd_ws: list[int] = []
        self.bwd_ws = [0] * n
        self.constants: dict[int, int] = {}  # storages of tensors made from neither the input nor a parameter
        self.constant_saved: dict[int, int] = {}
        self.output_bytes = 0
        self._held: list[Any] = []  # keeps those storages alive, so that their ids stay unique

    def _counter(self) -> OpCounter | None:
        return OpCounter() if self.count_ops else None

    def forward(self, s: int, x: torch.Tensor) -> torch.Tensor:
        """F_s on a detached copy of its input ``x``; returns its output (with its graph)."""
        graph, span, record = self.graph, self.plan.stages[s], self.saved[s]
        leaf, box = x.detach(), {}
        self.env[span.input] = leaf
        if s > 0 and x.requires_grad and x.is_floating_point():
            if self.token is None:
                self.token = torch.zeros((), device=x.device, requires_grad=True)
            self.env[span.input] = StageEntry.apply(self.token, leaf, box)
        self.boxes.append(box)
        self.in_keys.append(storage_key(leaf))
        self.input_bytes.append(storage_bytes(leaf))

        def pack(t: torch.Tensor) -> torch.Tensor:
            k = storage_key(t)
            if k not in self.weight_keys:
                record[k] = storage_bytes(t)
            return t

        def on_node(i: int, value: Any, env: dict[int, Any]) -> None:
            if graph.is_workload_constant(i):
                self._held.append(value)
                self.constants.update((storage_key(t), storage_bytes(t)) for t in tensors_in(value))

        counter, allocations = self._counter(), Allocations()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), counter or nullcontext(), allocations:
            graph.run(span.first, span.last, self.env, on_node=on_node)
        out = self.env[span.output]
        if not isinstance(out, torch.Tensor):
            raise ProfilingError(f"stage {span.name} produced {type(out).__name__}, not a tensor")
        self.outs.append(out)
        self.out_keys.append(storage_key(out))
        self.output_bytes = storage_bytes(out)  # the last stage's is the model's
        counted = {**record, **self.constants, self.out_keys[s]: self.output_bytes}  # the chain model's
        self.fwd_ws.append(allocations.peak(counted))
        self.fwd_stats.append(counter.stats if counter is not None else OpStats())
        self.im2col.append(counter.im2col_bytes if counter is not None else 0)
        return out

    def attribute(self) -> None:
        """Constants go to the weights; a stage's saved output goes to the next stage (ATTRIBUTION RULE)."""
        for record in self.saved:
            for k in [k for k in record if k in self.constants]:
                self.constant_saved[k] = record.pop(k)
        self.output_saved = [0] * len(self.saved)
        for s in range(len(self.saved) - 1):
            k = self.out_keys[s]
            if k in self.saved[s]:
                self.output_saved[s] = self.saved[s][k]  # B_s still needs it: held until B_s ends
                self.saved[s + 1][k] = self.saved[s].pop(k)

    def backward(self) -> None:
        """B_{L-1} .. B_0, each from the gradient the next one produced for its input."""
        self.env.clear()
        last = self.outs[-1]
        grad = torch.empty_like(last) if last.device.type == "meta" else torch.ones_like(last)
        params = list(self.graph.gm.parameters())
        for s in reversed(range(len(self.outs))):
            out, allocations = self.outs[s], None
            if out is not None and out.requires_grad and grad is not None:
                counter, allocations = self._counter(), Allocations()
                with counter or nullcontext(), allocations:
                    torch.autograd.backward(out, grad)
                if counter is not None:
                    self.bwd_stats[s] = counter.stats
            grad = self.boxes[s].pop("grad", None)
            # y_i keeps the buffer it lies in alive until B_{i-1} has used it: a slice of a larger gradient
            # (cat's backward hands each input a slice) holds all of it, which B_{i-1} must count too
            self.grad_bytes[s] = max(dense_bytes(grad), storage_bytes(grad)) if grad is not None else 0
            if allocations is not None:
                # the weights count their gradients; the chain model holds y_i for all of B_i
                weights = {storage_key(p.grad): storage_bytes(p.grad) for p in params if p.grad is not None}
                self.bwd_ws[s] = max(0, allocations.peak(weights) - self.grad_bytes[s])
            self.outs[s] = None  # frees the stage's graph
        for p in params:
            p.grad = None

    def result(self) -> ChainRecord:
        """The record of every stage and of the whole chain."""
        stages = [
            StageRecord(
                span=span, input_bytes=self.input_bytes[s], saved_bytes=sum(self.saved[s].values()),
                grad_bytes=self.grad_bytes[s], fwd_workspace=self.fwd_ws[s], bwd_workspace=self.bwd_ws[s],
                im2col_bytes=self.im2col[s], fwd=self.fwd_stats[s], bwd=self.bwd_stats[s],
                output_saved_bytes=self.output_saved[s],
            )
            for s, span in enumerate(self.plan.stages)
        ]
        return ChainRecord(stages, self.output_bytes, self.param_bytes, self.grad_param_bytes, self.buffer_bytes,
                           sum(self.constant_saved.values()))
