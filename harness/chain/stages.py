"""Cut a traced model into a chain of stages (papers/004 section 6.1, as rotor does).

A cut may go after position k of the graph when exactly one activation is live there:
one tensor computed from the input at or before k is still needed after k (parameters,
buffers and tensors that depend on neither the input nor a parameter, such as a causal
mask, do not count: they are resident all along; plain Python values such as shapes may
cross a cut and are carried along). A tensor computed from a trainable parameter alone
counts as live: a stage run without saving would compute it without its graph, losing
the parameter's gradient, so no cut may pass it to a later stage. Between two consecutive cuts lies a stage, so
every non-linear part of a network (a residual block, an inception module, a
transformer layer) becomes one "virtual" stage and every layer of a plain sequence its
own. A dense block is cut after every dense layer: ``graph.trace`` rewrites its growing
concatenation into a chain (``chain_concatenations``), so that the one live tensor
between two dense layers is the concatenation of all earlier features, as in the
sequential DenseNet the paper's chains were built from (a dense layer returning
``cat([x, new])``). The tensors autograd saves are the same ones, so the stages' saved
bytes still add up to what the unsplit model saves.

Three refinements keep the chain faithful to what the model really holds in memory:

- a cut whose tensor is modified in place after the cut (an in-place ReLU after a
  BatchNorm) is dropped: the in-place operation joins the stage that produced its input;
- a stage whose output is stored in the same memory as its input (a flatten, a view, an
  in-place operation) is merged into the previous stage (into the next one for the first
  stage), so that x_i and x_{i+1} never name the same storage.
- a stage that only concatenates (``cat([x])``, the copy that starts a growing
  concatenation) joins the stage that consumes it.

The cut points come from one forward pass on the ``meta`` device (``plan_stages``);
``StagePlan`` refers to graph positions, so the plan applies to any trace of the same
model with the same input shape, on any device.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch

from harness.chain.metafast import meta_modes
from harness.errors import ProfilingError
from harness.chain.graph import Graph, is_concatenation, iter_nodes, op_name, tensors_in


@dataclass(frozen=True)
class StageSpan:
    """One stage: graph positions ``first..last`` (inclusive); ``output`` holds its result.

    ``input`` is the position whose value the stage receives (the previous stage's
    ``output``, or the model's input placeholder for the first stage).
    """

    name: str
    kind: str
    input: int
    first: int
    last: int
    output: int


@dataclass(frozen=True)
class StagePlan:
    """The chain cut of a model: its stages in order, and the node names it was made for."""

    stages: tuple[StageSpan, ...]
    node_names: tuple[str, ...]

    def check(self, graph: Graph) -> None:
        """Raise ``ProfilingError`` if ``graph`` is not the graph this plan was made for."""
        names = tuple(n.name for n in graph.nodes)
        if names != self.node_names:
            raise ProfilingError(
                "the model traced differently on this device than on the meta device "
                f"({len(names)} nodes vs {len(self.node_names)}); cannot apply the chain cut"
            )


def storage_key(t: torch.Tensor) -> int:
    """An id of the memory a tensor lives in: views and in-place results share it."""
    return t.untyped_storage()._cdata


def dense_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's own elements (a gradient is dense, whatever the value's layout)."""
    return t.numel() * t.element_size()


def storage_bytes(t: torch.Tensor) -> int:
    """Bytes of the memory block a tensor lives in (a view counts its whole base)."""
    return int(t.untyped_storage().nbytes())


@dataclass
class _Candidate:
    position: int  # cut after this graph position
    live: int  # position of the one live tensor
    key: int
    version: int


def plan_stages(graph: Graph, example: torch.Tensor) -> StagePlan:
    """Find the cut points of ``graph`` by running it once on ``example`` (use ``meta``)."""
    returned = graph.returned_index()
    last_node = graph.output_index - 1
    info = graph.info
    env: dict[int, object] = {graph.input_index: example}
    live: set[int] = set()
    if info[graph.input_index].last_use > graph.input_index:
        live.add(graph.input_index)
    candidates: list[_Candidate] = []
    if isinstance(example, torch.Tensor):
        candidates.append(_Candidate(graph.input_index, graph.input_index, storage_key(example), example._version))

    def on_node(i: int, value: object, env_now: dict[int, object]) -> None:
        if not graph.is_workload_constant(i) and info[i].last_use > i and tensors_in(value):
            live.add(i)
        for j in info[i].inputs:
            if info[j].last_use <= i:
                live.discard(j)
        if len(live) == 1 and i < last_node:
            (j,) = live
            t = env_now[j]
            if isinstance(t, torch.Tensor) and j in graph.input_dependent:
                candidates.append(_Candidate(i, j, storage_key(t), t._version))

    with torch.no_grad(), meta_modes(example.device.type == "meta"):
        graph.run(graph.input_index + 1, last_node, env, keep=lambda i: True, on_node=on_node)
    result = env[returned]
    if not isinstance(result, torch.Tensor):
        raise ProfilingError("the model's output is not a tensor; the chain profilers need one output tensor")

    # Cuts whose tensor is modified in place later are not cuts (the first one stays).
    kept = [c for k, c in enumerate(candidates) if k == 0 or env[c.live]._version == c.version]
    kept = [c for c in kept if c.position < returned]
    kept.append(_Candidate(last_node, returned, storage_key(result), result._version))
    # Consecutive cuts on one storage (the stages between them only make views, or
    # compute no tensor): keep one cut per run, so that the aliasing nodes join a
    # neighbour. Keep the model input if the run has it, else the model output if the
    # run has it, else the run's first cut (views join the stage that consumes them).
    runs: list[list[_Candidate]] = []
    for c in kept:
        if runs and runs[-1][-1].key == c.key:
            runs[-1].append(c)
        else:
            runs.append([c])
    cuts = [run[0] if run is runs[0] or run is not runs[-1] else run[-1] for run in runs]
    computes = {i for i, v in env.items() if tensors_in(v)}
    # A stage that only concatenates (a copy: cat of the one live tensor, the first step
    # of a growing concatenation) joins the stage that consumes it.
    cuts = [b for a, b in zip([None, *cuts], cuts)
            if a is None or b is cuts[-1] or not _only_concatenates(graph, a.position + 1, b.position, computes)]
    if len(cuts) < 2:
        raise ProfilingError("the model computes nothing from its input that can form a stage")
    spans = [(a.live, a.position + 1, b.position, b.live) for a, b in pairwise(cuts)]
    return StagePlan(_name_stages(graph, spans, computes), tuple(n.name for n in graph.nodes))


def _only_concatenates(graph: Graph, first: int, last: int, computes: set[int]) -> bool:
    tensors = [i for i in iter_nodes(graph, first, last) if i in computes]
    return bool(tensors) and all(is_concatenation(graph.nodes[i]) for i in tensors)


# --------------------------------------------------------------------------- kinds and names

_LINEAR = {"linear", "addmm", "mm", "bmm", "baddbmm", "matmul", "einsum"}
_ACT = ("relu", "gelu", "silu", "sigmoid", "tanh", "hardswish", "hardsigmoid", "softmax", "dropout",
        "elu", "mish", "swish", "leaky_relu", "leakyrelu", "prelu", "selu", "glu")
_WEIGHTED = ("conv", "linear", "attention", "embedding")


def node_kind(graph: Graph, index: int) -> str | None:
    """The stage kind one node contributes (conv, linear, norm, ...), or None for glue."""
    name = op_name(graph, index)
    if "attention" in name or name == "scaled_dot_product_attention":
        return "attention"
    if "conv" in name:
        return "conv"
    if name in _LINEAR:
        return "linear"
    if "embedding" in name:
        return "embedding"
    if "norm" in name and name not in ("normal", "normal_"):
        return "norm"
    if "pool" in name:
        return "pool"
    if any(a in name for a in _ACT):
        return "act"
    return None


def stage_kind(kinds: list[str]) -> str:
    """A stage's kind from its nodes' kinds: its one weighted layer, ``block`` for several."""
    weighted = [k for k in kinds if k in _WEIGHTED]
    if len(weighted) >= 2:
        return "block"
    if weighted:
        return weighted[0]
    for k in ("pool", "norm", "act"):
        if k in kinds:
            return k
    return "other"


def _stage_names(graph: Graph, positions: list[int]) -> tuple[str, str]:
    """A short and a longer name for a stage from the module paths of its nodes.

    The short one is the deepest module holding all of them (``layer1.0``); the longer
    one adds the range of its children (``features.0..1``), used when the short one is
    taken or when the nodes sit in several sibling modules.
    """
    paths = [p.split(".") if p else [] for p in (graph.module_path(i) for i in positions)]
    nonempty = [p for p in paths if p]
    if not nonempty:
        name = graph.nodes[positions[0]].name
        return name, name
    common: list[str] = []
    if len(nonempty) == len(paths):
        for parts in zip(*nonempty):
            if len(set(parts)) != 1:
                break
            common.append(parts[0])
    kids: list[str] = []
    for p in nonempty:
        if len(p) > len(common) and p[len(common)] not in kids:
            kids.append(p[len(common)])
    base = ".".join(common)
    sep = "." if base else ""
    long = f"{base}{sep}{kids[0]}..{kids[-1]}" if len(kids) >= 2 else (f"{base}{sep}{kids[0]}" if kids else base)
    if base and len(kids) >= 2 and _holds_module(graph, base, positions):
        return base, long  # the stage runs every submodule of ``base``: name it after that module
    if not base or (len(kids) >= 2 and all(len(p) > len(common) for p in nonempty)):
        return long, long
    return base, long


def _holds_module(graph: Graph, path: str, positions: list[int]) -> bool:
    inside = set(positions)
    calls = [i for i, n in enumerate(graph.nodes)
             if n.op == "call_module" and (str(n.target) == path or str(n.target).startswith(path + "."))]
    return bool(calls) and all(i in inside for i in calls)


def _naming_positions(graph: Graph, positions: list[int]) -> list[int]:
    """The nodes a stage is named after: all but concatenations from outside the others' module.

    A growing concatenation (``chain_concatenations``) ends the stage of dense layer k with
    the concatenation that sits in the module of layer k + 1 (and the first layer's stage
    starts with the copy that begins it): the stage is named after layer k.
    """
    rest = [i for i in positions if not is_concatenation(graph.nodes[i])]
    if not rest or len(rest) == len(positions):
        return positions
    paths = [graph.module_path(i).split(".") for i in rest]
    common: list[str] = []
    for parts in zip(*paths):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return [i for i in positions
            if i in rest or (common and graph.module_path(i).split(".")[:len(common)] == common)]


def _name_stages(
    graph: Graph, spans: list[tuple[int, int, int, int]], computes: set[int]
) -> tuple[StageSpan, ...]:
    """Name and classify the stages from the nodes in them that produce tensors."""
    out: list[StageSpan] = []
    seen: dict[str, int] = {}
    for inp, first, last, result in spans:
        positions = [i for i in iter_nodes(graph, first, last) if i in computes] or [last]
        kinds = [k for k in (node_kind(graph, i) for i in positions) if k]
        name, long = _stage_names(graph, _naming_positions(graph, positions))
        if name in seen:
            name = long if long not in seen else f"{name}.{graph.nodes[positions[-1]].name}"
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}#{seen[name]}"
        out.append(StageSpan(name, stage_kind(kinds), inp, first, last, result))
    return tuple(out)
