"""Fast paths for the few aten operations whose ``meta`` kernels are slow Python decompositions.

On the meta device, batch norm (forward and backward) and some pointwise operations run
PyTorch's Python reference implementations, dozens of dispatcher calls each; in
ResNet-152 they are two thirds of the analytic profiler's time. ``MetaFastPaths``
answers them directly with empty tensors of the right shape, dtype and layout, and
leaves every other operation (and every operation on a real device) untouched. The
results are what the real kernels return in size, so sizes stay exact.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _all_meta(args: tuple, kwargs: dict) -> bool:
    return all(a.device.type == "meta" for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    n = x.shape[1] if training else 0
    stats = {"dtype": _acc(x.dtype), "device": x.device}
    return torch.empty_like(x), torch.empty((n,), **stats), torch.empty((n,), **stats)


def _batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, mask):
    c = x.shape[1]
    dtype = weight.dtype if weight is not None else x.dtype
    return (
        torch.empty_like(x) if mask[0] else None,
        torch.empty((c,), dtype=dtype, device=x.device) if mask[1] else None,
        torch.empty((c,), dtype=dtype, device=x.device) if mask[2] else None,
    )


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t`` fills its memory exactly in some order of its dimensions (no gaps, no overlap)."""
    expected = 1
    dims = sorted(((n, s) for n, s in zip(t.shape, t.stride()) if n > 1), key=lambda p: p[1])
    for size, stride in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _descending(t: torch.Tensor) -> bool:
    """Whether the strides of ``t`` decrease with the dimension (its elements lie in row-major order)."""
    strides = [s for s, n in zip(t.stride(), t.shape) if n > 1]
    return strides == sorted(strides, reverse=True)


def _pointwise(a, b, *rest, **kwargs):
    """Same-shape, same-dtype floating operands: a fresh tensor laid out as TensorIterator would."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.dtype == b.dtype and a.is_floating_point()):
        return NotImplemented
    if a.stride() == b.stride() and _dense(a):
        return torch.empty_like(a)
    if _descending(a) and _descending(b):
        return torch.empty(a.shape, dtype=a.dtype, device=a.device)
    return NotImplemented


def _like(t: torch.Tensor, dtype: torch.dtype | None = None) -> Any:
    """A fresh floating tensor with the layout of ``t`` if it is dense (NotImplemented otherwise)."""
    if not t.is_floating_point() or not _dense(t):
        return NotImplemented
    return torch.empty_like(t, dtype=dtype)


def _unary(x, *args, **kwargs):
    return _like(x) if isinstance(x, torch.Tensor) else NotImplemented


def _softmax(x, dim, *args, **kwargs):
    if not x.is_contiguous():
        return NotImplemented
    dtype = kwargs.get("dtype") or (args[0] if args and isinstance(args[0], torch.dtype) else None)
    if args and args[0] is True:  # _softmax(half_to_float=True)
        dtype = torch.float32
    return torch.empty(x.shape, dtype=dtype or x.dtype, device=x.device)


def _softmax_backward(grad, output, dim, input_dtype):
    if not grad.is_contiguous():
        return NotImplemented
    return torch.empty(grad.shape, dtype=input_dtype, device=grad.device)


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer norm: contiguous result (as the CPU and CUDA kernels), per-row statistics."""
    if not x.is_floating_point():
        return NotImplemented
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    axis = x.dim() - len(normalized_shape)
    stats_shape = list(x.shape[:axis]) + [1] * len(normalized_shape)
    stats = {"dtype": _acc(x.dtype), "device": x.device}
    return out, torch.empty(stats_shape, **stats), torch.empty(stats_shape, **stats)


def _layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, mask):
    gx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if mask[0] else None
    return (
        gx,
        torch.empty_like(weight) if mask[1] and weight is not None else None,
        torch.empty_like(bias) if mask[2] and bias is not None else None,
    )


def _cat(tensors, dim=0):
    """Concatenation of contiguous same-dtype tensors: a contiguous result."""
    tensors = [t for t in tensors if not (t.dim() == 1 and t.numel() == 0)]
    if not tensors or any(t.dtype != tensors[0].dtype or t.dim() != tensors[0].dim() or not t.is_contiguous()
                          for t in tensors):
        return NotImplemented
    dim = dim % tensors[0].dim()
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    return torch.empty(shape, dtype=tensors[0].dtype, device=tensors[0].device)


