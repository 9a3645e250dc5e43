"""Synthetic chains in the shapes of the papers' networks, for tests and examples.

The layer shapes are the published ones (AlexNet, VGG-16, Network-in-Network for a chain
with 1x1 convolutions, and ResNet with one stage per bottleneck block as papers/004 section
6.1 groups it); sizes are float32 tensor sizes (a block's saved bytes are its input plus
two tensors per convolution, the convolution and normalisation outputs). Times come from a
plain roofline on a device with a fixed efficiency: GTX 970-like by default (papers/001
section 5.1.2: 3.5 TFLOPS, 224 GB/s, PCIe gen3 at the 12.8 GB/s cudaMemcpy average of
section 3.1), or V100-like (papers/004 section 6.1: 12.2 GB/s measured), so they are
estimates of the right order, not measurements. CONV layers get three
algorithms in the cuDNN mould: implicit GEMM (no workspace, slowest, listed first: the
memory-optimal one), precomputed GEMM and a fast transform (the default, as a framework
picks the fastest when memory is plentiful).

Every layer is one stage whose saved data is its input (the X that vDNN offloads).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.model import Algorithm, Profile, Stage

FLOAT = 4


@dataclass(frozen=True)
class Device:
    """Roofline figures: sustained FLOP/s, memory bytes/s, host link bytes/s, memory size."""

    name: str
    flops: float
    memory_bw: float
    pcie: float
    memory: int


GTX970 = Device("GTX970-like", 3.5e12 * 0.5, 224e9 * 0.7, 12.8e9, 4 * 2**30)
V100 = Device("V100-like", 15.7e12 * 0.5, 900e9 * 0.7, 12.2e9, 16 * 2**30)


@dataclass(frozen=True)
class _Shape:
    c: int
    h: int
    w: int

    @property
    def numel(self) -> int:
        return self.c * self.h * self.w


def _conv_algorithms(fwd: float, bwd: float, out_bytes: int) -> tuple[Algorithm, ...]:
    return (
        Algorithm("implicit_gemm", 1.6 * fwd, 1.6 * bwd, 0, 0),
        Algorithm("precomp_gemm", 1.25 * fwd, 1.25 * bwd, out_bytes // 2, out_bytes // 2),
        Algorithm("winograd", fwd, bwd, 3 * out_bytes // 2, 3 * out_bytes // 2),
    )


@dataclass(frozen=True)
class _Layer:
    """What one spec entry does: its output shape, FLOPs (or bytes touched), parameters, extra saved elements."""

    kind: str
    out: _Shape
    flops: float = 0.0
    moved: float = 0.0
    params: int = 0
    saved_extra: int = 0  # elements saved besides the input


def _layer(entry: tuple, shape: _Shape, batch: int) -> _Layer:
    kind = entry[0]
    if kind == "conv":
        _, out_c, k, stride, pad = entry
        out = _Shape(out_c, (shape.h + 2 * pad - k) // stride + 1, (shape.w + 2 * pad - k) // stride + 1)
        return _Layer("conv", out, flops=2.0 * batch * out.numel * shape.c * k * k,
                      params=out_c * shape.c * k * k + out_c)
    if kind == "block":
        _, mid, stride = entry
        out = _Shape(4 * mid, (shape.h - 1) // stride + 1, (shape.w - 1) // stride + 1)
        pixels = out.h * out.w
        convs = [(shape.c, mid, 1, shape.h * shape.w), (mid, mid, 9, pixels), (mid, out.c, 1, pixels)]
        if stride != 1 or shape.c != out.c:
            convs.append((shape.c, out.c, 1, pixels))  # the downsampling shortcut
        return _Layer("block", out, flops=sum(2.0 * batch * co * px * ci * taps for ci, co, taps, px in convs),
                      params=sum(ci * co * taps for ci, co, taps, _ in convs),
                      saved_extra=sum(2 * co * px for _, co, _, px in convs))
    if kind == "fc":
        out = _Shape(entry[1], 1, 1)
        return _Layer("linear", out, flops=2.0 * batch * shape.numel * out.c, params=shape.numel * out.c + out.c)
    if kind == "pool":
        _, k, stride = entry
        out = _Shape(shape.c, (shape.h - k) // stride + 1, (shape.w - k) // stride + 1) if k else _Shape(shape.c, 1, 1)
        return _Layer("pool", out, moved=(shape.numel + out.numel) * batch * FLOAT)
    return _Layer("act", shape, moved=2 * shape.numel * batch * FLOAT)


def build_chain(model: str, batch: int, spec: list[tuple], input_shape: tuple[int, int, int],
                device: Device = GTX970) -> Profile:
    """A profile from a layer list.

    Entries: ("conv", out, k, stride, pad), ("relu",), ("pool", k, stride) (k = 0: global),
    ("fc", out), ("block", mid, stride) (a ResNet bottleneck with output 4 * mid).
    """
    shape = _Shape(*input_shape)
    stages: list[Stage] = []
    params = 0
    counts: dict[str, int] = {}
    for entry in spec:
        layer = _layer(entry, shape, batch)
        counts[entry[0]] = counts.get(entry[0], 0) + 1
        in_bytes = batch * shape.numel * FLOAT
        fwd = layer.flops / device.flops + layer.moved / device.memory_bw
        algorithms = _conv_algorithms(fwd, 2 * fwd, batch * layer.out.numel * FLOAT) if layer.kind == "conv" else ()
        fastest = algorithms[-1] if algorithms else Algorithm("default", fwd, 2 * fwd)
        stages.append(Stage(
            name=f"{entry[0]}{counts[entry[0]]}", kind=layer.kind,
            fwd_time=fastest.fwd_time, bwd_time=fastest.bwd_time,
            input_bytes=in_bytes, saved_bytes=in_bytes + batch * layer.saved_extra * FLOAT, grad_bytes=in_bytes,
            fwd_workspace=fastest.fwd_workspace, bwd_workspace=fastest.bwd_workspace, algorithms=algorithms,
        ))
        params += layer.params
        shape = layer.out
    return Profile(
        model=model, batch_size=batch, input_shape=input_shape, device=device.name, device_memory=device.memory,
        d2h_bandwidth=device.pcie, h2d_bandwidth=device.pcie, weight_bytes=2 * params * FLOAT,
        output_bytes=batch * shape.numel * FLOAT, stages=tuple(stages), profiler="synthetic",
        notes={"shapes": "the papers' networks, roofline times (membudget_vdnn.shapes)"},
    )


def _conv_relu(*convs: tuple) -> list[tuple]:
    layers: list[tuple] = []
    for conv in convs:
        layers += [("conv", *conv), ("relu",)]
    return layers


def alexnet(batch: int, device: Device = GTX970) -> Profile:
    """AlexNet (227x227 input, LRN left out) as a chain of conv, relu, pool and fc stages."""
    spec = [
        *_conv_relu((96, 11, 4, 0)), ("pool", 3, 2),
        *_conv_relu((256, 5, 1, 2)), ("pool", 3, 2),
        *_conv_relu((384, 3, 1, 1), (384, 3, 1, 1), (256, 3, 1, 1)), ("pool", 3, 2),
        ("fc", 4096), ("relu",), ("fc", 4096), ("relu",), ("fc", 1000),
    ]
    return build_chain("synthetic:alexnet", batch, spec, (3, 227, 227), device)


def vgg16(batch: int, device: Device = GTX970) -> Profile:
    """VGG-16 (224x224 input) as a chain of conv, relu, pool and fc stages."""
    spec: list[tuple] = []
    for width, repeat in ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)):
        spec += _conv_relu(*[(width, 3, 1, 1)] * repeat) + [("pool", 2, 2)]
    spec += [("fc", 4096), ("relu",), ("fc", 4096), ("relu",), ("fc", 1000)]
    return build_chain("synthetic:vgg16", batch, spec, (3, 224, 224), device)


def nin(batch: int, device: Device = GTX970) -> Profile:
    """Network-in-Network (ImageNet): each mlpconv block is a conv and two 1x1 convs, then a pool."""
    spec = [
        *_conv_relu((96, 11, 4, 0), (96, 1, 1, 0), (96, 1, 1, 0)), ("pool", 3, 2),
        *_conv_relu((256, 5, 1, 2), (256, 1, 1, 0), (256, 1, 1, 0)), ("pool", 3, 2),
        *_conv_relu((384, 3, 1, 1), (384, 1, 1, 0), (384, 1, 1, 0)), ("pool", 3, 2),
        *_conv_relu((1024, 3, 1, 1), (1024, 1, 1, 0), (1000, 1, 1, 0)), ("pool", 0, 0),
    ]
    return build_chain("synthetic:nin", batch, spec, (3, 224, 224), device)


def resnet(depth: int, batch: int, image: int = 224, device: Device = V100) -> Profile:
    """ResNet-50/101/152 with one stage per bottleneck block (papers/004 section 6.1's grouping)."""
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}[depth]
    spec: list[tuple] = [*_conv_relu((64, 7, 2, 3)), ("pool", 3, 2)]
    for group, (count, mid) in enumerate(zip(blocks, (64, 128, 256, 512))):
        spec += [("block", mid, 2 if group and not k else 1) for k in range(count)]
    spec += [("pool", 0, 0), ("fc", 1000)]
    return build_chain(f"synthetic:resnet{depth}", batch, spec, (3, image, image), device)


def analytic(model: str, batch: int, device: str, image: int = 224) -> Profile:
    """The real-model counterpart of these shapes: the harness's ``analytic`` profile (needs torch)."""
    from harness.plugins import registry
    from harness.protocols import Workload

    return registry().profiler("analytic").profile(Workload(model, batch, (3, image, image), device))
