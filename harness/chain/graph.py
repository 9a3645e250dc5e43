"""A model as a flat list of graph nodes that can be run one range at a time.

``trace(model, example)`` turns an ``nn.Module`` into a ``torch.fx.GraphModule``: first
with ``torch.fx.symbolic_trace`` (fast, module-level nodes: every torchvision model), then
with ``torch.export`` (aten-level nodes: models with data-dependent Python such as
HuggingFace transformers). ``Graph`` wraps the result: the nodes in execution order,
the users of each, and ``run(first, last, env)`` to execute a contiguous range of them,
which is how a chain stage is run on its own.

``trace`` also rewrites growing concatenations into a chain (``chain_concatenations``):
``cat([a, b, c])`` after ``p = cat([a, b])`` becomes ``cat([p, c])``, the same value from
fewer live tensors, so that a DenseNet dense block can be cut after every dense layer
(papers/004 section 6.1: the paper's chains came from sequential models, where a dense
layer returns ``cat([x, new])``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import fx
from torch.utils._pytree import tree_flatten

from harness.errors import ProfilingError

_SDPA = torch.nn.functional.scaled_dot_product_attention


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor inside ``value`` (a tensor, or nested tuples/lists/dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    found: list[torch.Tensor] = []
    _collect(value, found)
    return found


def _collect(value: Any, found: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _collect(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _collect(v, found)
    elif hasattr(value, "__dataclass_fields__") or hasattr(value, "to_tuple"):
        _collect([v for v in tree_flatten(value)[0]], found)


def trace(model: torch.nn.Module, example: torch.Tensor, label: str = "model") -> fx.GraphModule:
    """The model as a GraphModule: ``symbolic_trace`` if it can, else ``torch.export``."""
    if isinstance(model, fx.GraphModule):
        return model
    try:
        return chain_concatenations(fx.symbolic_trace(model))
    except Exception as fx_error:  # noqa: BLE001 - any tracing failure means: try export
        try:
            return chain_concatenations(torch.export.export(model, (example,), strict=False).module())
        except Exception as export_error:  # noqa: BLE001
            raise ProfilingError(
                f"cannot trace {label} into a graph: torch.fx said {_short(fx_error)}; "
                f"torch.export said {_short(export_error)}. The profilers need a model whose "
                "forward can be traced with one of the two (no data-dependent control flow)."
            ) from None


_CATS = {torch.cat, torch.concat, torch.concatenate, torch.ops.aten.cat.default}


def _cat_operands(n: fx.Node) -> tuple[tuple[fx.Node, ...], Any] | None:
    """``(operands, dim)`` of a concatenation node whose operands are all graph values, else None."""
    if n.op != "call_function" or n.target not in _CATS or not n.args:
        return None
    operands = n.args[0]
    if not isinstance(operands, (list, tuple)) or not operands or not all(isinstance(a, fx.Node) for a in operands):
        return None
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", n.kwargs.get("axis", 0))
    if isinstance(dim, fx.Node) or len(n.args) > 2 or set(n.kwargs) - {"dim", "axis"}:
        return None  # an out= or a computed dim: leave it alone
    return tuple(operands), dim


def is_concatenation(n: fx.Node) -> bool:
    """Whether ``n`` concatenates graph values (``torch.cat`` and its aliases, ``aten.cat``)."""
    return _cat_operands(n) is not None


def _mutates(user: fx.Node, value: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether ``user`` may write into ``value`` (or into memory it shares): in-place or out= ops.

    Conservative: an unknown module or function counts as writing when it says ``inplace``,
    a method or function whose name ends with ``_`` does, and an aten op with a mutable schema.
    """
    if user.op == "call_method":
        return str(user.target).endswith("_") and user.args[:1] == (value,)
    if user.op == "call_module":
        return bool(getattr(gm.get_submodule(str(user.target)), "inplace", False))
    if user.op == "call_function":
        t = user.target
        if isinstance(t, torch._ops.OpOverload):
            return t._schema.is_mutable
        if user.kwargs.get("inplace") or "out" in user.kwargs:
            return True
        return getattr(t, "__name__", "").endswith("_")
    return False


