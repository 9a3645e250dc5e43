"""The workspaces ex^F and ex^B of a stage, as the analytic profiler finds them on ``meta``, against
what the CPU really allocates.

The profilers measure a stage's workspaces as what its operators allocate
(``harness.profilers.allocations``): the analytic one on the ``meta`` device, where no
kernel runs and only autograd's formulas decide what is allocated. The independent
measurement here runs each stage's backward for real on the CPU, its input entering as in
the torch executor (``StageEntry``), with the weights' gradients left out (the weights count
them). The chain model holds y_{i+1} and y_i for the whole of B_i, so the workspace it needs
is what B_i allocates at its peak beyond y_i, and on every stage of every model here

    ex^B_i  =  max(0, real peak of what B_i allocates - |y_i|)

which implies the bracket the estimate was held to before, ex^B_i <= real <= ex^B_i + |y_i|.
The estimate this replaced replayed autograd's order over the traced graph's nodes: it did
not see what one node's backward allocates inside itself (a division's divisor, an in-place
method called as a statement, Swin-T's attention: 17 of its 37 stages outside the bracket,
ConvNeXt-T's layout copies of weight gradients: 5 of 28).
"""

from __future__ import annotations

import copy
import functools

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from harness.chain.entry import StageEntry  # noqa: E402
from harness.chain.extract import build_model  # noqa: E402
from harness.chain.graph import Graph, trace  # noqa: E402
from harness.chain.stages import plan_stages, storage_key  # noqa: E402
from harness.profilers.allocations import Allocations  # noqa: E402
from harness.profilers.instrument import record_chain  # noqa: E402
from harness.protocols import Workload  # noqa: E402


def test_allocations_sees_each_new_storage_until_it_is_freed_and_leaves_out_what_it_is_told():
    """Views and in-place results are no allocation; a freed storage stops counting; a storage alive at
    the end can be left out, wholly or in part; one freed before the end always counts."""
    x = torch.ones(1000)  # 4,000 bytes, made before: not seen
    with Allocations() as seen:
        a = x * 2  # 4,000
        v = a.view(10, 100)  # a view: nothing new
        a.mul_(3)  # in place: nothing new
        b = torch.cat([a, a])  # 8,000; a peak of 12,000 with a
        del a, v
        c = b[:500].clone()  # 2,000, beside b
        del b
    assert seen.peak() == 12_000
    assert seen.peak({storage_key(c): 2_000}) == 12_000  # b was freed: the peak stands
    with Allocations() as seen:
        a = x * 2
        b = torch.cat([a, a])
    assert seen.peak() == 12_000
    assert seen.peak({storage_key(b): 8_000}) == 4_000
    assert seen.peak({storage_key(b): 4_000, storage_key(a): 4_000}) == 4_000  # half of b still counts


def _stages_against_autograd(name: str | torch.nn.Module, size: int = 64, forward: bool = False,
                             example: torch.Tensor | None = None):
    """(stage, estimated ex^B, |y_i|, real peak) for every stage after the first.

    The estimate is the analytic profiler's, on a ``meta`` copy of the model. Weight gradients are
    weights, not ex^B: the storages that end as their ``.grad`` are left out of the real peak
    (taking their bytes off the peak instead took them off at a moment before they existed), not
    the temporaries they pass through (ConvNeXt-T's weight gradients are copied to the weights'
    layout). With ``forward``: (stage, estimated ex^F, real ex^F) for every stage, the real one
    what its forward allocates at its peak beyond its output and what autograd saves."""
    model = getattr(torchvision.models, name)() if isinstance(name, str) else name
    x = torch.randn(2, 3, size, size) if example is None else example
    meta_model, meta_x = copy.deepcopy(model).to("meta"), x.to("meta")
    meta_graph = Graph(trace(meta_model, meta_x))
    plan = plan_stages(meta_graph, meta_x)
    records = record_chain(meta_graph, plan, meta_x, count_ops=False)
    graph = Graph(trace(model, x))
    plan.check(graph)
    rows, forwards, value, token = [], [], x, torch.zeros((), requires_grad=True)
    env: dict = {}  # shared by the stages, as in the profilers: an exported graph's sizes are values too
    for s, (span, record) in enumerate(zip(plan.stages, records.stages)):
        # the stage input enters as in a chain (and in the torch executor): y_i is handed over, not copied
        env[span.input] = StageEntry.apply(token, value, {}) if s > 0 else value
        saved: list[torch.Tensor] = []
        with Allocations() as made, torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t,
                                                                               lambda t: t):
            graph.run(span.first, span.last, env, keep=lambda i, out=span.output: i == out)
        out = env.pop(span.output)
        counted = {storage_key(t): t.untyped_storage().nbytes() for t in [*saved, out]}
        forwards.append((span.name, record.fwd_workspace, made.peak(counted)))
        del saved
        if s > 0 and out.requires_grad:
            grad = torch.ones_like(out)
            with Allocations() as seen:
                torch.autograd.backward(out, grad)
            weight_grads = {storage_key(p.grad): p.grad.untyped_storage().nbytes()
                            for p in graph.gm.parameters() if p.grad is not None}
            rows.append((span.name, record.bwd_workspace, record.grad_bytes, seen.peak(weight_grads)))
            for p in graph.gm.parameters():
                p.grad = None
        value = out.detach()
    return forwards if forward else rows


