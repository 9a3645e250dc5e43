"""The memory a stretch of PyTorch code allocates, seen operator by operator.

``Allocations`` is a dispatch mode. Every storage that an aten operator returns and that
none of its arguments lives in is a new allocation; a finaliser on the storage records
when it is freed. That is what the device's allocator is asked for, on any device the
tensors live on, ``meta`` included (sizes only): the profilers run one stage's forward or
backward under it, so the workspaces ex^F and ex^B of papers/004 section 3.1 are what
autograd really allocates, temporaries inside one node's backward included (a division's
divisor, an attention function, a layout copy of a weight's gradient), instead of a model
of it.

What it does not see is what a kernel allocates for itself without the dispatcher (a
cuDNN or cuBLAS workspace): on CUDA the measured profiler takes peak-memory deltas
instead (``harness.profilers.measured``).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from harness.chain.stages import storage_key


class Allocations(TorchDispatchMode):
    """The storages operators create while the mode is active, in order: each allocation and its free.

    A view or an in-place result lives in an argument's storage and is no allocation; a storage
    made by an operator inside a composite one is seen once, when it is made.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}  # storage key -> the allocation's number, while it lives
        self.events: list[tuple[int, int]] = []  # (allocation number, +bytes when made or -bytes when freed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        out = func(*args, **(kwargs or {}))
        known = {storage_key(a) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key, size = storage._cdata, storage.nbytes()
                if key in self.live or key in known or size == 0:
                    continue
                self.live[key] = number = len(self.events)
                self.events.append((number, size))
                weakref.finalize(storage, self._free, key, number, size)
        return out

    def _free(self, key: int, number: int, size: int) -> None:
        if self.live.get(key) == number:
            del self.live[key]
        self.events.append((number, -size))

    def peak(self, outside: Mapping[int, int] | None = None) -> int:
        """The most bytes alive at once.

        ``outside``: storage key -> bytes of it to leave out, for storages still alive that another
        figure counts (a stage's output, its saved data, the gradient it hands on, the weights'
        gradients). A storage freed before the end is always counted: its key may be reused.
        """
        outside = outside or {}
        # an allocation's number is the index of its event
        left_out = {number: min(outside[key], self.events[number][1]) for key, number in self.live.items()
                    if key in outside}
        now = peak = 0
        for number, size in self.events:
            cut = left_out.get(number, 0)
            now += size - cut if size > 0 else size + cut
            peak = max(peak, now)
        return peak