# Modules whose output may be (a view of) their input.
_VIEW_MODULES = (torch.nn.Identity, torch.nn.Flatten, torch.nn.Unflatten)
# Functions and methods whose result may view their first operand.
_VIEW_NAMES = {"view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze",
               "transpose", "swapaxes", "t", "permute", "movedim", "expand", "expand_as", "narrow", "select",
               "getitem", "unbind", "split", "chunk", "diagonal", "as_strided", "detach", "contiguous", "unfold"}


# Tensor attributes that are views (fx traces ``x.mT`` as ``getattr(x, "mT")``).
_VIEW_ATTRIBUTES = {"T", "mT", "H", "mH", "real", "imag"}


def _may_view(node: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether ``node``'s result may share the memory of its first operand (conservative: ``reshape`` and
    ``contiguous`` count, though they copy when they must)."""
    if node.op == "call_module":
        return isinstance(gm.get_submodule(str(node.target)), _VIEW_MODULES)
    if node.op == "call_method":
        return str(node.target) in _VIEW_NAMES
    if node.op == "call_function":
        if isinstance(node.target, torch._ops.OpOverload):
            return bool(getattr(node.target, "is_view", False))
        if node.target is getattr:
            return len(node.args) > 1 and node.args[1] in _VIEW_ATTRIBUTES
        return getattr(node.target, "__name__", "") in _VIEW_NAMES
    return False


def _aliases(value: fx.Node, gm: fx.GraphModule) -> list[fx.Node]:
    """``value`` and the nodes that may view its memory: function and method users that are not
    concatenations, and the modules that can return their input or a view of it."""
    found, todo = [value], [value]
    while todo:
        for u in todo.pop().users:
            if u in found or is_concatenation(u):
                continue
            if u.op in ("call_method", "call_function") or (
                    u.op == "call_module" and isinstance(gm.get_submodule(u.target), _VIEW_MODULES)):
                found.append(u)
                todo.append(u)
    return found


def _never_written(value: fx.Node, gm: fx.GraphModule) -> bool:
    return not any(_mutates(u, a, gm) for a in _aliases(value, gm) for u in a.users)


def chain_concatenations(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite ``cat([a_0..a_k, b..])`` as ``cat([p, b..])`` where ``p = cat([a_0..a_k])`` ran before.

    Both compute the same tensor (concatenation along one dim is associative), and every
    concatenation keeps its size, so the tensors autograd saves are the same ones (a
    concatenation saves none). What changes is which tensors the forward keeps alive: the
    pieces ``a_i`` are no longer needed after ``p``, so where a model grows a concatenation
    piece by piece (a DenseNet dense block: layer k concatenates the block input and the
    k - 1 previous outputs) the one live tensor between two layers is ``p``, and the chain
    can be cut there. The longest earlier prefix is used; the rewrite is skipped when ``p``
    or any piece may be written in place (then the two would differ). Returns ``gm``.
    """
    seen: dict[tuple[tuple[fx.Node, ...], Any], fx.Node] = {}
    changed = False
    for n in gm.graph.nodes:
        parsed = _cat_operands(n)
        if parsed is None:
            continue
        operands, dim = parsed
        for k in range(len(operands) - 1, 0, -1):
            p = seen.get((operands[:k], dim))
            if p is not None and all(_never_written(v, gm) for v in (p, *operands[:k])):
                n.args = ([p, *operands[k:]], *n.args[1:])
                changed = True
                break
        seen.setdefault((operands, dim), n)
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text if len(text) < 300 else text[:297] + "..."


@dataclass
class NodeInfo:
    """A node with its position, the positions of its inputs, and of its last user."""

    node: fx.Node
    index: int
    inputs: tuple[int, ...]
    last_use: int


