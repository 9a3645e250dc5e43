"""Plain-Python twins of the kernels in ``_kernels``: the readable statement of what they do.

``ReferenceMemory`` keeps the segments as a Python list in address order; segments are
named by their offset. ``find_scheme_reference`` is the search of papers/000 Figure 4
written out. The tests drive both implementations with the same random inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

FREE = -1


@dataclass
class Segment:
    """A free (``owner`` -1) or occupied span of device memory."""

    off: int
    size: int
    owner: int = FREE


class ReferenceMemory:
    """Linked-list device memory, two-ended best fit, coalescing frees, compaction (papers/000 III.B)."""

    def __init__(self, arena: int):
        self.arena = arena
        self.segments: list[Segment] = [Segment(0, arena)] if arena > 0 else []

    def _at(self, off: int) -> int:
        return next(i for i, s in enumerate(self.segments) if s.off == off)

    def alloc(self, req: int, who: int, top: bool = False) -> int | None:
        """Place ``req`` bytes; the new segment's offset, or None.

        Best fit: the smallest free segment that holds it. Long-lived (``top`` False): at
        its low end, the lowest address on ties. Short-lived: at its high end, the highest
        address on ties.
        """
        fitting = [i for i, s in enumerate(self.segments) if s.owner == FREE and s.size >= req]
        if not fitting:
            return None
        if top:
            i = min(fitting, key=lambda i: (self.segments[i].size, -i))
            s = self.segments[i]
            if s.size > req:
                s.size -= req
                self.segments.insert(i + 1, Segment(s.off + s.size, req, who))
                return s.off + s.size
            s.owner = who
            return s.off
        i = min(fitting, key=lambda i: (self.segments[i].size, i))
        s = self.segments[i]
        if s.size > req:
            self.segments.insert(i + 1, Segment(s.off + req, s.size - req))
            s.size = req
        s.owner = who
        return s.off

    def free(self, off: int) -> None:
        """Free the segment at ``off`` and merge it with free neighbours."""
        i = self._at(off)
        self.segments[i].owner = FREE
        if i + 1 < len(self.segments) and self.segments[i + 1].owner == FREE:
            self.segments[i].size += self.segments.pop(i + 1).size
        if i > 0 and self.segments[i - 1].owner == FREE:
            self.segments[i - 1].size += self.segments.pop(i).size

    def shrink(self, off: int, keep: int) -> None:
        """Keep the first ``keep`` bytes of the segment at ``off``; its tail becomes free."""
        i = self._at(off)
        s = self.segments[i]
        tail = s.size - keep
        if tail <= 0:
            return
        s.size = keep
        if i + 1 < len(self.segments) and self.segments[i + 1].owner == FREE:
            nxt = self.segments[i + 1]
            nxt.off -= tail
            nxt.size += tail
        else:
            self.segments.insert(i + 1, Segment(s.off + keep, tail))

    def compact(self) -> None:
        """Slide every occupied segment down, in order; the rest is one free segment."""
        cursor = 0
        kept = []
        for s in self.segments:
            if s.owner != FREE:
                kept.append(Segment(cursor, s.size, s.owner))
                cursor += s.size
        if self.arena - cursor > 0:
            kept.append(Segment(cursor, self.arena - cursor))
        self.segments = kept

    def layout(self) -> list[tuple[int, int, int]]:
        """(offset, size, owner) of every segment in address order."""
        return [(s.off, s.size, s.owner) for s in self.segments]


def find_scheme_reference(seg_size, seg_owner, can_off, ready, dur, moved, next_use, engine_free, now, req):
    """papers/000 Figure 4: try every start node, grow a contiguous run, keep the lowest delay.

    Ties: the scheme whose soonest-needed block is needed latest, then fewer bytes.
    """
    best, best_key = (-1, -1, float("inf"), 0), (float("inf"), 0, 0)
    n = len(seg_size)
    for k in range(n):
        total, blocks, last = 0, [], -1
        for m in range(k, n):
            o = int(seg_owner[m])
            if o != FREE:
                if not can_off[o]:
                    break
                if o not in blocks:
                    blocks.append(o)
            total += int(seg_size[m])
            if total >= req:
                last = m
                break
        if last < 0 or not blocks:
            continue
        t = engine_free
        for o in sorted(blocks, key=lambda o: (ready[o], o)):
            t = max(t, ready[o]) + dur[o]
        delay = max(0.0, t - now)
        nbytes = sum(int(moved[o]) for o in blocks)
        key = (delay, -min(int(next_use[o]) for o in blocks), nbytes)
        if key < best_key:
            best, best_key = (k, last, delay, nbytes), key
    return best
