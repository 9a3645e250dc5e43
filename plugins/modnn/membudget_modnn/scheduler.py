"""papers/000 Algorithm 1: data transfer scheduling and convolution algorithm selection.

The tasks of one sub-batch (F_0..F_{L-1}, B_{L-1}..B_0) are simulated in order. For each
task t the scheduler

1. allocates t's inputs that are not on the device and its outputs in the linked-list
   memory (lines 3-8); when an allocation fails it offloads the contiguous run of
   blocks chosen by Figure 4's search (``_kernels.find_scheme``), or, when no run
   exists, defragments (offloadable blocks go to the host, the earliest first, until
   the free memory holds the request, or all of them as the paper's text says with
   ``defragment="all"``; the rest is compacted);
2. picks the stage's algorithm with the largest gain of eq. (5) (lines 9-14);
3. prefetches for the next tasks while the usefulness prediction (line 16) and the
   start-time criterion of eq. (4) (line 19) say so (lines 15-27);
4. advances the clock and frees dead data (lines 28-31).

How the chain model maps onto moDNN's task graph:

- the data blocks are the stage inputs x_i (which become the saved data of stage i
  after F_i, the unit ``harness`` offloads), the last output, the gradients y_i and the
  workspaces; only saved data can be offloaded (a stage's saved data once, then
  prefetched once: ``Transfer`` has one offload and one prefetch per tensor);
- the two "must not offload" criteria (papers/000 IV.B.1): a block is not offloaded
  when the next task uses it, or when it has not been used since it was produced
  (x_i before F_i) or prefetched (a prefetched block stays until its B_i);
- an offload is issued at the start of F_j (the earliest moment the simulator allows,
  so the copy overlaps every task since then when the copy engine is idle, Figure 3b)
  and queued behind the transfers already decided; the memory it frees is released
  when the copy ends (the simulator's rule), and the task it makes room for waits for
  it (``Transfer.wait_op``, lines 7-8 and 13-14; see ``offload``);
- a prefetch decided before task t is issued at the start of t; the load of t's own
  input (line 6) at the end of the task before it; eq. (4) decides it before t only when
  deciding it after t would start it later (see ``should_start_now``);
- ``Schedule.algorithms`` keeps one algorithm per stage, so the choice is made at F_i
  for both F_i and B_i, and its gain counts both times.

Defragmentation has no transfer of its own in the schedule: the simulator counts bytes
and has no addresses, so compaction costs nothing there; the blocks defragmentation
offloads are real offloads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from harness.memory import stage_memory
from harness.options import choice_option
from harness.model import Profile, Transfer
from membudget_modnn import _kernels
from membudget_modnn.memory import LinkedListMemory
from membudget_modnn.subbatch import baseline_algorithm, candidates

DEFRAGMENT_MODES = ("enough", "all")


def check_defragment(mode: str) -> str:
    """``mode`` if it is one of ``DEFRAGMENT_MODES``; an ``OptionValueError`` (a ValueError) naming them otherwise."""
    return choice_option("modnn", "defragment", mode, DEFRAGMENT_MODES)

ABSENT, RESIDENT, HOST, BACK, DEAD = range(5)


class PlanningError(RuntimeError):
    """Algorithm 1 reached a state its byte accounting says cannot happen."""


@dataclass
class Copy:
    """A transfer as the scheduler decided it, with its estimated times."""

    stage: int
    prefetch: bool
    issue_op: int
    issue_at: str
    start: float
    end: float
    wait_op: int | None = None  # the task that waits for this offload (lines 7-8, 13-14)


@dataclass
class SubBatchPlan:
    """Algorithm 1's result for one sub-batch (operation indices within the sub-batch)."""

    copies: list[Copy]
    algorithms: tuple[int, ...]
    makespan: float  # the scheduler's own estimate
    defragmentations: int
    stats: dict[str, float] = field(default_factory=dict)

    def transfers(self, sub_batch: int = 0, op_offset: int = 0) -> list[Transfer]:
        """The copies as ``harness`` transfers of sub-batch ``sub_batch``."""
        return [
            Transfer(c.stage, "prefetch" if c.prefetch else "offload", c.issue_op + op_offset, c.issue_at,
                     None if c.wait_op is None else c.wait_op + op_offset, sub_batch)
            for c in self.copies
        ]