class Graph:
    """The nodes of a traced model in execution order, runnable range by range.

    Positions are indices into ``nodes``. Parameters and buffers (``get_attr`` nodes)
    are evaluated once and are available everywhere; every other value lives in the
    ``env`` dict that ``run`` receives, keyed by position. ``input_dependent`` holds the
    positions whose value depends on the model input; the others (a causal mask, position
    ids) are input-independent. ``weight_dependent`` holds the
    positions, parameters themselves aside, whose value a trainable parameter reaches (through
    a ``get_attr`` node or a module call): a gradient flows through them, so they are not
    constants even when the input does not reach them. What neither reaches is a constant of
    the workload (``is_workload_constant``). Both sets follow in-place writes as well as uses:
    a value another one writes into depends on what that one depends on.
    """

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.nodes: list[fx.Node] = list(gm.graph.nodes)
        position = {n: i for i, n in enumerate(self.nodes)}
        self.position = position
        self.info: list[NodeInfo] = []
        for i, n in enumerate(self.nodes):
            inputs = tuple(sorted({position[a] for a in n.all_input_nodes}))
            last = max((position[u] for u in n.users), default=i)
            self.info.append(NodeInfo(n, i, inputs, last))
        self.placeholders = [i for i, n in enumerate(self.nodes) if n.op == "placeholder"]
        outputs = [i for i, n in enumerate(self.nodes) if n.op == "output"]
        if len(self.placeholders) != 1:
            raise ProfilingError(
                f"the traced model takes {len(self.placeholders)} inputs; the chain profilers need exactly one tensor input"
            )
        self.input_index = self.placeholders[0]
        self.output_index = outputs[0]
        self.constants: dict[int, Any] = {
            i: self._fetch_attr(n.target) for i, n in enumerate(self.nodes) if n.op == "get_attr"
        }
        # in-place writes: the writing node -> the nodes whose memory it changes (its first operand and
        # what that operand may view); later users read the change under those nodes
        self._writes = {i: self._viewed(n.args[0]) for i, n in enumerate(self.nodes)
                        if n.args and isinstance(n.args[0], fx.Node) and _mutates(n, n.args[0], gm)}
        self.input_dependent = self._dependent_on([self.input_index])
        trained = [i for i, n in enumerate(self.nodes) if self._trains(n)]
        self.weight_dependent = self._dependent_on(trained) - set(self.constants)
        # computed constants of the workload (a causal mask, position ids), not attributes: the executor
        # keeps what autograd saves of them on the device
        self.computed_constants = frozenset(
            i for i, n in enumerate(self.nodes) if self.is_workload_constant(i)
            and n.op in ("call_function", "call_method", "call_module"))

    # -- structure
    def _trains(self, n: fx.Node) -> bool:
        """Whether node ``n`` yields a trainable parameter or calls a module that holds one."""
        if n.op == "get_attr":
            value = self.constants[self.position[n]]
            return isinstance(value, torch.Tensor) and value.requires_grad
        if n.op == "call_module":
            return any(p.requires_grad for p in self.gm.get_submodule(str(n.target)).parameters())
        return False

    def _reachable_from(self, starts: list[int]) -> set[int]:
        seen = set(starts)
        for i in range(min(starts, default=len(self.nodes)), len(self.nodes)):
            if i in seen:
                seen.update(self.position[u] for u in self.nodes[i].users)
        return seen

    def _dependent_on(self, starts: list[int]) -> set[int]:
        """What ``starts`` reach through the users, and through writes: an in-place operation they
        reach (``gate.add_(shift)``) changes the nodes of ``_writes`` (a parameter or buffer aside),
        which then depend on ``starts`` too. (``x[k] = v``: fx cannot trace it; torch.export's graph
        writes with a mutable aten op.)"""
        seen = self._reachable_from(starts)
        while written := {j for i, targets in self._writes.items() if i in seen for j in targets
                          if j not in seen and j not in self.constants}:
            seen |= self._reachable_from(sorted(written))
        return seen

    def _viewed(self, node: fx.Node) -> list[int]:
        """``node`` and, while it may be a view of its first operand (a reshape, a slice), that operand."""
        found = [self.position[node]]
        while _may_view(node, self.gm) and node.args and isinstance(node.args[0], fx.Node):
            node = node.args[0]
            found.append(self.position[node])
        return found

    def is_workload_constant(self, index: int) -> bool:
        """Whether the value at ``index`` depends neither on the input nor on a trainable parameter (a
        causal mask, position ids): the same every iteration, resident like the weights, no gradient."""
        return index not in self.input_dependent and index not in self.weight_dependent

    def is_constant(self, index: int) -> bool:
        """Parameters, buffers and other module attributes: weights, not activations."""
        return index in self.constants

    def returned_index(self) -> int:
        """Position of the node whose value the model returns (it must be one tensor)."""
        out = self.nodes[self.output_index].args[0]
        flat = [a for a in tree_flatten(out)[0] if isinstance(a, fx.Node)]
        if len(flat) != 1:
            raise ProfilingError(
                f"the model returns {len(flat)} values; the chain profilers need a model that returns one tensor "
                "(wrap it to return the logits only)"
            )
        return self.position[flat[0]]

    def module_path(self, index: int) -> str:
        """The qualified name of the module a node belongs to ('' at the top level)."""
        n = self.nodes[index]
        if n.op == "call_module":
            return str(n.target)
        stack = n.meta.get("nn_module_stack")
        if stack:
            path = list(stack.values())[-1][0]
            return _clean_path(str(path))
        return ""

    def module_type(self, index: int) -> type | None:
        """The class of the module a ``call_module`` node calls, or of the innermost enclosing module."""
        n = self.nodes[index]
        if n.op == "call_module":
            return type(self.gm.get_submodule(str(n.target)))
        stack = n.meta.get("nn_module_stack")
        if stack:
            t = list(stack.values())[-1][1]
            return t if isinstance(t, type) else None
        return None

    def _fetch_attr(self, target: str) -> Any:
        obj: Any = self.gm
        for part in target.split("."):
            obj = getattr(obj, part)
        return obj

    # -- execution
    def run(
        self,
        first: int,
        last: int,
        env: dict[int, Any],
        keep: Callable[[int], bool] = lambda i: False,
        on_node: Callable[[int, Any, dict[int, Any]], None] | None = None,
    ) -> None:
        """Execute nodes ``first..last`` (inclusive), reading and writing values in ``env``.

        A value is dropped from ``env`` after its last user ran unless ``keep(position)``
        says otherwise; ``on_node(position, value, env)`` is called after each node.
        """
        for i in range(first, last + 1):
            n = self.nodes[i]
            value = self._execute(n, env)
            env[i] = value
            if on_node is not None:
                on_node(i, value, env)
            for j in self.info[i].inputs:
                if self.info[j].last_use <= i and j in env and not keep(j):
                    del env[j]
            if self.info[i].last_use <= i and not keep(i):
                env.pop(i, None)

    def _execute(self, n: fx.Node, env: dict[int, Any]) -> Any:
        def load(a: fx.Node) -> Any:
            j = self.position[a]
            if j in self.constants:
                return self.constants[j]
            try:
                return env[j]
            except KeyError:
                raise ProfilingError(f"node {n.name} needs {a.name}, which is not live at this point") from None

        args = fx.node.map_arg(n.args, load)
        kwargs = fx.node.map_arg(n.kwargs, load)
        if n.op == "call_function":
            target = n.target
            if target is _SDPA:  # late lookup: the meta profiler swaps it (harness.chain.metafast)
                target = torch.nn.functional.scaled_dot_product_attention
            return target(*args, **kwargs)
        if n.op == "call_method":
            obj, *rest = args
            return getattr(obj, n.target)(*rest, **kwargs)
        if n.op == "call_module":
            return self.gm.get_submodule(str(n.target))(*args, **kwargs)
        if n.op == "get_attr":
            return self.constants[self.position[n]]
        if n.op == "output":
            return args[0]
        raise ProfilingError(f"cannot execute node {n.name} of kind {n.op}")


def _clean_path(path: str) -> str:
    """``L['self'].layer1[0]`` or ``m.transformer.h.0`` style paths as dotted module names."""
    path = path.replace("L['self'].", "").replace("L['self']", "")
    for a, b in (("['", "."), ("']", ""), ("[", "."), ("]", "")):
        path = path.replace(a, b)
    return path.strip(".")


def op_name(graph: Graph, index: int) -> str:
    """A lower-case name for what a node does: module class, function or aten op name."""
    n = graph.nodes[index]
    if n.op == "call_module":
        return type(graph.gm.get_submodule(str(n.target))).__name__.lower()
    if n.op == "call_method":
        return str(n.target).lower()
    if n.op == "call_function":
        t = n.target
        if isinstance(t, torch._ops.OpOverload):
            return t._schema.name.split("::")[-1].lower()
        if t in (operator.getitem,):
            return "getitem"
        return getattr(t, "__name__", str(t)).lower()
    return n.op


def iter_nodes(graph: Graph, first: int, last: int) -> Iterable[int]:
    """Positions ``first..last`` that compute something (no placeholders, attributes or output)."""
    for i in range(first, last + 1):
        if graph.nodes[i].op in ("call_function", "call_method", "call_module"):
            yield i
