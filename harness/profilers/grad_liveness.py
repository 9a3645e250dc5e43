"""The temporary gradient memory of one stage's backward B_i, from its forward graph.

papers/004 section 3.1 holds y_{i+1} (the gradient that enters B_i) and y_i (the one it
produces) for the whole of B_i; ``ex^B_i`` is what B_i needs on top of them: the
gradients of the stage's inner values. ``GradLiveness`` replays autograd's order (the
stage's nodes in reverse) over the buffers those gradients occupy:

- every node k whose result needs a gradient receives one buffer g_k (the accumulated
  gradient of its result); running B of k creates a contribution for each of its inputs
  and then releases g_k;
- a contribution is a **new** buffer of the input's size, except where autograd hands
  g_k itself on (an addition passes its gradient to both operands, a subtraction to the
  first, a concatenation gives each operand a slice of it, a reshape-like view and a
  tuple item reuse it); an operand used twice (``x * x``) gets a contribution per use;
- an **in-place** operation (``relu_``, ``x += y`` aside) has a result that is its input
  object, yet the gradients of its result and of its input are two tensors: ReLU's
  backward writes a new one. Keying gradients by storage (as the forward liveness keys
  values) would merge them; here they are keyed by node. An operation that returns its
  operand object untouched (``nn.Identity``, dropout with p = 0) is told apart by the
  ``grad_fn``, which only an in-place operation replaces;
- a second contribution to the same value is added out of place (what autograd's input
  buffers do here): for a moment the old sum, the contribution and the new sum all live.
  This is the residual block's peak: the skip connection's gradient waits for the main
  branch, then both become y_i;
- when y_i is a slice of an inner buffer (a concatenation with a constant), the rest of
  that buffer is workspace;
- an operand that an elementwise operation broadcasts (``h * s`` with ``s`` of shape
  (B, C, 1, 1): squeeze-and-excitation, a hand-written norm's ``x / std``) gets its
  gradient at the result's shape first, and autograd's engine sums it down to the operand's
  shape only after the node's backward returned all its gradients (``validate_outputs``). So
  for a moment a result-sized buffer lives per broadcast operand, beside the node's other
  contributions. An addition's (and the subtraction's first operand's) unreduced gradient is
  the node's own buffer: nothing new until the sum. A broadcast parameter (a layer scale,
  ``h * scale.view(1, C, 1, 1)``) has that moment too; once summed, its gradient is the
  weights' (``.grad``).

The peak is taken while a node's contributions exist beside the gradients still pending,
without the buffers of y_{i+1} and y_i, which the chain model counts already.

The unit is the traced graph's node. What one node's backward allocates inside itself is
not seen: fused CNN kernels allocate little there (on the CPU, real autograd allocations
bracket the estimate on every stage of ResNet-50, MobileNet-V2 and -V3, DenseNet-121,
VGG-11, RegNet-X and -Y and EfficientNet-B0, ``tests/test_grad_liveness.py``), but a
wrapped attention function is one node, and Swin-T's attention stages allocate several
times the estimate (8-12x at batch 2 on a 64x64 input). A division's divisor is another:
its gradient, ``-grad * ((x / d) / d)``, passes through temporaries of the result's size,
so on the CPU ``h / d`` allocates two result-sized buffers more than the estimate counts
(whichever operand is broadcast). An in-place method called as a statement (``h.mul_(s)``,
its result unused) is not replayed: the graph's later uses read the node before it.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import torch
from torch import fx

from harness.chain.graph import tensors_in
from harness.chain.stages import storage_key

_ADDITIONS = {operator.add, operator.iadd, torch.add}
_SUBTRACTIONS = {operator.sub, operator.isub, torch.sub, torch.subtract}
_ADDITION_METHODS = {"add", "add_"}
_SUBTRACTION_METHODS = {"sub", "sub_", "subtract", "subtract_"}
_PRODUCTS = {operator.mul, operator.imul, torch.mul, torch.multiply,
             operator.truediv, operator.itruediv, torch.div, torch.divide, torch.true_divide}
_PRODUCT_METHODS = {"mul", "mul_", "multiply", "multiply_", "div", "div_", "divide", "divide_",
                    "true_divide", "true_divide_"}
_CONCATENATIONS = {torch.cat, torch.concat}


def operand_uses(node: fx.Node, position: dict[fx.Node, int]) -> list[tuple[int, bool]]:
    """(graph position, whether it is the first argument) for every use of a node by ``node``.

    A node used twice (``x * x``, ``torch.cat([h, h])``) is listed twice: autograd makes
    a gradient for each use and adds them.
    """
    uses: list[tuple[int, bool]] = []
    first = node.args[0] if node.args else None
    fx.node.map_arg((node.args, node.kwargs), lambda a: uses.append((position[a], a is first)) or a)
    return uses


def _is(node: fx.Node, functions: set, methods: set) -> bool:
    return (node.op == "call_function" and node.target in functions) or (
        node.op == "call_method" and node.target in methods)


def dense_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's own elements (a gradient is dense, whatever the value's layout)."""
    return t.numel() * t.element_size()


