"""Helpers every model factory shares, the built-in ones and a plugin's: where parameters are created,
dtypes, example inputs (``on_device``, ``prepare``, ``image_batch``, ``token_batch``).

The analytic profiler builds models on PyTorch's ``meta`` device, where tensors have a
shape and a dtype but no data, so that ResNet-152 at batch 256 with 1000x1000 images
costs nothing to "allocate". Most constructors run fine under ``torch.device("meta")``;
a few (torchvision's RegNets) compute their layer widths with tensors and need real
data while they do. ``on_device`` handles both: it tries the device context and, for
``meta``, falls back to building on the CPU while every parameter and buffer is moved
to ``meta`` the moment it is registered, so no full-size CPU copy ever exists.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

import torch
from torch import nn

from harness.models.dtypes import DTYPE_NAMES, unknown_dtype

_DTYPES = {name: getattr(torch, attr) for name, attr in DTYPE_NAMES.items()}


def torch_dtype(name: str) -> torch.dtype:
    """The ``torch.dtype`` for a workload's dtype name (``float32``, ``float16``, ``bfloat16``)."""
    complaint = unknown_dtype(name)
    if complaint:
        raise ValueError(complaint)
    return _DTYPES[name.lower()]


@contextmanager
def _params_to_meta() -> Iterator[None]:
    """While active, every parameter and buffer a module registers is moved to ``meta``."""
    register_parameter = nn.Module.register_parameter
    register_buffer = nn.Module.register_buffer

    def param(self: nn.Module, name: str, p: Any) -> None:
        if p is not None and p.device.type != "meta":
            p = nn.Parameter(p.detach().to("meta"), requires_grad=p.requires_grad)
        register_parameter(self, name, p)

    def buffer(self: nn.Module, name: str, b: Any, persistent: bool = True) -> None:
        if b is not None and b.device.type != "meta":
            b = b.to("meta")
        register_buffer(self, name, b, persistent)

    nn.Module.register_parameter = param  # type: ignore[method-assign]
    nn.Module.register_buffer = buffer  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
        nn.Module.register_buffer = register_buffer  # type: ignore[method-assign]


def on_device(construct: Callable[[], nn.Module], device: Any) -> nn.Module:
    """Call ``construct()`` so that the module's parameters are created on ``device``.

    For ``meta`` no parameter data is ever allocated (see the module docstring).
    """
    device = torch.device(device)
    from harness.chain.metafast import MetaFastPaths

    try:
        with device, MetaFastPaths() if device.type == "meta" else nullcontext():
            return construct()
    except (NotImplementedError, RuntimeError):
        if device.type != "meta":
            raise
    with _params_to_meta():
        return construct()


def prepare(model: nn.Module, device: Any, dtype: str) -> nn.Module:
    """Put ``model`` on ``device`` in ``dtype``, in training mode (profiles describe training)."""
    model = model.to(device=torch.device(device), dtype=torch_dtype(dtype))
    return model.train()


def image_batch(batch: int, input_size: tuple[int, ...], device: Any, dtype: str) -> torch.Tensor:
    """A random image batch ``(batch, *input_size)``; on ``meta`` nothing is allocated."""
    return torch.randn(batch, *input_size, device=torch.device(device), dtype=torch_dtype(dtype))


def token_batch(batch: int, seq_len: int, vocab_size: int, device: Any) -> torch.Tensor:
    """A random batch of token ids ``(batch, seq_len)`` (int64) for a language model: its workload's
    ``input_size`` is ``[seq_len]``; on ``meta`` nothing is allocated."""
    return torch.randint(0, vocab_size, (batch, seq_len), device=torch.device(device))
