"""The memory manager of papers/000 Figure 2: virtual allocation on a linked list of segments.

``LinkedListMemory`` wraps the kernels of ``_kernels`` and remembers which nodes each
data block owns (a block may own several segments: moDNN's saved data of a stage is the
part of its input that the backward needs plus any extra it saved, allocated at two
moments). It is the planner's internal view of the device; the core simulator, which
counts bytes and knows no addresses, judges the final schedule.
"""

from __future__ import annotations

import numpy as np

from membudget_modnn import _kernels as k


class LinkedListMemory:
    """Device memory of ``arena`` bytes as a linked list of segments."""

    def __init__(self, arena: int, capacity: int = 256):
        self.arena = int(arena)
        self._arrays = k.ll_new(max(capacity, 8), self.arena)
        self.nodes: dict[int, list[int]] = {}

    def _grow(self) -> None:
        """Double the number of node slots (the list itself is unchanged)."""
        off, size, owner, nxt, prv, meta, stack = self._arrays
        cap = len(off)
        grown = [np.concatenate([a, np.full(cap, fill, dtype=np.int64)])
                 for a, fill in ((off, 0), (size, 0), (owner, k.FREE), (nxt, -1), (prv, -1))]
        free = np.concatenate([stack[: meta[1]], np.arange(2 * cap - 1, cap - 1, -1, dtype=np.int64)])
        new_stack = np.zeros(2 * cap, dtype=np.int64)
        new_stack[: len(free)] = free
        meta = meta.copy()
        meta[1] = len(free)
        self._arrays = (*grown, meta, new_stack)

    def alloc(self, nbytes: int, owner: int, short_lived: bool = False) -> bool:
        """Place ``nbytes`` for ``owner`` (``_kernels.ll_alloc``); False when no free segment is big enough."""
        if nbytes <= 0:
            return True
        node = k.ll_alloc(*self._arrays, nbytes, owner, short_lived)
        if node == -2:
            self._grow()
            node = k.ll_alloc(*self._arrays, nbytes, owner, short_lived)
        if node < 0:
            return False
        self.nodes.setdefault(owner, []).append(int(node))
        return True

    def free(self, owner: int) -> None:
        """Free every segment of ``owner``."""
        for node in self.nodes.pop(owner, []):
            k.ll_free(*self._arrays, node)

    def keep(self, owner: int, nbytes: int) -> None:
        """Keep the first ``nbytes`` of ``owner`` over all its segments, in allocation order; free the rest.

        F_i's end drops the part of x_i that B_i does not need; B_i's end keeps the part of
        x_i that B_{i-1} still needs, of a block that may own two segments (x_i, then the
        extra saved data).
        """
        nodes = self.nodes.get(owner)
        if not nodes:
            return
        size = self._arrays[1]
        left, kept = max(0, int(nbytes)), []
        for node in nodes:
            have = int(size[node])
            if left >= have:
                kept.append(node)
                left -= have
            elif left > 0:
                if self._arrays[5][1] == 0:
                    self._grow()
                    size = self._arrays[1]
                k.ll_shrink(*self._arrays, node, left)
                kept.append(node)
                left = 0
            else:
                k.ll_free(*self._arrays, node)
        if kept:
            self.nodes[owner] = kept
        else:
            del self.nodes[owner]

    def compact(self) -> None:
        """Defragmentation: every resident segment slides down, leaving one free segment."""
        if self._arrays[5][1] == 0:
            self._grow()
        k.ll_compact(*self._arrays)

    def resident(self, owner: int) -> int:
        """Bytes ``owner`` holds."""
        size = self._arrays[1]
        return int(sum(size[n] for n in self.nodes.get(owner, [])))

    def used(self) -> int:
        """Bytes held by all owners."""
        return sum(self.resident(o) for o in self.nodes)

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(offset, size, owner) of every segment in address order."""
        off, size, owner, nxt, prv, meta, _ = self._arrays
        _, o, s, w = k.ll_flatten(off, size, owner, nxt, prv, meta)
        return o, s, w

    def largest_free(self) -> int:
        """The largest contiguous free segment."""
        _, s, w = self.segments()
        free = s[w == k.FREE]
        return int(free.max()) if len(free) else 0