def _grad_bytes(value: Any) -> int:
    return sum(dense_bytes(t) for t in tensors_in(value) if t.requires_grad)


def _passes_gradient_on(node: fx.Node, value: Any, operand: Any, operand_fn: Any, first: bool) -> bool:
    """Whether autograd gives ``operand`` the node's own gradient buffer (no new memory).

    ``operand_fn`` is the operand's ``grad_fn`` when it was produced: a node that returns
    its operand object unchanged (``nn.Identity``, dropout with p = 0, a no-op
    ``contiguous``) leaves it, an in-place operation replaces it. ``first``: the operand
    is the node's first argument (a subtraction negates the gradient of the second, an
    addition with ``alpha`` scales it).
    """
    if not isinstance(operand, torch.Tensor):
        return True  # an item of a tuple result: its gradient is the tuple's
    if node.op == "call_function" and node.target is operator.getitem:
        return False  # indexing a tensor: its backward writes a zero-filled tensor of the operand's size
    if not isinstance(value, torch.Tensor):
        return False
    if value is operand:
        return value.grad_fn is operand_fn
    same_size = operand.numel() == value.numel()
    if _is(node, _ADDITIONS, _ADDITION_METHODS):
        return same_size and (first or node.kwargs.get("alpha", 1) == 1)
    if _is(node, _SUBTRACTIONS, _SUBTRACTION_METHODS):
        return same_size and first
    if node.op == "call_function" and node.target in _CONCATENATIONS:
        return True
    is_view = storage_key(value) == storage_key(operand)
    return is_view and same_size


def _broadcast_gradient(node: fx.Node, value: Any, operand: Any, first: bool) -> tuple[int, int]:
    """Bytes of the result-sized gradient an elementwise operation makes for an operand it broadcast,
    and of its sum to the operand's shape (in the result's dtype, cast to the operand's afterwards).

    (0, 0) when the operand is not broadcast, when the operation is not elementwise arithmetic (where a
    shape change means something else: a convolution's channels), and when the unreduced gradient is
    the node's own buffer (an addition, the first operand of a subtraction): then only the sum to the
    operand's shape is new, and that is the contribution itself.
    """
    if not (isinstance(operand, torch.Tensor) and isinstance(value, torch.Tensor)) or operand.shape == value.shape:
        return 0, 0
    additive = _is(node, _ADDITIONS, _ADDITION_METHODS)
    subtractive = _is(node, _SUBTRACTIONS, _SUBTRACTION_METHODS)
    product = _is(node, _PRODUCTS, _PRODUCT_METHODS)
    if not (additive or subtractive or product):
        return 0, 0
    try:
        if torch.broadcast_shapes(operand.shape, value.shape) != value.shape:
            return 0, 0
    except RuntimeError:
        return 0, 0
    if (additive and (first or node.kwargs.get("alpha", 1) == 1)) or (subtractive and first):
        return 0, 0
    return dense_bytes(value), operand.numel() * value.element_size()


class _Contribution(NamedTuple):
    """What B of a node makes for one use of an operand."""

    target: int  # the operand's graph position (_INPUT: the stage input, _WEIGHT: a parameter)
    size: int  # bytes of the gradient the operand gets
    alias: bool  # whether that gradient is the node's own buffer
    unreduced: int = 0  # a broadcast operand's: bytes of its gradient at the result's shape first
    summed: int = 0  # and of its sum to the operand's shape, before the cast to the operand's dtype


class GradLiveness:
    """Peak bytes of a stage's inner gradients during its backward (see the module docstring)."""

    def __init__(self, first: int, last: int, output: int) -> None:
        self.first, self.last, self.output = first, last, output
        self.nodes: dict[int, list[_Contribution]] = {}  # node -> what its backward creates
        self.fns: dict[int, Any] = {}  # node -> its result's grad_fn when it was produced

    def on_node(self, i: int, node: fx.Node, value: Any, inputs: list[tuple[int, Any, bool]],
                weights: list[tuple[Any, bool]] = ()) -> None:
        """Record how B of node ``i`` feeds its inputs: (position, value, first argument) per use.

        ``weights``: (value, first argument) per use of a parameter (or a view of one). Its gradient
        goes to ``.grad``, which the weights count, except a broadcast one's result-sized moment
        (``h * scale.view(1, C, 1, 1)``, a layer scale).
        """
        if _grad_bytes(value) == 0:
            return
        record = self.nodes[i] = []
        for j, operand, first in inputs:
            size = _grad_bytes(operand)
            if size:  # the stage input is not in ``fns``: a leaf has no grad_fn
                record.append(_Contribution(j, size, _passes_gradient_on(node, value, operand, self.fns.get(j), first),
                                            *_broadcast_gradient(node, value, operand, first)))
        for operand, first in weights:
            unreduced, summed = _broadcast_gradient(node, value, operand, first) if _grad_bytes(operand) else (0, 0)
            if unreduced:  # the sum is the parameter's gradient (the weights'), unless a cast follows it
                cast = operand.dtype != value.dtype
                record.append(_Contribution(_WEIGHT, 0, False, unreduced, summed if cast else 0))
        self.fns[i] = getattr(value, "grad_fn", None)

    def peak(self) -> int:
        """The most bytes of inner gradients alive at once in B of the stage."""
        replay = _Replay(self.output)
        for k in range(self.last, self.first - 1, -1):
            if k in self.nodes and replay.has(k):
                inner = [c if c.target == _WEIGHT or self.first <= c.target <= self.last else c._replace(target=_INPUT)
                         for c in self.nodes[k]]
                replay.backward(k, inner)
        return replay.peak()


