"""Did a schedule train the same network? Its gradients against the unmodified model's (issue #16).

The reference is the plain model run forward and backward on the same fixed batch, split
into the schedule's sub-batches and accumulated (gradient accumulation is what a
sub-batching schedule does), with the same seed and output gradient as the executor's
iterations. The check reports one number per run: the largest, over the parameters, of
max |g - g_ref| / max |g_ref|, the scale floored at 1e-3 of the model's largest gradient
(``largest_relative_error``). Where the unmodified model does not fit the device, there is
no reference: the run keeps its row, without ``grad_error``, and its message says so.

A suite's runs on one model all compare against the same pass: ``ReferenceCache`` keeps its
gradients on the host per sub-batch count and seed while the weights are unchanged, so that the
device runs the unmodified model once rather than once a case (a keep-all iteration, an eighth
of a seven-iteration keep-all case).
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Mapping

import torch

from harness.chain.graph import tensors_in
from harness.errors import ProfilingError
from harness.executors._torch_chain import TorchChain, output_gradient


def reference_gradients(chain: TorchChain, sub_batches: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Gradients of the plain model: forward and backward of each sub-batch, accumulated."""
    model = chain.model
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    grads = None
    # the batch and the output gradient live on the host (TorchChain.example); the model on chain.device
    for k, x in enumerate(torch.tensor_split(chain.example, sub_batches)):
        out = _the_tensor(model(x.to(chain.device, copy=True)))
        if grads is None:
            full = output_gradient((chain.example.shape[0], *out.shape[1:]), out.dtype, seed)
            grads = torch.tensor_split(full, sub_batches)
        out.backward(grads[k].to(out.device))
    # no copies: the gradients leave the parameters, which accumulate into none of them again
    result = {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}
    for p in model.parameters():
        p.grad = None
    return result


def _the_tensor(output: Any) -> torch.Tensor:
    """The one tensor a model returns, also from a tuple or dict around it (``(logits,)``), as the
    chain reads it (``harness.chain.graph.Graph.returned_index``)."""
    tensors = tensors_in(output)
    if len(tensors) != 1:
        raise ProfilingError(f"the model returns {len(tensors)} tensors; the gradient check needs one")
    return tensors[0]


SCALE_FLOOR = 1e-3  # of the model's largest gradient: the least scale a parameter is judged against


def largest_relative_error(got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> float:
    """max over parameters p of max |got_p - expected_p| / max(max |expected_p|, SCALE_FLOOR * G), G the
    largest |expected| of all; inf when a gradient is missing or not finite. ``expected`` may live on
    another device than ``got`` (a reference kept on the host): each parameter's is moved to ``got``'s.

    The floor keeps a parameter whose true gradient is zero (a convolution's bias before a batch
    norm) from being judged against its own rounding noise: there another algorithm's rounding
    (1e-9) over the reference's (1e-9) read as an error of 1.
    """
    if set(got) != set(expected):
        return math.inf
    measured = []  # per parameter (max |expected|, max |got - expected|), each reference moved once
    for name, ref in expected.items():
        value = got[name].to(ref.dtype)
        ref = ref.to(value.device)
        measured.append((float(ref.abs().max()), float((value - ref).abs().max())))
    floor = SCALE_FLOOR * max((scale for scale, _ in measured), default=0.0)
    worst = 0.0
    for scale, diff in measured:
        if not math.isfinite(diff):
            return math.inf
        scale = max(scale, floor)
        worst = max(worst, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
    return worst


class ReferenceCache:
    """The reference gradients of one chain, on the host, per sub-batch count and seed, for as long as
    its weights are those they were computed with (every parameter's version counter unchanged: an
    in-place update, an optimizer's step, computes them again). Another chain empties it."""

    def __init__(self) -> None:
        self._chain: weakref.ref[TorchChain] | None = None  # weak: the cache never keeps a model on the device
        self._kept: dict[tuple[int, int], tuple[tuple[int, ...], dict[str, torch.Tensor]]] = {}

    def get(self, chain: TorchChain, sub_batches: int, seed: int) -> dict[str, torch.Tensor]:
        """The reference for ``chain``: the kept one, else ``reference_gradients`` (whose failure, an
        out-of-memory error among them, leaves nothing kept)."""
        if self._chain is None or self._chain() is not chain:
            self.clear()
            self._chain = weakref.ref(chain)
        versions = tuple(p._version for p in chain.model.parameters())
        kept = self._kept.get((sub_batches, seed))
        if kept is None or kept[0] != versions:
            grads = {n: g.to("cpu") for n, g in reference_gradients(chain, sub_batches, seed).items()}
            kept = self._kept[(sub_batches, seed)] = (versions, grads)
        return kept[1]

    def clear(self) -> None:
        """Forget every reference (the executor's chain is about to be replaced)."""
        self._chain, self._kept = None, {}


def gradient_error(chain: TorchChain, sub_batches: int, seed: int = 0, cache: ReferenceCache | None = None) -> float:
    """The error of the gradients the chain's model holds now (a schedule's last iteration); the
    model keeps them afterwards, as the schedule left them, also when the reference fails. With
    ``cache``, the reference is the one it keeps for the chain, if any.

    Raises ``torch.OutOfMemoryError`` when the unmodified model does not fit the device: the
    case a memory-saving schedule exists for (the torch executor then reports no error).
    """
    params = dict(chain.model.named_parameters())
    # no copies (the device may have no room for one): the reference pass starts from no gradients, so it
    # leaves these alone, and they go back to the parameters afterwards
    got = {n: p.grad.detach() for n, p in params.items() if p.grad is not None}
    try:
        expected = (cache.get(chain, sub_batches, seed) if cache is not None
                    else reference_gradients(chain, sub_batches, seed))
        return largest_relative_error(got, expected)
    finally:
        for p in params.values():
            p.grad = None
        for name, grad in got.items():
            params[name].grad = grad
