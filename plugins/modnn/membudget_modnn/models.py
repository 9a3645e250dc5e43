"""The two networks of papers/000 section V that torchvision does not have: VGG-101 and an FCN.

- ``modnn:vgg101``: "created by increasing the CONV layers of VGG-19" (section V). The
  paper gives no layout; here VGG-19's five blocks of (2, 2, 4, 4, 4) convolutions are
  scaled to (12, 12, 24, 25, 25), 98 convolutions, which with the three fully connected
  layers make 101 weight layers (torchvision's ``VGG`` with ``make_layers``).
- ``modnn:fcn32s``: the fully convolutional network of Long et al. [25] in its FCN-32s
  form: VGG-16's convolutions, fc6/fc7 as 7x7 and 1x1 convolutions, a 1x1 scoring layer
  for 21 classes (PASCAL VOC) and a stride-32 transposed convolution back to the input
  size (inputs a multiple of 32; the original's 100-pixel padding and crop, and its
  dropout, are left out so that the network is a plain chain).
"""

from __future__ import annotations

from typing import Any, Sequence

from harness.protocols import Workload

VGG101 = "modnn:vgg101"
FCN32S = "modnn:fcn32s"
VGG101_BLOCKS = (12, 12, 24, 25, 25)
_WIDTHS = (64, 128, 256, 512, 512)


def vgg101_config() -> list:
    """torchvision ``make_layers`` configuration of VGG-101: the widths repeated, "M" for max pooling."""
    cfg: list = []
    for width, repeat in zip(_WIDTHS, VGG101_BLOCKS):
        cfg += [width] * repeat + ["M"]
    return cfg


def _vgg101(num_classes: int = 1000):
    from torchvision.models.vgg import VGG, make_layers

    return VGG(make_layers(vgg101_config()), num_classes=num_classes, init_weights=False)


def _fcn32s(in_channels: int = 3, num_classes: int = 21):
    from torch import nn
    from torchvision.models.vgg import make_layers

    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    features = make_layers(cfg)
    if in_channels != 3:
        features[0] = nn.Conv2d(in_channels, 64, 3, padding=1)
    return nn.Sequential(
        features,
        nn.Conv2d(512, 4096, 7, padding=3), nn.ReLU(inplace=True),
        nn.Conv2d(4096, 4096, 1), nn.ReLU(inplace=True),
        nn.Conv2d(4096, num_classes, 1),
        nn.ConvTranspose2d(num_classes, num_classes, 64, stride=32, padding=16, bias=False),
    )


class ModnnModels:
    """Model factory for ``modnn:vgg101`` and ``modnn:fcn32s`` (papers/000 section V)."""

    name = "modnn"
    description = "papers/000's extra networks: modnn:vgg101 (VGG-19 with 98 convolutions), modnn:fcn32s (FCN-32s)"

    def names(self) -> Sequence[str]:
        """The two model names."""
        return [VGG101, FCN32S]

    def default_input_size(self, model: str) -> tuple[int, ...]:
        """ImageNet-sized 3x224x224 for both."""
        return (3, 224, 224)

    def build(self, workload: Workload, device: Any = "cpu") -> tuple[Any, Any]:
        """The model in training mode on ``device`` and a random input batch for it."""
        from harness.models.build import image_batch, on_device, prepare

        size = tuple(workload.input_size)
        if len(size) != 3:
            raise ValueError(f"{workload.model} takes images [C, H, W], got {list(size)}")
        if workload.model == VGG101:
            if min(size[1:]) < 32:
                raise ValueError(f"{VGG101} needs images of at least 32x32, got {list(size)}")
            model = on_device(_vgg101, device)
        elif workload.model == FCN32S:
            if size[1] % 32 or size[2] % 32:
                raise ValueError(f"{FCN32S} needs image sides that are multiples of 32, got {list(size)}")
            model = on_device(lambda: _fcn32s(size[0]), device)
        else:
            raise ValueError(f"no moDNN model {workload.model!r}; choose from {VGG101}, {FCN32S}")
        model = prepare(model, device, workload.dtype)
        return model, image_batch(workload.batch_size, size, device, workload.dtype)
