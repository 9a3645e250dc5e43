"""Where the torch executor keeps what each forward saves for its backward.

``SavedStore.packing(sub_batch, stage)`` is a ``torch.autograd.graph.saved_tensors_hooks``
context: every tensor the forward of a stage saves goes through it. Tensors are
grouped by the memory block (storage) they live in, so a storage saved twice, or saved
through several views, is one ``Block`` (the profiler's deduplication,
``harness.profilers.instrument``). Parameters and buffers are weights and pass through
untouched.

ATTRIBUTION (the profiler's rule, papers/004 section 3.1 as widened in
``instrument.py``): a block belongs to the stage whose forward first saved it, except
that the storage of a stage's output belongs to the next stage (a trailing ReLU that
keeps its output is counted in the next stage's ``saved_bytes``). ``end_forward``
applies that rule when the forward of a stage is over.

A block moves in place: an offload copies the tail of its storage to a host buffer
and shrinks the storage (``UntypedStorage.resize_``); a prefetch grows it back and
copies the tail in. Every tensor that refers to the storage (the autograd graph's
saved tensors, views kept anywhere) therefore sees its data again after a prefetch,
and the device memory is really returned while the data is away, whoever else holds
the storage. The store holds blocks weakly: a block, and its storage, dies when the
autograd graph that saved it is released (at the end of the backward that used it),
so the bytes the store reports as "on the device" are measured, not bookkept.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from harness.chain.extract import concrete

GroupKey = tuple[int, int]  # (sub_batch, stage)


class NotResident(RuntimeError):
    """A backward needed saved data that the schedule left on the host."""


def storage_key(t: torch.Tensor) -> int:
    """The identity of the memory block a tensor lives in (views share it)."""
    return t.untyped_storage()._cdata


def flat_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A 1-D uint8 tensor over all of ``storage`` (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


@dataclass(eq=False)
class Block:
    """One saved storage: its full size, its group, and how much of it is on the host.

    ``host`` holds the last ``moved`` bytes of the storage while they are away; the
    storage itself then holds ``nbytes - moved`` bytes.
    """

    storage: torch.UntypedStorage
    nbytes: int
    group: GroupKey
    packed_by: set[int] = field(default_factory=set)
    host: torch.Tensor | None = None
    moved: int = 0
    ready: object = None  # event of the last copy of the block (its offload's, then its prefetch's)

    @property
    def device_bytes(self) -> int:
        """Bytes of the block held on the device now (measured on the storage)."""
        return int(self.storage.nbytes())


@dataclass(eq=False)
class SavedRef:
    """What the autograd graph holds instead of a saved tensor: its block and its view."""

    block: Block
    dtype: torch.dtype
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


class SavedStore:
    """The saved tensors of one training iteration, by group (sub-batch, stage).

    ``weight_keys`` are the storages of parameters and buffers (never packed), and so are
    the constants of the workload the iteration computes (``note_constant``: position ids, a
    causal mask; the profile counts what autograd saves of them once, with the weights).
    Tensors on another device than ``device`` (a CPU scalar saved by a CUDA operation) and
    storages that cannot be resized pass through untouched: they stay where they are.
    """

    def __init__(self, weight_keys: set[int], device: torch.device) -> None:
        self.weight_keys = weight_keys
        self.device = concrete(device)
        # storage id -> a weak reference to the constant's storage: once it is freed, the id may be another's
        self._constants: dict[int, StorageWeakRef] = {}
        self._groups: dict[GroupKey, list[weakref.ref[Block]]] = {}
        self._by_storage: dict[int, weakref.ref[Block]] = {}
        self._kept: dict[GroupKey, Block] = {}  # checkpoints held for their recomputation
        self.packed_bytes = 0

    # -- packing
    @contextmanager
    def packing(self, sub_batch: int, stage: int) -> Iterator[None]:
        """Route what the forward of (``sub_batch``, ``stage``) saves through this store."""

        def pack(t: torch.Tensor) -> object:
            block, new = self._block_of(t, (sub_batch, stage))
            if block is None:
                return t
            if new:
                self.packed_bytes += block.nbytes
            block.packed_by.add(stage)
            return SavedRef(block, t.dtype, t.size(), t.stride(), t.storage_offset())

        def unpack(saved: object) -> torch.Tensor:
            if not isinstance(saved, SavedRef):
                return saved  # type: ignore[return-value]
            block = saved.block
            if block.moved:
                raise NotResident(
                    f"the backward of stage {block.group[1]} (sub-batch {block.group[0]}) needs saved data "
                    f"that is still on the host ({block.moved} bytes): the schedule offloads it without a prefetch"
                )
            return torch.empty(0, dtype=saved.dtype, device=block.storage.device).set_(
                block.storage, saved.offset, saved.size, saved.stride)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    def keep(self, sub_batch: int, stage: int, t: torch.Tensor) -> None:
        """Hold the input an ``Fc`` forward keeps (its checkpoint x_i) as a block of the stage's group,
        so that transfers of the stage move it like saved data, until ``release``.

        Nothing autograd holds refers to it yet (the forward ran under ``torch.no_grad``), so the
        store keeps the block alive itself; R_i, which saves from it, then holds it like any saved
        tensor. A storage that is already a block (the previous stage saved its output) stays in
        its group.
        """
        block, _ = self._block_of(t, (sub_batch, stage))
        if block is None:
            return
        self._kept[(sub_batch, stage)] = block

    def _block_of(self, t: torch.Tensor, group: GroupKey) -> tuple[Block | None, bool]:
        """The block of ``t``'s storage (registered in ``group`` when it is new) and whether it is
        new; None for what passes through: no plain storage, a weight, another device, a storage
        that cannot be resized."""
        try:
            key = storage_key(t)
        except (RuntimeError, NotImplementedError):
            return None, False
        if key in self.weight_keys or t.device != self.device or self._is_constant(key):
            return None, False
        ref = self._by_storage.get(key)
        block = ref() if ref is not None else None
        if block is not None:
            return block, False
        storage = t.untyped_storage()
        if not storage.resizable():
            return None, False
        block = Block(storage, int(storage.nbytes()), group)
        self._by_storage[key] = weakref.ref(block)
        self._groups.setdefault(group, []).append(weakref.ref(block))
        return block, True

    def release(self, sub_batch: int, stage: int) -> None:
        """The recomputation has read the checkpoint: the store no longer holds it alive."""
        self._kept.pop((sub_batch, stage), None)

    def end_forward(self, sub_batch: int, stage: int, output: torch.Tensor | None) -> None:
        """Apply the attribution rule: the stage's saved output joins the next stage's group (``output``
        None: it feeds no stage's forward, as the last stage's does not)."""
        if output is None:
            return
        ref = self._by_storage.get(storage_key(output))
        block = ref() if ref is not None else None
        if block is None or block.group != (sub_batch, stage):
            return
        old = self._groups[block.group]
        self._groups[block.group] = [r for r in old if r() is not block]
        block.group = (sub_batch, stage + 1)
        self._groups.setdefault(block.group, []).append(weakref.ref(block))

    # -- lookups
    def blocks(self, group: GroupKey) -> list[Block]:
        """The live blocks of ``group``, in the order they were saved."""
        alive = [b for b in (r() for r in self._groups.get(group, ())) if b is not None]
        return alive

    def device_bytes(self) -> dict[GroupKey, int]:
        """Bytes each group holds on the device now (groups holding nothing are left out)."""
        out: dict[GroupKey, int] = {}
        for group in list(self._groups):
            held = sum(b.device_bytes for b in self.blocks(group))
            if held:
                out[group] = held
        return out

    def host_bytes(self) -> int:
        """Bytes of the live blocks that are on the host now (offloaded, not yet brought back)."""
        return sum(b.moved for refs in self._groups.values() for b in (r() for r in refs) if b is not None)

    def group_bytes(self, group: GroupKey) -> int:
        """Full size of the live blocks of ``group`` (wherever their bytes are)."""
        return sum(b.nbytes for b in self.blocks(group))

    def note_constant(self, t: torch.Tensor) -> None:
        """``t`` is a constant of the workload (neither the input nor a parameter reaches it): what
        saves it passes it through, so it stays where it is, freed when its last reader is done, as
        without this store. Offloading it with the stage that saves it would free the memory that
        later stages read it from (GPT-2's position ids cross every cut). The store holds no
        reference to it."""
        try:
            self._constants[storage_key(t)] = StorageWeakRef(t.untyped_storage())
        except (RuntimeError, NotImplementedError):
            pass

    def _is_constant(self, key: int) -> bool:
        ref = self._constants.get(key)
        if ref is not None and ref.expired():  # freed: the id now names another storage
            del self._constants[key]
            return False
        return ref is not None

    def clear(self) -> None:
        """Forget every block and constant (the end of an iteration)."""
        self._groups.clear()
        self._by_storage.clear()
        self._kept.clear()
        self._constants.clear()
        self.packed_bytes = 0


def split_offload(blocks: list[Block], nbytes: int | None) -> list[tuple[Block, int]]:
    """How many bytes of each block an offload of ``nbytes`` moves (None: all of them).

    Whole blocks go first, in saving order; the block where the amount runs out moves
    only its tail (papers/004 section 4: a fractional offload moves part of the data).
    """
    plan: list[tuple[Block, int]] = []
    left = sum(b.nbytes - b.moved for b in blocks) if nbytes is None else nbytes
    for block in blocks:
        if left <= 0:
            break
        take = min(block.nbytes - block.moved, left)
        if take > 0:
            plan.append((block, take))
            left -= take
    return plan