def _in_place(self, *args, **kwargs):
    """An in-place fill or update of a meta tensor (weight initialisation): nothing to compute."""
    return self


_FAST: dict[Any, Callable[..., Any]] = {
    _aten.native_batch_norm.default: _batch_norm,
    _aten.native_batch_norm_backward.default: _batch_norm_backward,
    _aten.threshold_backward.default: _pointwise,
    _aten.add.Tensor: _pointwise,
    _aten.mul.Tensor: _pointwise,
    _aten.sub.Tensor: _pointwise,
    _aten.cat.default: _cat,
    _aten.div.Tensor: _pointwise,
    **{op: _pointwise for op in (
        _aten.gelu_backward.default, _aten.sigmoid_backward.default, _aten.tanh_backward.default,
        _aten.silu_backward.default, _aten.hardswish_backward.default,
    )},
    **{op: _unary for op in (
        _aten.gelu.default, _aten.sigmoid.default, _aten.tanh.default, _aten.silu.default, _aten.relu.default,
        _aten.hardswish.default, _aten.mul.Scalar, _aten.div.Scalar, _aten.clamp_min.default,
    )},
    _aten.native_layer_norm.default: _layer_norm,
    _aten.native_layer_norm_backward.default: _layer_norm_backward,
    _aten._softmax.default: _softmax,
    _aten._safe_softmax.default: _softmax,
    _aten._softmax_backward_data.default: _softmax_backward,
    **{op: _in_place for op in (
        _aten.normal_.default, _aten.uniform_.default, _aten.zero_.default, _aten.fill_.Scalar,
        _aten.fill_.Tensor, _aten.erfinv_.default, _aten.clamp_.default, _aten.mul_.Scalar, _aten.mul_.Tensor,
        _aten.add_.Scalar, _aten.add_.Tensor, _aten.sub_.Tensor, _aten.div_.Scalar, _aten.div_.Tensor,
        _aten.bernoulli_.float, _aten.exponential_.default, _aten.random_.default, _aten.copy_.default,
        _aten.relu_.default,
    )},
}


class MetaFastPaths(TorchDispatchMode):
    """Answers slow meta kernels (batch norm, same-layout pointwise ops) with empty results."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        fast = _FAST.get(func)
        if fast is not None and _all_meta(args, kwargs):
            out = fast(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


_SDPA = F.scaled_dot_product_attention


def _attention(query, key, value, *args, **kwargs):
    """``scaled_dot_product_attention`` on meta with the fused kernel a CPU would pick.

    On meta, PyTorch always takes the unfused "math" path, which saves the attention
    matrix; real devices use a fused kernel that saves only the output and the
    log-sum-exp. When the CPU's own backend choice (asked with data-free stand-ins of the
    same shapes) is flash attention, the meta run calls that kernel, so sizes agree with
    a CPU run and are close to what CUDA's fused kernels keep.
    """
    out = _fused_attention(query, key, value, *args, **kwargs)
    return _SDPA(query, key, value, *args, **kwargs) if out is NotImplemented else out


def _stand_in(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    base = torch.empty(t.shape[-1] if t.dim() else 1, dtype=t.dtype, requires_grad=t.requires_grad)
    return base.expand(t.shape) if t.dim() else base[0]


def _fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    tensors = [t for t in (query, key, value, attn_mask) if isinstance(t, torch.Tensor)]
    if enable_gqa or not all(t.device.type == "meta" for t in tensors):
        return NotImplemented
    choice = torch._fused_sdp_choice(_stand_in(query), _stand_in(key), _stand_in(value),
                                     attn_mask=_stand_in(attn_mask), dropout_p=dropout_p,
                                     is_causal=is_causal, scale=scale)
    if choice != SDPBackend.FLASH_ATTENTION.value:
        return NotImplemented
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


@contextmanager
def meta_modes(active: bool = True) -> Iterator[None]:
    """While active: ``MetaFastPaths``, and ``F.scaled_dot_product_attention`` as ``_attention``.

    The function is swapped in ``torch.nn.functional`` (where ``nn.MultiheadAttention``
    finds it); graph nodes that call it look it up there too (``harness.chain.graph``).
    """
    if not active:
        yield
        return
    F.scaled_dot_product_attention = _attention
    try:
        with MetaFastPaths():
            yield
    finally:
        F.scaled_dot_product_attention = _SDPA
