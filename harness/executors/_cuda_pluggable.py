"""CUDA glue of the planned path: a RealAddressAllocator as PyTorch's CUDA allocator (issue #18).

Imports on any machine (torch and ctypes only); everything that needs a GPU happens in
:meth:`PluggableAllocator.install` and :class:`CudaRuntime`, which raise
:class:`PlannedPathError` (one line) where they can tell that it cannot work.

How it hooks in (read from torch 2.14's ``torch/cuda/memory.py`` and
``torch/csrc/cuda/CUDAPluggableAllocator.cpp``): two ``ctypes.CFUNCTYPE`` callbacks with the
pluggable allocator's signatures, ``void* alloc(ssize_t size, int device, cudaStream_t
stream)`` and ``void free(void* ptr, ssize_t size, int device, cudaStream_t stream)`` (the
C++ side is ``size_t``; the docstring of ``CUDAPluggableAllocator`` that omits ``device``
from ``free`` is stale), their addresses given to ``torch._C._cuda_customAllocator`` (what
``CUDAPluggableAllocator`` does after ``ctypes.CDLL``, and what torch's own ``_use_uvm``
does with Python callbacks), and the result made the process's allocator with
``torch.cuda.memory.change_current_allocator``.

Why the process's allocator and not a ``torch.cuda.MemPool(allocator=...)`` entered with
``use_mem_pool`` (what issue #18 names): a MemPool keeps the caching allocator between
the program and the pluggable allocator. The caching layer asks the pool's allocator for
*segments* (2 MiB for requests up to 1 MiB, 20 MiB up to 10 MiB, else rounded to 2 MiB),
splits them, and caches freed blocks in the pool; the allocator sees a free only when the
pool's cache is emptied. Planned offsets per tensor are then impossible: after the first
iteration the allocator would hardly be called, and within it every segment lives to the
end. As the process's allocator, the pluggable allocator gets one call per tensor
allocation and one per free (``CUDAPluggableAllocator::malloc`` / ``raw_delete``), which
is papers/003's setting (Chainer's memory hook sees every array). The cost: it must be
installed before CUDA's caching allocator is initialised, so the planned run is a process
of its own (:mod:`harness.executors.planned` starts one), and the caching allocator's
statistics (``max_memory_reserved``, ``reset_peak_memory_stats``) raise there: the
allocator's own figures replace them. The arena and the fallback's blocks come from
``cudaMalloc``/``cudaFree`` of the CUDA runtime torch loaded (ctypes, nothing compiled).

Assumptions no CPU test can check (to confirm on a GPU: the planned tests of ``tests/test_torch_executor_gpu.py``):

1. ``torch._C._cuda_customAllocator`` and ``change_current_allocator`` behave as read
   above in this torch build, and nothing before :meth:`PluggableAllocator.install`
   initialised CUDA (``torch.cuda.is_initialized()`` is checked; a library that
   allocates at import would break it);
2. the CUDA runtime torch uses is a shared library visible in ``/proc/self/maps`` (or
   found under the ``nvidia`` wheels, or by ``ctypes.util.find_library``) whose
   ``cudaMalloc``/``cudaFree``/``cudaStreamSynchronize`` use torch's context;
3. a Python callback runs under the GIL, so the allocator's lock serialises the autograd
   thread and the main thread; an exception inside a callback would return NULL to torch,
   and torch does not check for NULL (``CUDAPluggableAllocator::malloc`` wraps whatever the
   callback returns in a ``DataPtr``; read in its 2.14 source, not seen on a GPU): a kernel
   then writes at address 0 and fails later with an illegal memory access. So every
   callback catches everything and serves the request with ``cudaMalloc`` instead (counted
   in ``errors``); only when that too fails does it return NULL, and when cudaMalloc said
   ``cudaErrorMemoryAllocation`` (not another error, such as the 700 every call returns after
   a kernel's illegal access) it says so in ``out_of_memory``: the planned process turns the
   error that follows into an ``oom`` row with that message (:func:`as_out_of_memory`);
4. streams: the pluggable allocator ignores ``record_stream``, so a planned address freed
   while a side stream (the executor's copy streams) still reads it could be handed out
   again too early. With side streams registered (:meth:`PluggableAllocator.set_streams`),
   every free of an arena block first synchronises the side streams, and an allocation
   requested on a side stream first synchronises the compute stream: correct, at the
   cost of some copy/compute overlap on offloading schedules;
5. 512-byte alignment suffices for every kernel (the caching allocator guarantees 512);
   cudaMalloc's base is 256-aligned at least.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import threading
from typing import Any, Sequence

from harness.errors import MembudgetError

__all__ = ["PlannedPathError", "CudaRuntime", "PluggableAllocator", "ALLOC_FN", "FREE_FN", "as_out_of_memory"]

#: ``void* alloc(ssize_t size, int device, cudaStream_t stream)``
ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
#: ``void free(void* ptr, ssize_t size, int device, cudaStream_t stream)``
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)

#: ``cudaErrorMemoryAllocation``: the one cudaMalloc error that means the device is out of memory
CUDA_ERROR_MEMORY_ALLOCATION = 2

# callbacks and allocators installed in this process: torch may call them until exit
_INSTALLED: list[Any] = []


class PlannedPathError(MembudgetError):
    """The planned path cannot run here (one line, no traceback needed)."""


def find_cudart() -> str:
    """The path of the CUDA runtime library torch loaded (or would load)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if "libcudart.so" in os.path.basename(path):
                    return path
    except OSError:
        pass
    for root in sys.path:
        hits = sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcudart.so*")))
        if hits:
            return hits[-1]
    found = ctypes.util.find_library("cudart")
    if found:
        return found
    raise PlannedPathError("the planned path needs the CUDA runtime (libcudart.so), and none was found")


