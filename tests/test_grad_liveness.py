"""The backward workspace ex^B of a stage (``harness.profilers.grad_liveness``) against real autograd.

The independent measurement: each stage's backward runs for real on the CPU under a
dispatch mode that sees every tensor an operator creates and, through a finaliser on its
storage, when it is freed. The chain model holds y_{i+1} and y_i for the whole of B_i, so
for every stage the estimate must satisfy

    ex^B_i  <=  real peak of what B_i allocates  <=  ex^B_i + |y_i|

(y_i may be allocated only at the end of B_i, so the real peak may miss it, never more).
Before the estimate replayed autograd, an in-place ReLU's input and output gradients were
one storage to it: a conv + ReLU stage had no backward workspace at all.
"""

from __future__ import annotations

import functools
import weakref

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from harness.chain.graph import Graph, trace  # noqa: E402
from harness.profilers.instrument import record_chain  # noqa: E402
from harness.chain.stages import plan_stages  # noqa: E402


class _Allocations(TorchDispatchMode):
    """The new storages operators create while active, in order: each allocation and its free."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}  # data pointer -> the allocation's number, while it lives
        self.events: list[tuple[int, int]] = []  # (allocation number, +bytes when made or -bytes when freed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        known = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr in self.live or ptr in known or storage.nbytes() == 0:
                    continue  # a view or an in-place result: nothing new
                self.live[ptr] = number = len(self.events)
                self.events.append((number, storage.nbytes()))
                weakref.finalize(storage, self._free, ptr, number, storage.nbytes())
        return out

    def _free(self, ptr: int, number: int, size: int) -> None:
        del self.live[ptr]
        self.events.append((number, -size))

    def peak(self, leaving: set[int] = frozenset()) -> int:
        """The most bytes alive at once, without the storages at the pointers ``leaving`` that outlive the
        run (the weights' gradients: an earlier buffer freed at the same address is counted)."""
        excluded = {number for ptr, number in self.live.items() if ptr in leaving}
        now = peak = 0
        for number, size in self.events:
            if number not in excluded:
                now += size
                peak = max(peak, now)
        return peak


def _stages_against_autograd(name: str | torch.nn.Module, trained: bool = False):
    """(stage, estimated ex^B, |y_i|, real peak) for every stage after the first.

    Weight gradients are weights, not ex^B: the parameters are frozen for the real run, or with
    ``trained`` (for a model that freezes what it need not train) the storages that end as their
    ``.grad`` are left out of the real peak (taking their bytes off the peak instead took them off at
    a moment before they existed: ConvNeXt-T then had 23 of its 28 stages outside the bracket, 5 now)."""
    model = getattr(torchvision.models, name)() if isinstance(name, str) else name
    x = torch.randn(2, 3, 64, 64)
    graph = Graph(trace(model, x))
    plan = plan_stages(graph, x)
    records = record_chain(graph, plan, x, count_ops=False)
    for p in graph.gm.parameters():
        p.requires_grad_(p.requires_grad and trained)
    rows, value = [], x
    for s, (span, record) in enumerate(zip(plan.stages, records.stages)):
        leaf = value.detach().requires_grad_(s > 0)
        # a clone, so that the stage input is an autograd node like the previous stage's output
        env = {span.input: leaf.clone() if s > 0 else leaf}
        graph.run(span.first, span.last, env, keep=lambda i, out=span.output: i == out)
        out = env[span.output]
        if s > 0 and out.requires_grad:
            grad = torch.ones_like(out)
            with _Allocations() as seen:
                torch.autograd.backward(out, grad)
            weight_grads = {p.grad.untyped_storage().data_ptr() for p in graph.gm.parameters() if p.grad is not None}
            rows.append((span.name, record.bwd_workspace, record.grad_bytes, seen.peak(weight_grads)))
            for p in graph.gm.parameters():
                p.grad = None
        value = out.detach()
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "densenet121", "vgg11", "regnet_x_400mf",
                                  "mobilenet_v3_small", "efficientnet_b0"])
def test_backward_workspace_brackets_what_autograd_allocates(name):
    rows = _stages_against_autograd(name)
    assert len(rows) > 5
    wrong = [row for row in rows if not row[1] <= row[3] <= row[1] + row[2]]
    assert not wrong, wrong