class Algorithm1:
    """One run of Algorithm 1 on a sub-batch profile and a budget (bytes, weights included)."""

    def __init__(self, profile: Profile, budget: int, duplex: bool = False, select_algorithms: bool = True,
                 defragment: str = "enough"):
        self.defragment_all = check_defragment(defragment) == "all"
        self.p = profile
        self.n = n = profile.n_stages
        self.arena = int(budget) - profile.weight_bytes
        if self.arena < 0:
            raise PlanningError("the weights alone exceed the budget")
        self.duplex = duplex
        self.select = select_algorithms
        # every size of the chain model comes from harness.memory (default algorithms; workspaces apart)
        self.m = [stage_memory(profile, i) for i in range(n)]
        self.saved = [m.saved for m in self.m]
        # owners in the linked list: stage blocks 0..n-1, then these
        self.OUT, self.GOUT, self.WS = n, 2 * n + 1, 2 * n + 2
        self.mem = LinkedListMemory(self.arena, capacity=8 * n + 64)
        self.state = [ABSENT] * n
        self.f_start = [math.nan] * n
        self.f_end = [math.nan] * n
        self.off_end = [math.nan] * n
        self.pref_end = [math.nan] * n
        self.prefetched = [False] * n
        self.alg: list[int | None] = [None] * n
        self.base = [baseline_algorithm(profile, i) for i in range(n)]
        self.engine = [0.0, 0.0]
        self.copies: list[Copy] = []
        self.T = 0.0
        self.defrags = 0

    # ------------------------------------------------------------------ the task graph
    def y(self, i: int) -> int:
        """Owner id of the gradient y_i."""
        return self.n + 1 + i

    def op(self, k: int) -> tuple[str, int]:
        """Operation k of the sub-batch: ('F', i) for k < L, else ('B', 2L-1-k)."""
        return ("F", k) if k < self.n else ("B", 2 * self.n - 1 - k)

    def b_index(self, i: int) -> int:
        """Operation index of B_i."""
        return 2 * self.n - 1 - i

    def algorithm(self, i: int):
        """The stage's chosen algorithm; before F_i the default (for time estimates)."""
        a = self.alg[i]
        return self.p.stages[i].algorithm(-1 if a is None else a)

    def duration(self, k: int) -> float:
        """Time of operation k with the stage's (chosen or default) algorithm."""
        kind, i = self.op(k)
        a = self.algorithm(i)
        return a.fwd_time if kind == "F" else a.bwd_time

    def workspace(self, k: int) -> int:
        """Workspace of operation k: the chosen algorithm's, or the baseline's before F_i."""
        kind, i = self.op(k)
        a = self.p.stages[i].algorithm(self.alg[i] if self.alg[i] is not None else self.base[i])
        return a.fwd_workspace if kind == "F" else a.bwd_workspace

    def fixed_live(self, k: int) -> int:
        """Bytes task k needs resident before it allocates (inputs that cannot leave)."""
        kind, i = self.op(k)
        # B_i also holds the part of x_{i+1} it needs (kept since B_{i+1}: output_saved_bytes)
        return self.m[i].forward_resident if kind == "F" else self.m[i].backward_resident

    def op_alloc(self, k: int, ws: int) -> int:
        """Bytes task k allocates at its start (``harness.memory``), with workspace ``ws``."""
        kind, i = self.op(k)
        m = self.m[i]
        if kind == "F":
            return m.forward_alloc - m.fwd_workspace + ws
        return m.backward_alloc - m.bwd_workspace + ws

    def pinned_prefetched(self, k: int, extra: int | None = None) -> int:
        """Bytes of prefetched blocks that must stay resident during task k (criterion b)."""
        total = sum(self.saved[j] for j in range(self.n) if self.prefetched[j] and self.b_index(j) > k)
        if extra is not None and self.b_index(extra) > k:
            total += self.saved[extra]
        return total

    def fits(self, first: int, last: int, extra: int | None = None) -> bool:
        """Line 16's prediction: can every task first..last allocate (with ``extra`` prefetched)?

        Byte accounting: a task needs its fixed inputs, its allocation and the prefetched
        blocks that wait for later tasks; everything else resident can be offloaded, and
        when fragmentation forbids a contiguous scheme, defragmentation makes room.
        """
        for k in range(first, last + 1):
            if self.fixed_live(k) + self.op_alloc(k, self.workspace(k)) + self.pinned_prefetched(k, extra) > self.arena:
                return False
        return True

    # ------------------------------------------------------------------ offloading
    def offloadable(self, k: int, protect: tuple[int, ...]) -> np.ndarray:
        """Blocks that may be offloaded before task k: produced, used, never offloaded, not needed now."""
        can = np.zeros(2 * self.n + 3, dtype=np.bool_)
        for j in range(self.n):
            can[j] = (self.state[j] == RESIDENT and j < k and j not in protect and self.saved[j] > 0
                      and not math.isnan(self.f_end[j]))
        return can

    def offload(self, j: int, waiter: int | None = None) -> float:
        """Offload block j (issued at the start of F_j, queued on the copy engine); its release time.

        ``waiter`` is the task whose allocation the offload makes room for: Algorithm 1
        delays it until the memory is free (lines 7-8 and 13-14), and the schedule says so
        (the transfer's ``wait_op``), as generated code synchronises the compute stream
        with the copy whose space it reuses. Without it the task could start on memory
        that Algorithm 1's model holds for a prefetch decided earlier (line 20), which a
        simulator that reserves a prefetch's memory when its copy starts lends to the
        compute stream; the offloads that would return it can be queued behind that
        prefetch on the copy engine, and the run could not go on.
        """
        start = max(self.engine[0], self.f_start[j])
        end = start + self.saved[j] / self.p.d2h_bandwidth
        self.engine[0] = end
        if not self.duplex:
            self.engine[1] = end
        self.copies.append(Copy(j, False, j, "start", start, end, waiter))
        self.mem.free(j)
        self.state[j] = HOST
        self.off_end[j] = end
        return max(end, self.f_end[j])

    def scheme(self, nbytes: int, k: int, protect: tuple[int, ...], now: float):
        """Figure 4: (blocks, delay) of the lowest-delay contiguous scheme for ``nbytes``, or None."""
        _, size, owner = self.mem.segments()
        can = self.offloadable(k, protect)
        ready = np.array([self.f_start[j] if j < self.n and can[j] else 0.0 for j in range(len(can))])
        dur = np.array([self.saved[j] / self.p.d2h_bandwidth if j < self.n else 0.0 for j in range(len(can))])
        moved = np.array([self.saved[j] if j < self.n else 0 for j in range(len(can))], dtype=np.int64)
        next_use = np.array([self.b_index(j) if j < self.n else 0 for j in range(len(can))], dtype=np.int64)
        first, last, delay, _ = _kernels.find_scheme(size, owner, can, ready, dur, moved, next_use,
                                                     self.engine[0], now, nbytes)
        if first < 0:
            return None
        blocks = sorted({int(o) for o in owner[first:last + 1] if o >= 0}, key=lambda j: (self.f_start[j], j))
        return blocks, float(delay)

    def defragment_blocks(self, nbytes: int, k: int, protect: tuple[int, ...]) -> list[int]:
        """The blocks defragmentation offloads before compacting, in copy order.

        The paper's text (IV.B) offloads "all data" (``defragment="all"``). By default
        (``"enough"``, ours) offloadable blocks go in the order their copies may start (the
        earliest first: their copies overlap the most tasks, Figure 3b, and they are needed
        again last) until the free memory after compaction holds ``nbytes``: IV.B's
        objective (2), minimise offloading. Every offloadable block when even that is not
        enough.
        """
        can = self.offloadable(k, protect)
        order = sorted((j for j in range(self.n) if can[j]), key=lambda j: (self.f_start[j], j))
        if self.defragment_all:
            return order
        free = self.arena - self.mem.used()
        chosen = []
        for j in order:
            if free >= nbytes:
                break
            chosen.append(j)
            free += self.mem.resident(j)
        return chosen if free >= nbytes else order

    def defragment_delay(self, nbytes: int, k: int, protect: tuple[int, ...], now: float) -> float:
        """The delay defragmentation would cause: the blocks it offloads queued on the copy engine."""
        t = self.engine[0]
        for j in self.defragment_blocks(nbytes, k, protect):
            t = max(t, self.f_start[j]) + self.saved[j] / self.p.d2h_bandwidth
        return max(0.0, t - now)

    def place(self, nbytes: int, owner: int, k: int, protect: tuple[int, ...], now: float,
              defragment: bool = True, deadline: float | None = None) -> float | None:
        """Allocate ``nbytes`` for ``owner`` before task k; the time its memory is free (None: failed).

        A scheme's delay is measured against ``deadline`` (default ``now``): for a prefetch,
        the latest moment its memory may come free without delaying the task it is for.
        """
        short = owner >= self.n  # gradients, the output, workspaces: freed within a task or two
        if nbytes <= 0 or self.mem.alloc(nbytes, owner, short):
            return now
        found = self.scheme(nbytes, k, protect, now if deadline is None else deadline)
        release = now
        waiter = k if deadline is None else None  # a prefetch's room (line 23): its task waits for the prefetch
        if found is not None:
            for j in found[0]:
                release = max(release, self.offload(j, waiter))
        elif defragment:
            self.defrags += 1
            for j in self.defragment_blocks(nbytes, k, protect):
                release = max(release, self.offload(j, waiter))
            self.mem.compact()
        else:
            return None
        if not self.mem.alloc(nbytes, owner, short):
            raise PlanningError(f"no room for {nbytes} bytes before task {k} after offloading")
        return release

    # ------------------------------------------------------------------ prefetching
    def prefetch(self, j: int, issue_op: int, issue_at: str, issued: float, ready: float) -> float:
        """Queue the prefetch of block j (memory already placed); its end time."""
        e = 1 if self.duplex else 0
        start = max(issued, self.engine[e], self.off_end[j], ready)
        end = start + self.saved[j] / self.p.h2d_bandwidth
        self.engine[e] = end
        if not self.duplex:
            self.engine[0] = end
        self.copies.append(Copy(j, True, issue_op, issue_at, start, end))
        self.prefetched[j] = True
        self.state[j] = BACK
        self.pref_end[j] = end
        return end

    def next_prefetch_task(self, k: int) -> int | None:
        """The nearest task after k whose input is on the host and not yet being prefetched."""
        for s in range(k + 1, 2 * self.n):
            kind, i = self.op(s)
            if kind == "B" and self.state[i] == HOST:
                return s
        return None

    def latest_starts(self, k: int, finish: float) -> dict[int, tuple[float, float]]:
        """EST and latest prefetch start of every later task whose input is on the host.

        EST(s) is the start of s if nothing is delayed from the end of task k on. The
        copy engine runs prefetches in task order, so a prefetch must also end before the
        next one has to start: LST(s) = min(EST(s), LST(next)) - T_trans(s).
        """
        est, times = finish, {}
        for s in range(k + 1, 2 * self.n):
            kind, j = self.op(s)
            if kind == "B" and self.state[j] == HOST:
                times[s] = est
            est += self.duration(s)
        out, bound = {}, math.inf
        for s in sorted(times, reverse=True):
            _, j = self.op(s)
            bound = min(times[s], bound) - self.saved[j] / self.p.h2d_bandwidth
            out[s] = (times[s], bound)
        return out

    def should_start_now(self, s: int, start_t: float, finish_t: float, latest: float) -> bool:
        """eq. (4): would a prefetch for s that starts after task t ends delay s?

        "After task t" is also after the copies already queued on the prefetch engine, and
        "delay s" includes making a later prefetch late (``latest`` is LST(s), see
        ``latest_starts``); for the last pending prefetch this is eq. (4) as printed.

        The delay is the one that waiting causes: when the copy could not start before t
        ends anyway (the engine is busy, or the block's offload runs, until then), a
        prefetch decided after t starts no later than one decided now, so it is not due
        yet (papers/000 IV.B.2: "prefetching should not start too early, since the
        prefetched data block consumes memory that is unnecessary for tasks executed
        before s"). Deciding it now would reserve its memory (line 20) long before the
        copy can run, which the tasks in between then lack; the simulator reserves a
        prefetch's memory when its copy starts, and the offloads those tasks need, queued
        behind the early prefetch, could not free it.
        """
        _, j = self.op(s)
        e = 1 if self.duplex else 0
        late = max(finish_t, self.engine[e], self.off_end[j])
        now = max(start_t, self.engine[e], self.off_end[j])
        return late > latest and late > now

    def prefetch_ahead(self, k: int, start: float, finish: float) -> None:
        """Lines 15-27: prefetch for the next tasks while it is useful and due now."""
        protect_t = self.needs(k)
        times = self.latest_starts(k, finish)
        for s in range(k + 1, 2 * self.n):
            kind, j = self.op(s)
            if kind == "B" and self.state[j] == HOST:
                if s not in times:  # a scheme for an earlier prefetch sent this block to the host
                    times = self.latest_starts(k, finish)
                _, latest = times[s]
                if not self.fits(k, s, extra=j):  # line 16
                    break
                if not self.should_start_now(s, start, finish, latest):  # line 19 / 27
                    break
                # blocks needed before s would have to come back before the prefetched one is used
                released = self.place(self.saved[j], j, k, protect_t + tuple(range(j, self.n)), start,
                                      defragment=False, deadline=latest)
                if released is None:  # line 25
                    break
                self.prefetch(j, k, "start", start, released)

    def needs(self, k: int) -> tuple[int, ...]:
        """Blocks task k reads (criterion a protects them)."""
        kind, i = self.op(k)
        return (i,)

    # ------------------------------------------------------------------ algorithm selection
    def gain(self, k: int, index: int, base_time: float, start: float) -> float | None:
        """eq. (5) for stage i's algorithm ``index`` at F_i (None: it cannot fit)."""
        _, i = self.op(k)
        a = self.p.stages[i].algorithm(index)
        if self.fixed_live(k) + self.op_alloc(k, a.fwd_workspace) + self.pinned_prefetched(k) > self.arena:
            return None
        b = self.b_index(i)
        if self.fixed_live(b) + self.op_alloc(b, a.bwd_workspace) + self.pinned_prefetched(b) > self.arena:
            return None
        t_off = 0.0
        if a.fwd_workspace > self.mem.largest_free():
            found = self.scheme(a.fwd_workspace, k, self.needs(k), self.T)
            t_off = found[1] if found is not None else self.defragment_delay(a.fwd_workspace, k, self.needs(k), self.T)
            t_off = max(0.0, t_off - (start - self.T))  # delays already paid by this task are not new
        finish = start + t_off + a.fwd_time
        return base_time - (a.fwd_time + a.bwd_time) - t_off - self.prefetch_penalty(k, a, start, finish)

    def prefetch_penalty(self, k: int, a, start: float, finish: float) -> float:
        """T_pre,alg(s): how much the workspace delays the prefetch for the nearest task s."""
        s = self.next_prefetch_task(k)
        if s is None:
            return 0.0
        _, j = self.op(s)
        _, latest = self.latest_starts(k, finish)[s]
        if not self.should_start_now(s, start, finish, latest):
            return 0.0
        room = (self.arena - self.fixed_live(k) - self.op_alloc(k, a.fwd_workspace) - self.pinned_prefetched(k))
        if room >= self.saved[j]:
            return 0.0
        e = 1 if self.duplex else 0
        now_start = max(start, self.engine[e], self.off_end[j])
        late_start = max(finish, self.engine[e], self.off_end[j])
        return max(0.0, late_start - latest) - max(0.0, now_start - latest)

    def choose_algorithm(self, k: int, start: float) -> int:
        """Lines 9-11: the algorithm with the largest gain (ties: the earlier candidate, default first)."""
        _, i = self.op(k)
        if not self.select or not self.p.stages[i].algorithms:
            return self.base[i] if self.p.stages[i].algorithms else -1
        base = self.p.stages[i].algorithm(self.base[i])
        base_time = base.fwd_time + base.bwd_time
        best, best_gain = self.base[i], -math.inf
        for index, _ in candidates(self.p, i):
            g = self.gain(k, index, base_time, start)
            if g is not None and g > best_gain:
                best, best_gain = index, g
        return best

    # ------------------------------------------------------------------ the main loop
    def run(self) -> SubBatchPlan:
        """Schedule every task of the sub-batch (Algorithm 1, lines 1-31)."""
        n = self.n
        for k in range(2 * n):
            kind, i = self.op(k)
            protect = self.needs(k)
            ready = self.T
            # lines 3-8: outputs (and the input that is on the host), offloading when needed
            if kind == "F":
                if i == 0:
                    ready = max(ready, self.place(self.m[0].input, 0, k, protect, self.T))
                    self.state[0] = RESIDENT
                owner = i + 1 if i + 1 < n else self.OUT
                ready = max(ready, self.place(self.m[i].output, owner, k, protect, self.T))
                if i + 1 < n:
                    self.state[i + 1] = RESIDENT
                ready = max(ready, self.place(self.m[i].extra, i, k, protect, self.T))
            else:
                ready = max(ready, self.place(self.m[i].grad, self.y(i), k, protect, self.T))
                if i == n - 1:
                    ready = max(ready, self.place(self.m[i].grad_in, self.GOUT, k, protect, self.T))
                if self.state[i] == HOST:  # line 6: load the input now
                    released = self.place(self.saved[i], i, k, protect, self.T)
                    issue = (k - 1, "end")
                    ready = max(ready, self.prefetch(i, *issue, self.T, released))
                elif self.state[i] == BACK:
                    ready = max(ready, self.pref_end[i])
            # lines 9-14: algorithm and workspace
            if kind == "F":
                self.f_start[i] = ready  # provisional, for the gain's estimates
                self.alg[i] = self.choose_algorithm(k, ready)
            ready = max(ready, self.place(self.workspace(k), self.WS, k, protect, self.T))
            start = ready
            if kind == "F":
                self.f_start[i] = start
            finish = start + self.duration(k)
            # lines 15-27
            self.prefetch_ahead(k, start, finish)
            # lines 28-31
            self.T = finish
            self.mem.free(self.WS)
            if kind == "F":
                self.f_end[i] = finish
                if self.m[i].drop > 0:
                    self.mem.keep(i, self.m[i].kept)
            else:
                # the part of x_i that B_{i-1} needs is one storage with saved_i: it stays
                # (kept in place, over all of block i's segments) until B_{i-1} ends
                # (harness.memory's rule)
                held = self.m[i - 1].held if i else 0
                if held > 0:
                    self.mem.keep(i, held)
                else:
                    self.mem.free(i)
                if self.m[i].held > 0:  # the part of x_{i+1} held for this B_i
                    self.mem.free(i + 1)
                self.state[i] = DEAD
                if i == n - 1:
                    self.mem.free(self.OUT)
                    self.mem.free(self.GOUT)
                else:
                    self.mem.free(self.y(i + 1))
                if i == 0:
                    self.mem.free(self.y(0))
        moved = sum(self.saved[c.stage] for c in self.copies)
        return SubBatchPlan(
            copies=self.copies,
            algorithms=tuple(-1 if a is None else a for a in self.alg),
            makespan=self.T,
            defragmentations=self.defrags,
            stats={"moved_bytes": float(moved), "offloads": float(sum(not c.prefetch for c in self.copies))},
        )
