"""A model as a chain the torch executor can run one stage at a time.

The chain is the profilers' (``harness.profilers.extract``): the model traced into a
graph and cut where one tensor is live (papers/004 section 6.1). ``ChainPass`` runs the
forward F_i and the backward B_i of each stage as separate calls, the way
``harness.profilers.instrument`` does, with two differences that let an executor move
a stage's data away:

- a stage receives its input through ``_Entry``, an identity autograd function whose
  backward hands over the input's gradient; unlike a detached leaf, the autograd graph
  then holds no reference to the input tensor;
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

from harness.executors._torch_store import concrete
from harness.profilers.graph import Graph, trace
from harness.profilers.stages import StagePlan, plan_stages
from harness.protocols import Workload


class _Entry(torch.autograd.Function):
    """Identity on a stage input; its backward stores the input's gradient (y_i) in a box."""

    @staticmethod
    def forward(ctx: Any, token: torch.Tensor, x: torch.Tensor, box: dict) -> torch.Tensor:  # noqa: D102
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:  # noqa: D102
        ctx.box["grad"] = grad
        return None, None, None


@dataclass
class TorchChain:
    """A model on its device, its chain cut, and an input batch kept on the host."""

    workload: Workload
    model: torch.nn.Module
    graph: Graph
    plan: StagePlan
    example: torch.Tensor  # the full batch, on the host (pinned on CUDA)
    device: torch.device

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

    def weight_bytes(self) -> int:
        """Bytes of parameters, their gradients (those that exist now) and buffers."""
        params = list(self.graph.gm.parameters())
        total = sum(p.untyped_storage().nbytes() for p in params)
        total += sum(p.grad.untyped_storage().nbytes() for p in params if p.grad is not None)
        return total + sum(b.untyped_storage().nbytes() for b in self.graph.gm.buffers())


def build_chain(workload: Workload, device: torch.device | str) -> TorchChain:
    """Build the workload's model on ``device`` and cut it as the profilers do."""
    from harness.profilers.errors import ProfilingError
    from harness.profilers.extract import build_model, extract

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
    output_shape: tuple[int, ...] | None = None


class ChainPass:
    """One training iteration of a chain, operation by operation, in any valid order.

    ``grads(sub_batch, output_shape)`` gives the gradient of the model output;
    ``packing(sub_batch, stage)`` is the saved-tensor context for a forward (the
    executor's store); ``on_forward_end(sub_batch, stage, output)`` is called when the
    forward of a stage is over; ``algorithm(stage)`` gives the context that selects the
    stage's algorithm; ``segments`` maps the first stage of each checkpointed segment
    to its end (exclusive), run with ``torch.utils.checkpoint``.
    """

    def __init__(
        self,
        chain: TorchChain,
        inputs: list[torch.Tensor],
        grads: Callable[[int, tuple[int, ...]], torch.Tensor],
        packing: Callable[[int, int], ContextManager],
        on_forward_end: Callable[[int, int, torch.Tensor | None], None],
        algorithm: Callable[[int], ContextManager] = lambda stage: nullcontext(),
        segments: dict[int, int] | None = None,
    ) -> None:
        self.chain, self.inputs, self.grads = chain, inputs, grads
        self.packing, self.on_forward_end, self.algorithm = packing, on_forward_end, algorithm
        self.segments = segments or {}
        self.inside = {i: a for a, b in self.segments.items() for i in range(a, b)}
        self.token = torch.zeros((), device=chain.device, requires_grad=True)
        self.state: dict[int, _SubBatch] = {}

    def _sub(self, sb: int) -> _SubBatch:
        if sb not in self.state:
            graph = self.chain.graph
            x = self.inputs[sb].to(self.chain.device, non_blocking=True)
            if x.device == self.inputs[sb].device:
                x = x.clone()  # a storage of its own, which the schedule may offload
            self.state[sb] = _SubBatch(env={graph.input_index: x})
        return self.state[sb]

    def forward(self, stage: int, sb: int) -> None:
        """Run F_stage of sub-batch ``sb``."""
        st = self._sub(sb)
        start = self.inside.get(stage)
        if start is not None and start != stage:
            return  # ran with its checkpointed segment
        spans = self.chain.plan.stages
        end = self.segments.get(stage, stage + 1)
        first = spans[stage]
        if stage > 0:
            box: dict = {}
            st.boxes[stage] = box
            st.env[first.input] = _Entry.apply(self.token, st.next_input, box)
        st.next_input = None
        if stage in self.segments:
            out = self._checkpointed(stage, end, st)
        else:
            with self.algorithm(stage), self.packing(sb, stage):
                self.chain.graph.run(first.first, first.last, st.env)
            out = st.env.pop(first.output)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"stage {spans[end - 1].name} produced {type(out).__name__}, not a tensor")
        if out.requires_grad:
            st.edges[end - 1] = torch.autograd.graph.get_gradient_edge(out)
        final = end == len(spans)
        self.on_forward_end(sb, end - 1, None if final else out)
        if final:
            st.output_shape = tuple(out.shape)
        else:
            st.next_input = out.detach()

    def _checkpointed(self, a: int, b: int, st: _SubBatch) -> torch.Tensor:
        """Run stages a..b-1 as one ``torch.utils.checkpoint`` segment (recomputed in B_{b-1})."""
        import torch.utils.checkpoint as checkpoint

        spans, graph = self.chain.plan.stages, self.chain.graph
        carried = {k: v for k, v in st.env.items() if not isinstance(v, torch.Tensor)}
        x = st.env.pop(spans[a].input)

        def segment(inp: torch.Tensor) -> torch.Tensor:
            env = dict(carried)
            env[spans[a].input] = inp
            for i in range(a, b):
                with self.algorithm(i):
                    graph.run(spans[i].first, spans[i].last, env)
            for k, v in env.items():
                if not isinstance(v, torch.Tensor):
                    st.env.setdefault(k, v)
            return env[spans[b - 1].output]

        return checkpoint.checkpoint(segment, x, use_reentrant=False, preserve_rng_state=True)

    def backward(self, stage: int, sb: int) -> None:
        """Run B_stage of sub-batch ``sb``: from its output's gradient to its input's."""
        st = self._sub(sb)
        edge = st.edges.pop(stage, None)
        if edge is not None:
            if stage == self.chain.n_stages - 1:
                grad = self.grads(sb, st.output_shape)
            else:
                grad = st.boxes.pop(stage + 1, {}).get("grad")
            if grad is not None:
                with self.algorithm(stage):
                    torch.autograd.backward(edge, grad_tensors=grad.to(self.chain.device, non_blocking=True))
        elif stage not in self.inside:  # a segment's other stages ran with the backward of its last one
            st.boxes.pop(stage + 1, None)
        if stage == 0:
            self.state.pop(sb, None)  # the sub-batch is over

    def close(self) -> None:
        """Drop every activation, gradient and graph still held."""
        self.state.clear()