def _exact(rows) -> None:
    assert rows
    assert [row for row in rows if row[1] != max(0, row[3] - row[2])] == [], rows


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "densenet121", "vgg11", "regnet_x_400mf",
                                  "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", "regnet_y_400mf",
                                  "convnext_tiny", "swin_t"])
def test_backward_workspace_is_what_autograd_allocates_beyond_y_i(name):
    """Every stage, Swin-T's attention and ConvNeXt-T's layout copies of weight gradients included."""
    rows = _stages_against_autograd(name)
    assert len(rows) > 5
    _exact(rows)


def _small_vit() -> torch.nn.Module:
    """ViT's encoder at a 64x64 input (traced through ``torch.export``: its sizes are graph values)."""
    return torchvision.models.VisionTransformer(image_size=64, patch_size=16, num_layers=3, num_heads=4,
                                                hidden_dim=64, mlp_dim=128)


def test_a_transformers_workspaces_are_what_its_attention_allocates():
    """``nn.MultiheadAttention`` is one node of the graph: its projections' and attention's temporaries
    (flash attention on the meta device, as on the CPU) were invisible to a model of the graph's nodes."""
    _exact(_stages_against_autograd(_small_vit()))
    forwards = _stages_against_autograd(_small_vit(), forward=True)
    assert [row for row in forwards if row[1] != row[2]] == [], forwards
    assert max(ex for _, ex, _ in forwards) > 0


def test_a_language_models_backward_workspace_is_what_autograd_allocates():
    """GPT-2 (eager attention, its S x S scores) with two layers. Its forward is not compared: on the CPU
    dropout runs as a product with a float noise tensor, where the meta device, like CUDA, runs the fused
    kernel and keeps a one-byte mask."""
    pytest.importorskip("transformers")
    model, ids = build_model(Workload("transformers:tiny-gpt2", 2, (64,), "H100"), "cpu")
    _exact(_stages_against_autograd(model, example=ids))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "densenet121", "efficientnet_b0", "convnext_tiny", "swin_t"])
