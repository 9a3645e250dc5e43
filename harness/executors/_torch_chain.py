"""A model as a chain the torch executor can run one stage at a time.

The chain is the one the profilers measure (``harness.chain``): the model traced into a
graph and cut where one tensor is live (papers/004 section 6.1). ``ChainPass`` runs the
forward of each stage (F_i, or Fc_i and Fn_i, which do not save), its recomputation R_i
and its backward B_i as separate calls, the way
``harness.profilers.instrument`` does, with two differences that let an executor move
a stage's data away:

- a stage receives its input through ``StageEntry`` (``harness.chain.entry``), an identity
  autograd function whose backward hands over the input's gradient; unlike a detached leaf,
  the autograd graph then holds no reference to the input tensor, and y_i is not copied;
- the backward of a stage starts from a ``GradientEdge`` of its output, so the
  executor keeps no reference to the output either.

Only the saved tensors (``SavedStore``) and the next stage's input keep activations
alive, exactly the data the chain model counts.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch

from harness.chain.entry import StageEntry
from harness.chain.extract import concrete
from harness.chain.graph import Graph, tensors_in, trace
from harness.chain.stages import StagePlan, plan_stages
from harness.protocols import Workload


@dataclass
class TorchChain:
    """A model on its device, its chain cut, and an input batch kept on the host."""

    workload: Workload
    model: torch.nn.Module
    graph: Graph
    plan: StagePlan
    example: torch.Tensor  # the full batch, on the host (pinned on CUDA)
    device: torch.device
    _buffers: dict[int, list[torch.Tensor]] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def n_stages(self) -> int:
        """Number of stages of the cut."""
        return len(self.plan.stages)

    def weight_keys(self) -> set[int]:
        """Storage ids of every parameter and buffer (weights are never offloaded)."""
        keys = {t.untyped_storage()._cdata for t in self.graph.gm.parameters()}
        keys |= {t.untyped_storage()._cdata for t in self.graph.gm.buffers()}
        for value in self.graph.constants.values():
            if isinstance(value, torch.Tensor):
                keys.add(value.untyped_storage()._cdata)
        return keys

    def stage_buffers(self, stage: int) -> list[torch.Tensor]:
        """The buffers the nodes of ``stage`` read (a batch norm's running statistics and counter): what a
        recomputation of the stage must leave as its forward left them."""
        if stage not in self._buffers:
            span, graph = self.plan.stages[stage], self.graph
            found: dict[int, torch.Tensor] = {}
            for i in range(span.first, span.last + 1):
                node = graph.nodes[i]
                if node.op == "call_module":  # a module traced whole (fx): its own buffers
                    found.update((id(b), b) for b in graph.gm.get_submodule(str(node.target)).buffers())
                for j in graph.info[i].inputs:  # buffers read as attributes (torch.export's graphs)
                    value = graph.constants.get(j)
                    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                        found[id(value)] = value
            self._buffers[stage] = list(found.values())
        return self._buffers[stage]

    def weight_bytes(self) -> int:
        """Bytes of parameters, their gradients (those that exist now) and buffers."""
        params = list(self.graph.gm.parameters())
        total = sum(p.untyped_storage().nbytes() for p in params)
        total += sum(p.grad.untyped_storage().nbytes() for p in params if p.grad is not None)
        return total + sum(b.untyped_storage().nbytes() for b in self.graph.gm.buffers())

    def trained_weight_bytes(self) -> int:
        """Bytes of parameters, a gradient for each one that trains, and buffers: the weights as the chain
        model counts them (``Profile.weight_bytes``), whether or not this iteration's gradients exist yet."""
        params = sum(p.untyped_storage().nbytes() * (2 if p.requires_grad else 1) for p in self.graph.gm.parameters())
        return params + sum(b.untyped_storage().nbytes() for b in self.graph.gm.buffers())


def build_chain(workload: Workload, device: torch.device | str) -> TorchChain:
    """Build the workload's model on ``device`` and cut it as the profilers do."""
    from harness.errors import ProfilingError
    from harness.chain.extract import build_model, extract

    device = concrete(device)
    model, example = build_model(workload, device)
    graph = Graph(trace(model, example, label=workload.model))
    plan = extract(workload, "meta").plan
    try:
        plan.check(graph)
    except ProfilingError:
        plan = plan_stages(graph, example)
    host = example.detach().to("cpu")
    if device.type == "cuda":
        host = host.pin_memory()
    return TorchChain(workload, model, graph, plan, host, device)


def output_gradient(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """The gradient that enters the backward pass: fixed pseudo-random values on the host.

    The loss is the dot product of the model output with this tensor, so any batch of
    gradients is reproducible (tests build the reference with the same call).
    """
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=dtype, generator=generator)


@dataclass
class _SubBatch:
    """The state of one sub-batch between its operations."""

    env: dict[int, Any]
    next_input: torch.Tensor | None = None
    boxes: dict[int, dict] = field(default_factory=dict)
    edges: dict[int, Any] = field(default_factory=dict)
    output: tuple[tuple[int, ...], torch.dtype] | None = None  # the model output's shape and dtype
    kinds: dict[int, str] = field(default_factory=dict)  # the forward kind of each stage run so far
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)  # x_i kept for R_i (a checkpoint or R_{i-1}'s)
    carried: dict[int, dict[int, Any]] = field(default_factory=dict)  # side values live before stage i
    rng: dict[int, Any] = field(default_factory=dict)  # the random state a recomputation restores