class CudaRuntime:
    """``cudaMalloc``/``cudaFree``/``cudaStreamSynchronize`` through ctypes: a DeviceMemory."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or find_cudart()
        try:
            lib = ctypes.CDLL(self.path)
        except OSError as exc:
            raise PlannedPathError(f"cannot load the CUDA runtime {self.path}: {exc}") from None
        self._malloc = lib.cudaMalloc
        self._malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self._malloc.restype = ctypes.c_int
        self._free = lib.cudaFree
        self._free.argtypes = [ctypes.c_void_p]
        self._free.restype = ctypes.c_int
        self._sync = lib.cudaStreamSynchronize
        self._sync.argtypes = [ctypes.c_void_p]
        self._sync.restype = ctypes.c_int
        self._last_error = lib.cudaGetLastError
        self._last_error.argtypes = []
        self._last_error.restype = ctypes.c_int

    def malloc(self, size: int) -> int:
        ptr = ctypes.c_void_p()
        err = self._malloc(ctypes.byref(ptr), max(int(size), 1))
        if err != 0:
            # A failed cudaMalloc leaves its error as the runtime's last error, which torch's next
            # kernel-launch check would raise as its own; clear it, as the caching allocator does.
            self._last_error()
        if err == CUDA_ERROR_MEMORY_ALLOCATION:
            raise MemoryError(f"cudaMalloc({size}) failed: out of device memory (CUDA error {err})")
        if err != 0 or not ptr.value:  # e.g. 700 after a kernel's illegal access: not a question of memory
            raise RuntimeError(f"cudaMalloc({size}) failed with CUDA error {err}")
        return int(ptr.value)

    def free(self, ptr: int, size: int) -> None:
        err = self._free(ctypes.c_void_p(ptr))
        if err != 0:
            raise RuntimeError(f"cudaFree({ptr:#x}) failed with CUDA error {err}")

    def synchronize(self, stream: int) -> None:
        self._sync(ctypes.c_void_p(stream))


class PluggableAllocator:
    """Hands ``real`` (a ``RealAddressAllocator``) to torch as the process's CUDA allocator.

    ``runtime`` (a :class:`CudaRuntime`) serves what ``real`` cannot (an exception inside
    it) and synchronises streams (module docstring, assumptions 3 and 4). The callbacks are
    kept referenced for the life of the process.
    """

    def __init__(self, real: Any, runtime: CudaRuntime) -> None:
        self.real, self.runtime = real, runtime
        self.errors: list[str] = []
        self.out_of_memory: str | None = None  # the first request nothing could serve (assumption 3)
        self._emergency: dict[int, int] = {}
        self._compute: int | None = None
        self._side: tuple[int, ...] = ()
        self._lock = threading.RLock()  # a collection inside could free a block here: same thread
        self._alloc_cb = ALLOC_FN(self._alloc)
        self._free_cb = FREE_FN(self._free)

    @property
    def alloc_ptr(self) -> int:
        """The C address of the alloc callback."""
        return ctypes.cast(self._alloc_cb, ctypes.c_void_p).value

    @property
    def free_ptr(self) -> int:
        """The C address of the free callback."""
        return ctypes.cast(self._free_cb, ctypes.c_void_p).value

    def install(self) -> None:
        """Make this the process's CUDA allocator; before anything initialised CUDA."""
        import torch

        if not torch.cuda.is_available():
            raise PlannedPathError("the planned path on CUDA needs a CUDA GPU, and none is available here")
        if torch.cuda.is_initialized():
            raise PlannedPathError("CUDA is already initialised in this process: the planned path must install its "
                                   "allocator first (run it in a fresh process: harness.executors.planned does)")
        custom = torch._C._cuda_customAllocator(self.alloc_ptr, self.free_ptr)
        try:
            torch.cuda.memory.change_current_allocator(torch.cuda.memory._CUDAAllocator(custom))
        except RuntimeError as exc:
            raise PlannedPathError(f"torch refused the pluggable allocator: {str(exc).splitlines()[0]}") from None
        _INSTALLED.append((self, custom))

    def set_streams(self, compute: int, side: Sequence[int]) -> None:
        """The raw handles of the compute stream and of the side (copy) streams (assumption 4)."""
        self._compute = compute
        self._side = tuple(s for s in side if s != compute)

    # -- the callbacks: never raise (a C caller cannot take a Python exception)
    def _alloc(self, size: int, device: int, stream: Any) -> int:
        stream = int(stream or 0)
        try:
            if self._side and stream in self._side and self._compute is not None:
                self.runtime.synchronize(self._compute)
            return self.real.alloc(int(size), int(device), stream)
        except BaseException as exc:  # noqa: BLE001 - see assumption 3
            return self._emergency_alloc(int(size), exc)

    def _free(self, ptr: Any, size: int, device: int, stream: Any) -> None:
        ptr = int(ptr or 0)
        try:
            if ptr in self._emergency:  # rare: the lock only then
                with self._lock:
                    held = self._emergency.pop(ptr, None)
                if held is not None:
                    self.runtime.free(ptr, held)
                    return
            if self._side and self.real.in_arena(ptr):
                for s in self._side:
                    self.runtime.synchronize(s)
            self.real.free(ptr, int(size), int(device), int(stream or 0))
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(f"free: {type(exc).__name__}: {exc}")

    def _emergency_alloc(self, size: int, exc: BaseException) -> int:
        self.errors.append(f"alloc({size}): {type(exc).__name__}: {exc}")
        try:
            ptr = self.runtime.malloc(size)
        except BaseException as oom:  # noqa: BLE001 - nothing can serve it: NULL (assumption 3)
            if isinstance(oom, MemoryError) and self.out_of_memory is None:  # not a CUDA error after a fault
                self.out_of_memory = (f"the device could not serve {size} bytes (arena {self.real.reserved_bytes} "
                                      f"bytes held): {type(oom).__name__}: {oom}")
            return 0
        with self._lock:
            self._emergency[ptr] = size
        return ptr


def as_out_of_memory(exc: BaseException, hook: PluggableAllocator | None) -> BaseException:
    """What an exception in the planned run means: ``MemoryError`` (an ``oom`` row) when the allocator
    had to hand torch a NULL before it (the illegal memory access that follows is its consequence),
    else the exception itself."""
    if hook is None or hook.out_of_memory is None or isinstance(exc, MemoryError) or not isinstance(exc, Exception):
        return exc
    return MemoryError(f"{hook.out_of_memory} (then {type(exc).__name__}: {str(exc).strip().splitlines()[0]})"
                       if str(exc).strip() else hook.out_of_memory)