def test_forward_workspace_is_what_the_forward_allocates_beyond_its_output_and_saved_data(name):
    forwards = _stages_against_autograd(name, forward=True)
    assert len(forwards) > 5
    assert [row for row in forwards if row[1] != row[2]] == [], forwards


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
    """``nn.Identity`` and dropout with p = 0 return the very tensor they got: no backward, no buffer;
    an in-place ReLU's backward writes a new one."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Identity(),
        torch.nn.Dropout(p=0.0), torch.nn.ReLU(inplace=True), torch.nn.Conv2d(8, 8, 3, padding=1),
    )
    rows = _stages_against_autograd(model)
    _exact(rows)
    conv_output = 2 * 8 * 64 * 64 * 4
    assert max(ex for _, ex, _, _ in rows) == conv_output


def test_a_broadcast_product_holds_the_operands_gradient_at_the_results_size_until_autograd_sums_it():
    """Squeeze-and-excitation, ``s * h`` with ``s`` of shape (B, C, 1, 1): the product's backward makes
    ``s``'s gradient as ``grad * h``, of h's size, and the engine sums it down only after the node
    returned both gradients; RegNet-Y's blocks do so beside two more of h's size (the product's own
    gradient and h's)."""
    rows = _stages_against_autograd("regnet_y_400mf")
    _exact(rows)
    name, ex, y, real = next(r for r in rows if r[0] == "trunk_output.block3.block3-1")
    h, s = 2 * 208 * 4 * 4 * 4, 2 * 208 * 4  # batch 2, 208 channels at 4x4 (a 64x64 input), float32
    assert ex == 3 * h + s


class _InsideOneNode(torch.nn.Module):
    """What one node's backward allocates inside itself, which a model of the graph's nodes did not see:
    a division's divisor (its gradient ``-grad * ((h / d) / d)`` passes through result-sized
    temporaries), an in-place product written as a statement (``h.mul_(s)``, its result unused), and
    a normalisation by ``rsqrt`` of a mean of squares (``pow``'s and ``rsqrt``'s backward formulas)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        h = self.b(self.a(x))
        if self.kind == "divide":
            h = h / (h.mean((2, 3), keepdim=True) + 1)
        elif self.kind == "in-place-statement":
            s = torch.sigmoid(h.mean((2, 3), keepdim=True))
            h = h * 1.0
            h.mul_(s)
        else:
            h = h * torch.rsqrt(h.pow(2).mean((2, 3), keepdim=True) + 1e-5)
        return self.c(h)


@pytest.mark.parametrize("kind, results", [("divide", 3), ("in-place-statement", 2), ("rms-norm", 4)])
def test_what_one_nodes_backward_allocates_inside_itself_is_workspace(kind, results):
    """The replay of the graph had 2, 0 and 2 result-sized buffers where autograd allocates 3, 2 and 4
    beyond y_i: each of these stages' real peaks was above its bracket."""
    rows = _stages_against_autograd(_InsideOneNode(kind))
    _exact(rows)
    h = 2 * 8 * 64 * 64 * 4
    assert max(ex for _, ex, _, _ in rows) == results * h


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
    _exact(rows)
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


def test_a_gradient_handed_on_as_y_i_counts_the_whole_buffer_it_lies_in():
    """cat([x, constant]) gives x a slice of its gradient, and that slice keeps the whole buffer
    allocated until the previous stage's backward has used it: |y_i| is the buffer, twice x's size
    (it was x's size, and B_{i-1} undercounted by the other half: ViT's class token, 24,576 bytes at
    batch 8). A stage input made a leaf would copy the slice into a contiguous ``.grad`` of its own,
    which a chain's previous stage never does: the profilers, like the torch executor, take y_i
    through ``StageEntry`` as it arrives."""
    model = _ConcatenatesAConstant()
    rows = _stages_against_autograd(model)
    _exact(rows)
    name, ex, y, real = rows[-1]
    x_bytes = 2 * 8 * 64 * 64 * 4  # the stage input: conv a's output at batch 2
    assert ex == 0 and y == real == 2 * x_bytes


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
                 for product in _LayerScale.PRODUCTS]  # (model, ex^B)


@pytest.mark.parametrize("model, real", [(_LearnedBias, 8 * 64 * 64 * 4), (_ViewedBias, 0),
                                         (_ExpandedScale, 2 * 2 * 8 * 64 * 64 * 4),
                                         (_BroadcastScale, 2 * 2 * 8 * 64 * 64 * 4),
                                         *((m, 2 * 8 * 64 * 64 * 4 + ex) for m, ex in _LAYER_SCALES)],
                         ids=["tanh-of-parameter", "view-of-parameter", "expanded-parameter", "broadcast-parameter",
                              *(f"layer-scale-{p}" for p in _LayerScale.PRODUCTS)])
def test_a_tensor_made_from_a_parameter_gets_a_gradient_buffer_in_the_backward(model, real):
    """tanh(b)'s gradient (8x64x64 floats, summed over the batch into a new buffer) is allocated in the
    stage's backward, beside no y_i of its own: the addition hands y_{i+1} on as y_i, so the chain
    model's y_i covers it (ex^B = 0). A view of b is b: the summed gradient becomes b.grad, which the
    weights count. An expanded view is not: its gradient has the batch's size, beside y_i (ex^B = h).
    Broadcast without ``expand_as`` (a layer scale, ConvNeXt's parameter read without a view, spelt
    ``torch.multiply``, or in half precision), the product makes the parameter's gradient at h's size
    first too, summed in the product's dtype before the cast to half."""
    rows = _stages_against_autograd(model())
    _exact(rows)
    assert rows[0][3] == real, rows
