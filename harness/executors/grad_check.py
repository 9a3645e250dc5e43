"""Did a schedule train the same network? Its gradients against the unmodified model's (issue #16).

The reference is the plain model run forward and backward on the same fixed batch, split
into the schedule's sub-batches and accumulated (gradient accumulation is what a
sub-batching schedule does), with the same seed and output gradient as the executor's
iterations. The check reports one number per run: the largest, over the parameters, of
max |g - g_ref| / max |g_ref|.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch

from harness.executors._torch_chain import TorchChain, output_gradient


def reference_gradients(chain: TorchChain, sub_batches: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Gradients of the plain model: forward and backward of each sub-batch, accumulated."""
    model = chain.model
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    grads = None
    for k, x in enumerate(torch.tensor_split(chain.example, sub_batches)):
        out = model(x.clone())
        if grads is None:
            full = output_gradient((chain.example.shape[0], *out.shape[1:]), out.dtype, seed)
            grads = torch.tensor_split(full, sub_batches)
        out.backward(grads[k])
    result = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    for p in model.parameters():
        p.grad = None
    return result


def largest_relative_error(got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> float:
    """max over parameters of max |got - expected| / max |expected|; inf when a gradient is missing."""
    if set(got) != set(expected):
        return math.inf
    worst = 0.0
    for name, ref in expected.items():
        scale = float(ref.abs().max())
        diff = float((got[name].to(ref.dtype) - ref).abs().max())
        worst = max(worst, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
    return worst


def gradient_error(chain: TorchChain, sub_batches: int, seed: int = 0) -> float:
    """The error of the gradients the chain's model holds now (a schedule's last iteration); the
    model keeps them afterwards, as the schedule left them."""
    params = dict(chain.model.named_parameters())
    got = {n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None}
    error = largest_relative_error(got, reference_gradients(chain, sub_batches, seed))
    for name, grad in got.items():
        params[name].grad = grad
    return error