_OUTPUT, _INPUT = -1, -2  # the gradients of the stage output (y_{i+1}) and input (y_i)
_WEIGHT = -3  # a parameter's gradient: the weights count it once reduced to the parameter's shape


class _Replay:
    """Gradient buffers during one B_i: which pending gradient holds which buffer, and their sizes."""

    def __init__(self, output: int) -> None:
        self.sizes: dict[int, int] = {_OUTPUT: 0}  # buffer -> bytes (y_{i+1} is the chain model's)
        self.holders: dict[int, int] = {_OUTPUT: 1}  # buffer -> how many gradients use it
        self.pending: dict[int, int] = {output: _OUTPUT}  # node (or _INPUT) -> its gradient's buffer
        self.boundary = {_OUTPUT}  # buffers the chain model counts already: y_{i+1}, y_i
        # inner buffers (or the part of them) handed on as y_i: y_i all along
        self.aliased_input: dict[int, int] = {}
        self.snapshots: list[tuple[dict[int, int], frozenset[int]]] = []
        self._next = 0

    def has(self, node: int) -> bool:
        return node in self.pending

    def _new(self, size: int) -> int:
        self._next += 1
        self.sizes[self._next] = size
        return self._next

    def _hold(self, buf: int) -> None:
        self.holders[buf] = self.holders.get(buf, 0) + 1

    def _drop(self, buf: int) -> None:
        self.holders[buf] -= 1
        if not self.holders[buf]:
            del self.holders[buf]

    def _snapshot(self) -> None:
        self.snapshots.append(({b: self.sizes[b] for b in self.holders}, frozenset(self.boundary)))

    def _mark_input(self, buf: int, g: int, size: int) -> None:
        """``buf``, the first gradient made for the stage input, is y_i, the chain model's: not workspace."""
        if buf == g:  # y_i is (a slice of) this inner buffer
            self.aliased_input[buf] = max(self.aliased_input.get(buf, 0), size)
        else:
            self.boundary.add(buf)  # y_i's own buffer

    def backward(self, node: int, contributions: list[_Contribution]) -> None:
        """B of ``node``: its gradient feeds each contribution (``_Contribution``)."""
        g = self.pending.pop(node)
        input_made = _INPUT in self.pending  # y_i exists: a gradient for the input is summed into it later
        bufs = []  # every gradient the node's backward returns exists before the engine reduces any
        for c in contributions:
            bufs.append(g if c.alias else self._new(c.unreduced or c.size))
            self._hold(bufs[-1])
            if c.target == _INPUT and not c.unreduced and not input_made:
                self._mark_input(bufs[-1], g, c.size)
                input_made = True
        for n, c in enumerate(contributions):
            if c.unreduced:  # summed to the operand's shape, then the result-sized gradient is freed
                reduced = self._new(max(c.size, c.summed))
                self._hold(reduced)
                if c.target == _INPUT and not input_made:
                    self._mark_input(reduced, g, c.size)
                    input_made = True
                self._snapshot()
                self._drop(bufs[n])
                self.sizes[reduced] = c.size  # cast to the operand's dtype
                bufs[n] = reduced
        made = []
        for c, buf in zip(contributions, bufs):
            if c.target == _WEIGHT:
                self._drop(buf)
            else:
                made.append((c.target, buf, c.size))
        self._snapshot()
        self._drop(g)
        for target, buf, size in made:
            old = self.pending.get(target)
            if old is None:
                self.pending[target] = buf
                continue
            total = self._new(size)  # autograd adds a second gradient out of place
            self._hold(total)
            self._snapshot()
            self._drop(old)
            self._drop(buf)
            self.pending[target] = total
            if target == _INPUT:
                self.boundary.add(total)
        self._snapshot()

    def peak(self) -> int:
        def inner(live: dict[int, int], boundary: frozenset[int]) -> int:
            return sum(max(0, n - self.aliased_input.get(b, 0)) for b, n in live.items() if b not in boundary)

        return max((inner(live, boundary) for live, boundary in self.snapshots), default=0)