def test_a_conv_relu_stage_needs_the_gradient_of_the_conv_output():
    """ReLU(inplace=True) writes over the conv output, yet B makes a new gradient for it."""
    rows = dict((r[0], r) for r in _stages_against_autograd("vgg11"))
    name, ex, y, real = rows["features.3..4"]
    conv_output = 2 * 128 * 32 * 32 * 4  # batch 2, 128 channels at 32x32, float32
    assert ex == conv_output
    assert real == conv_output + y  # that gradient, then y_i while it still lives


def test_residual_blocks_hold_the_skip_gradient_until_the_sum():
    """BasicBlock: the skip connection's gradient (the size of x) waits for the main branch;
    adding them makes a third buffer of that size, whatever the main branch held."""
    rows = _stages_against_autograd("resnet18")
    name, ex, y, real = next(r for r in rows if r[0] == "layer1.1")
    assert ex == 2 * y and real == ex + y


def test_operations_that_return_their_input_allocate_no_gradient():
    """``nn.Identity`` and dropout with p = 0 return the very tensor they got, with the same
    ``grad_fn``: no backward, no buffer; an in-place ReLU replaces the ``grad_fn``: one buffer."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Identity(),
        torch.nn.Dropout(p=0.0), torch.nn.ReLU(inplace=True), torch.nn.Conv2d(8, 8, 3, padding=1),
    )
    rows = _stages_against_autograd(model)
    assert rows
    conv_output = 2 * 8 * 64 * 64 * 4
    for name, ex, y, real in rows:
        assert ex <= real <= ex + y, rows
    assert max(ex for _, ex, _, _ in rows) == conv_output


def test_a_broadcast_product_holds_the_operands_gradient_at_the_results_size_until_autograd_sums_it():
    """Squeeze-and-excitation, ``s * h`` with ``s`` of shape (B, C, 1, 1): the product's backward makes
    ``s``'s gradient as ``grad * h``, of h's size, and the engine sums it down only after the node
    returned both gradients. RegNet-Y's blocks did so beside two more of h's size (the product's
    own gradient and h's), and the estimate, which had ``s``'s gradient at its own size, fell a
    whole ``h`` short of the real peak in 12 of its 19 stages (79,872 bytes against 108,160)."""
    rows = _stages_against_autograd("regnet_y_400mf")
    assert [row for row in rows if not row[1] <= row[3] <= row[1] + row[2]] == []
    name, ex, y, real = next(r for r in rows if r[0] == "trunk_output.block3.block3-1")
    h, s = 2 * 208 * 4 * 4 * 4, 2 * 208 * 4  # batch 2, 208 channels at 4x4 (a 64x64 input), float32
    assert ex == 3 * h + s


class _UsedTwice(torch.nn.Module):
    """``h * h`` and ``torch.cat([h, h])``: one node uses its operand twice."""

    def __init__(self, concatenate: bool) -> None:
        super().__init__()
        self.concatenate = concatenate
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c = torch.nn.Conv2d(16 if concatenate else 8, 8, 3, padding=1)

    def forward(self, x):
        h = self.b(self.a(x))
        h = torch.cat([h, h], 1) if self.concatenate else h * h
        return self.c(h)


@pytest.mark.parametrize("concatenate", [False, True], ids=["square", "cat-self"])
def test_an_operand_used_twice_gets_two_gradients_then_their_sum(concatenate):
    """Autograd makes a gradient for each use and adds them: for a moment two buffers of the
    operand's size live beside y_i (the first of them)."""
    rows = _stages_against_autograd(_UsedTwice(concatenate))
    for name, ex, y, real in rows:
        assert ex <= real <= ex + y, rows
    assert max(ex / y for _, ex, y, _ in rows if y) == 2


class _ConcatenatesAConstant(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c = torch.nn.Conv2d(16, 8, 3, padding=1)
        self.register_buffer("k", torch.zeros(2, 8, 64, 64))

    def forward(self, x):
        return self.c(torch.cat([self.b(self.a(x)), self.k], 1))


def test_a_gradient_handed_on_as_y_i_counts_beyond_y_i():
    """cat([x, constant]) gives x a slice of its gradient: y_i is half of that buffer, and the
    other half is this stage's workspace (the real run also copies the slice into the leaf's
    contiguous gradient, which a chain's previous stage would not)."""
    graph_rows = _stages_against_autograd(_ConcatenatesAConstant())
    name, ex, y, real = graph_rows[-1]
    assert ex == y and real <= ex + 2 * y


class _LearnedBias(torch.nn.Module):
    """``conv(x + tanh(b))`` with ``b`` a parameter of one sample's size (a learned position bias), the
    later convolutions frozen: the bias is made from a parameter alone, and its gradient is summed over
    the batch into a new buffer before tanh's backward makes ``b``'s."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)  # trained: its output, the next stage's input, needs a gradient
        self.bias = torch.nn.Parameter(torch.randn(8, 64, 64))
        self.b = torch.nn.Conv2d(8, 8, 3, padding=1).requires_grad_(False)
        self.c = torch.nn.Conv2d(8, 8, 3, padding=1).requires_grad_(False)

    def forward(self, x):
        return self.c(self.b(self.a(x) + torch.tanh(self.bias)))


class _ViewedBias(_LearnedBias):
    """``conv(x + b.view(...))``: a view of the parameter, whose gradient becomes the parameter's own."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(8 * 64 * 64))

    def forward(self, x):
        return self.c(self.b(self.a(x) + self.bias.view(8, 64, 64)))


class _ExpandedScale(_LearnedBias):
    """``h * s.view(1, 8, 1, 1).expand_as(h)``: the expansion views the parameter, yet its gradient (grad * h)
    has the batch's size, a buffer of its own that the reduction to ``s``'s shape reads."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        h = self.a(x)
        return self.c(self.b(h * self.scale.view(1, 8, 1, 1).expand_as(h)))


class _BroadcastScale(_ExpandedScale):
    """``h * s.view(1, 8, 1, 1)``, a layer scale: autograd broadcasts the parameter itself, and its gradient
    (grad * h, of h's size) lives until the engine sums it to ``s``'s shape (which becomes ``s.grad``)."""

    def forward(self, x):
        h = self.a(x)
        return self.c(self.b(h * self.scale.view(1, 8, 1, 1)))


class _LayerScale(_ExpandedScale):
    """ConvNeXt's ``gamma * h`` with ``gamma`` of shape (8, 1, 1): the parameter read directly, no view;
    ``product`` is each spelling of the product, one in half precision (the product is in h's float32)."""

    PRODUCTS = {"mul": lambda g, h: g * h, "torch.multiply": torch.multiply,
                "Tensor.multiply": lambda g, h: h.multiply(g), "half-precision-scale": lambda g, h: g.half() * h}

    def __init__(self, product: str) -> None:
        super().__init__()
        self.gamma = torch.nn.Parameter(torch.randn(8, 1, 1))
        self.product = self.PRODUCTS[product]

    def forward(self, x):
        return self.c(self.b(self.product(self.gamma, self.a(x))))


# the half-precision copy of gamma is a value of the stage, not a weight: its gradient is workspace, summed
# in float32 (8 floats) before the cast to half
_LAYER_SCALES = [(functools.partial(_LayerScale, product), 2 * 8 * 64 * 64 * 4 + (8 * 4 if "half" in product else 0))
                 for product in _LayerScale.PRODUCTS]


@pytest.mark.parametrize("model, expected", [(_LearnedBias, 8 * 64 * 64 * 4), (_ViewedBias, 0),
                                             (_ExpandedScale, 2 * 2 * 8 * 64 * 64 * 4),
                                             (_BroadcastScale, 2 * 8 * 64 * 64 * 4), *_LAYER_SCALES],
                         ids=["tanh-of-parameter", "view-of-parameter", "expanded-parameter", "broadcast-parameter",
                              *(f"layer-scale-{p}" for p in _LayerScale.PRODUCTS)])
def test_a_tensor_made_from_a_parameter_gets_a_gradient_buffer_in_the_backward(model, expected):
    """tanh(b)'s gradient (8x64x64 floats, summed over the batch into a new buffer) is the stage's
    workspace: the estimate replayed only the values the input reaches and had 0. A view of b is b:
    the summed gradient becomes b.grad, which the weights count (the first fix counted it twice). An
    expanded view is not: its gradient has the batch's size (the second fix had 0 for it; the product's
    two operand gradients, each of h's size, are the estimate). Broadcast without ``expand_as``, the
    parameter is a weight to the replay, yet the product makes its gradient at h's size first: the
    estimate had 0 for it, beside h's gradient, which is y_i. So did ConvNeXt's layer scale, the parameter
    read without a view, spelt ``torch.multiply``, or in half precision (h's size is in the product's dtype)."""
    rows = _stages_against_autograd(model(), trained=True)
    for name, ex, y, real in rows:
        assert ex <= real <= ex + y, rows
    assert rows[0][1] == expected, rows