class ChainPass:
    """One training iteration of a chain, operation by operation, in any valid order.

    ``grads(sub_batch, shape, dtype)`` gives the gradient of the model output (of that shape and
    dtype: a model fed token ids has an integer input and a floating-point output);
    ``packing(sub_batch, stage)`` is the saved-tensor context for a forward that saves and
    for a recomputation (the executor's store); ``on_forward_end(sub_batch, stage, output)``
    is called when such an operation is over (``output`` None when no later stage saves
    it); ``algorithm(stage)`` gives the context that selects the stage's algorithm;
    ``on_constant(tensor)`` receives every tensor a constant of the workload holds when a
    stage computes it (``Graph.is_workload_constant``: the store passes them through, and they
    stay on the device until their last reader is done).

    The operations are ``harness.model.Op``'s: ``forward`` runs F (saving), Fc (keeping
    only its input, a checkpoint) or Fn (saving nothing: under ``torch.no_grad``);
    ``recompute`` runs R, the stage again from its kept input with the random state of
    its first run (as ``torch.utils.checkpoint`` does), saving for its backward, and leaves
    the stage's buffers as its first run left them (a batch norm's running statistics are
    updated once per forward, as in the plain model; ``torch.utils.checkpoint`` updates them twice).
    """

    def __init__(
        self,
        chain: TorchChain,
        inputs: list[torch.Tensor],
        grads: Callable[[int, tuple[int, ...], torch.dtype], torch.Tensor],
        packing: Callable[[int, int], ContextManager],
        on_forward_end: Callable[[int, int, torch.Tensor | None], None],
        algorithm: Callable[[int], ContextManager] = lambda stage: nullcontext(),
        on_constant: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        self.chain, self.inputs, self.grads = chain, inputs, grads
        self.packing, self.on_forward_end, self.algorithm = packing, on_forward_end, algorithm
        self.token = torch.zeros((), device=chain.device, requires_grad=True)
        self.state: dict[int, _SubBatch] = {}
        computed = chain.graph.computed_constants
        self._on_node = None  # no per-node call where the model computes no constant (every CNN)
        if on_constant is not None and computed:
            def on_node(i: int, value: Any, env: dict[int, Any]) -> None:
                if i in computed:
                    for t in tensors_in(value):
                        on_constant(t)
            self._on_node = on_node

    def _sub(self, sb: int) -> _SubBatch:
        if sb not in self.state:
            graph = self.chain.graph
            x = self.inputs[sb].to(self.chain.device, non_blocking=True)
            if x.device == self.inputs[sb].device:
                x = x.clone()  # a storage of its own, which the schedule may offload
            self.state[sb] = _SubBatch(env={graph.input_index: x})
        return self.state[sb]

    def forward(self, stage: int, sb: int, kind: str = "F") -> None:
        """Run the forward of ``stage`` for sub-batch ``sb``: ``F`` saves, ``Fc`` keeps its input, ``Fn`` nothing."""
        st = self._sub(sb)
        st.kinds[stage] = kind
        if kind != "F":
            self._forward_without_saving(stage, st, keep_input=kind == "Fc")
            return
        first = self.chain.plan.stages[stage]
        if stage > 0:
            st.env[first.input] = self._entry(st, stage, st.next_input)
        st.next_input = None
        with self.algorithm(stage), self.packing(sb, stage):
            self.chain.graph.run(first.first, first.last, st.env, on_node=self._on_node)
        out = st.env.pop(first.output)
        self._produced(stage, sb, st, out, forward_pass=True)

    def _forward_without_saving(self, stage: int, st: _SubBatch, keep_input: bool) -> None:
        """Fc or Fn: the stage under ``torch.no_grad``, reading its input and the side values.

        Side values are what crosses a cut besides the one activation: plain Python values
        and tensors that do not depend on the input (GPT-2's attention mask). The stage gets
        them as they are now, and so does its recomputation (``carried``); those it makes for
        later stages join the sub-batch's values, those it used last leave them.
        """
        spans = self.chain.plan.stages
        first = spans[stage]
        x = st.env.pop(first.input) if stage == 0 else st.next_input
        st.next_input = None
        st.carried[stage] = dict(st.env)
        st.rng[stage] = self._rng_state()
        if keep_input:
            st.inputs[stage] = x
        env = dict(st.env)
        env[first.input] = x
        with torch.no_grad(), self.algorithm(stage):
            self.chain.graph.run(first.first, first.last, env, on_node=self._on_node)
        out = env.pop(first.output)
        for k in [k for k in st.env if k not in env]:  # their last use was in this stage
            del st.env[k]
        st.env.update(env)
        if stage == len(spans) - 1:
            st.output = (tuple(out.shape), out.dtype)
        else:
            st.next_input = out

    def recompute(self, stage: int, sb: int) -> None:
        """Run R_stage of sub-batch ``sb``: the stage again, saving, from the input it kept."""
        st = self._sub(sb)
        first = self.chain.plan.stages[stage]
        env = dict(st.carried.pop(stage))
        env[first.input] = self._entry(st, stage, st.inputs.pop(stage))
        devices = [self.chain.device] if self.chain.device.type == "cuda" else []
        buffers = self.chain.stage_buffers(stage)
        as_left = [b.detach().clone() for b in buffers]  # a few per stage: a batch norm has three
        with torch.random.fork_rng(devices=devices):
            self._set_rng_state(st.rng.pop(stage))
            with self.algorithm(stage), self.packing(sb, stage):
                self.chain.graph.run(first.first, first.last, env, on_node=self._on_node)
        if buffers:  # the forward already updated the running statistics: once, as the plain model
            with torch.no_grad():  # .data: no version bump for autograd's saved copies to trip on
                torch._foreach_copy_([b.data for b in buffers], as_left)
        out = env.pop(first.output)
        self._produced(stage, sb, st, out, forward_pass=False)

    def _entry(self, st: _SubBatch, stage: int, x: torch.Tensor) -> torch.Tensor:
        """x_stage as F and R feed it to the stage: through ``StageEntry``, whose box receives y_stage for
        B_{stage-1}; x_0 as it is, so that B_0 computes no gradient of the model input (the profile's y_0 is
        none)."""
        if stage == 0:
            return x
        box: dict = {}
        st.boxes[stage] = box
        return StageEntry.apply(self.token, x, box)

    def kept_input(self, stage: int, sb: int) -> torch.Tensor | None:
        """The input x_stage that Fc_stage keeps for R_stage (its checkpoint), None when there is none."""
        return self._sub(sb).inputs.get(stage)

    def _produced(self, stage: int, sb: int, st: _SubBatch, out: Any, forward_pass: bool) -> None:
        """After F or R: keep the output's gradient edge for B_stage and hand the output on."""
        spans = self.chain.plan.stages
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"stage {spans[stage].name} produced {type(out).__name__}, not a tensor")
        if out.requires_grad:
            st.edges[stage] = torch.autograd.graph.get_gradient_edge(out)
        final = stage == len(spans) - 1
        # the output goes on to the next stage's forward, or to its recomputation (after an Fn)
        feeds = not final and (forward_pass or st.kinds.get(stage + 1) == "Fn")
        self.on_forward_end(sb, stage, out if feeds else None)
        if final:
            st.output = (tuple(out.shape), out.dtype)
        elif forward_pass:
            st.next_input = out.detach()
        elif feeds:
            st.inputs[stage + 1] = out.detach()

    def _rng_state(self) -> Any:
        cpu = torch.get_rng_state()
        return (cpu, torch.cuda.get_rng_state(self.chain.device)) if self.chain.device.type == "cuda" else (cpu, None)

    def _set_rng_state(self, state: Any) -> None:
        cpu, cuda = state
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, self.chain.device)

    def backward(self, stage: int, sb: int) -> None:
        """Run B_stage of sub-batch ``sb``: from its output's gradient to its input's."""
        st = self._sub(sb)
        edge = st.edges.pop(stage, None)
        if edge is not None:
            if stage == self.chain.n_stages - 1:
                grad = self.grads(sb, *st.output)
            else:
                grad = st.boxes.pop(stage + 1, {}).get("grad")
            if grad is not None:
                with self.algorithm(stage):
                    torch.autograd.backward(edge, grad_tensors=grad.to(self.chain.device, non_blocking=True))
        else:
            st.boxes.pop(stage + 1, None)
        if stage == 0:
            self.state.pop(sb, None)  # the sub-batch is over

    def close(self) -> None:
        """Drop every activation, gradient and graph still held."""
        self.state.clear()
