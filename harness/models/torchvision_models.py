"""Every torchvision classification model, by name: ``torchvision:resnet50``, ``torchvision:vit_b_16``.

Models are built from their constructors with random weights (no download). Where the
architecture depends on the image size (the vision transformers, MaxViT) the size is
passed to the constructor; GoogLeNet and Inception v3 are built without their auxiliary
classifiers so that the model returns one tensor in training mode.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Sequence

from harness.models.build import image_batch, on_device, prepare
from harness.protocols import Workload

PREFIX = "torchvision:"

# Smallest square input (pixels) each family accepts; others: 32.
_MIN_SIZE = {"inception_v3": 75, "maxvit_t": 224}


@cache
def _names() -> tuple[str, ...]:
    import torchvision

    return tuple(sorted(torchvision.models.list_models(module=torchvision.models)))


def constructor_kwargs(arch: str, input_size: tuple[int, ...]) -> dict[str, Any]:
    """The keyword arguments ``torchvision.models.get_model(arch, ...)`` needs for this input."""
    kwargs: dict[str, Any] = {"weights": None}
    h, w = input_size[-2], input_size[-1]
    if arch in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=False, init_weights=True)
    if arch.startswith("vit_"):
        if h != w:
            raise ValueError(f"{arch} needs a square input, got {h}x{w}")
        patch = int(arch.rsplit("_", 1)[1])
        if h % patch:
            raise ValueError(f"{arch} needs an input size divisible by its patch size {patch}, got {h}")
        kwargs["image_size"] = h
    if arch == "maxvit_t":
        if h % 224 or w % 224:
            raise ValueError(f"maxvit_t needs input sizes that are multiples of 224, got {h}x{w}")
        kwargs["input_size"] = (h, w)
    minimum = _MIN_SIZE.get(arch, 32)
    if min(h, w) < minimum:
        raise ValueError(f"{arch} needs inputs of at least {minimum}x{minimum} pixels, got {h}x{w}")
    return kwargs


class TorchvisionModels:
    """Model factory for ``torchvision:<name>``: every model of ``torchvision.models.list_models``."""

    name = "torchvision"
    description = "every torchvision classification model (random weights), e.g. torchvision:resnet50"

    def names(self) -> Sequence[str]:
        """``torchvision:<arch>`` for every classification architecture torchvision lists."""
        return [PREFIX + n for n in _names()]

    def default_input_size(self, model: str) -> tuple[int, ...]:
        """ImageNet's 3x224x224 (3x299x299 for Inception v3)."""
        return (3, 299, 299) if model == PREFIX + "inception_v3" else (3, 224, 224)

    def check_input_size(self, model: str, size: Sequence[int]) -> str | None:
        """What is wrong with ``size`` for ``model`` (None: nothing): an image is [C, H, W]."""
        if len(size) != 3:
            return f"{model} takes images: input_size [C, H, W], got {list(size)}"
        return None

    def build(self, workload: Workload, device: Any = "cpu") -> tuple[Any, Any]:
        """The model in training mode on ``device`` and a random batch of images for it."""
        import torchvision

        arch = workload.model.removeprefix(PREFIX)
        if arch not in _names():
            raise ValueError(f"torchvision has no classification model {arch!r}")
        wrong = self.check_input_size(workload.model, workload.input_size)
        if wrong:
            raise ValueError(wrong)
        kwargs = constructor_kwargs(arch, tuple(workload.input_size))
        model = on_device(lambda: torchvision.models.get_model(arch, **kwargs), device)
        model = prepare(model, device, workload.dtype)
        return model, image_batch(workload.batch_size, tuple(workload.input_size), device, workload.dtype)
