"""Tiny built-in models for fast tests: ``builtin:tiny-cnn`` and ``builtin:mlp``.

Small enough to profile for real on a CPU in well under a second, yet with the shapes
the chain extraction must handle: a plain sequence of layers, an in-place ReLU, a
residual block (a non-linear part that becomes one stage) and a flatten (a view).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from harness.models.build import image_batch, on_device, prepare
from harness.protocols import Workload


class _Residual(nn.Module):
    """conv-bn-relu-conv-bn plus the input, then ReLU: the basic block of ResNet."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """relu(bn2(conv2(relu(bn1(conv1(x))))) + x)."""
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + x)


class TinyCNN(nn.Module):
    """A small CNN: conv-bn-relu-pool, a residual block, conv-relu-pool, a linear classifier."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU(inplace=True)
        self.pool1 = nn.MaxPool2d(2)
        self.block = _Residual(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(8 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of images."""
        x = self.pool1(self.relu1(self.bn1(self.conv1(x))))
        x = self.block(x)
        x = self.pool2(self.relu2(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


class MLP(nn.Module):
    """Flatten, then three Linear layers with ReLUs and a dropout."""

    def __init__(self, in_features: int, hidden: int = 64, num_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.act2 = nn.ReLU()
        self.drop = nn.Dropout(0.1)
        self.fc3 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of inputs of any shape (flattened)."""
        x = x.flatten(1)
        return self.fc3(self.drop(self.act2(self.fc2(self.act1(self.fc1(x))))))


_MODELS = {"builtin:tiny-cnn": "a 9-layer CNN with a residual block", "builtin:mlp": "a 3-layer perceptron"}


class BuiltinModels:
    """Model factory for the tiny test models ``builtin:tiny-cnn`` and ``builtin:mlp``."""

    name = "builtin"
    description = "tiny test models: builtin:tiny-cnn (CNN with a residual block), builtin:mlp"

    def names(self) -> Sequence[str]:
        """The two built-in model names."""
        return list(_MODELS)

    def default_input_size(self, model: str) -> tuple[int, ...]:
        """3x32x32 images (CIFAR-sized) for both."""
        return (3, 32, 32)

    def check_input_size(self, model: str, size: Sequence[int]) -> str | None:
        """What is wrong with ``size`` for ``model`` (None: nothing): tiny-cnn takes images of at least 4x4,
        the MLP any shape (it flattens it)."""
        if model == "builtin:tiny-cnn" and (len(size) != 3 or min(size[1:]) < 4):
            return f"builtin:tiny-cnn takes images [C, H, W] of at least 4x4, got {list(size)}"
        return None

    def build(self, workload: Workload, device: Any = "cpu") -> tuple[Any, Any]:
        """The model in training mode on ``device`` and a random input batch for it."""
        size = tuple(workload.input_size)
        if workload.model == "builtin:tiny-cnn":
            wrong = self.check_input_size(workload.model, size)
            if wrong:
                raise ValueError(wrong)
            model = on_device(lambda: TinyCNN(in_channels=size[0]), device)
        elif workload.model == "builtin:mlp":
            model = on_device(lambda: MLP(int(torch.Size(size).numel())), device)
        else:
            raise ValueError(f"no built-in model {workload.model!r}; choose from {', '.join(_MODELS)}")
        model = prepare(model, device, workload.dtype)
        return model, image_batch(workload.batch_size, size, device, workload.dtype)
