"""The memory rules of the chain model, written once.

Every component that needs to know what an operation holds on the device reads it
here: the simulator (``harness.simulate.lowering`` turns ``schedule_blocks`` into its
per-operation arrays, ``harness.simulate.executor.memory_trace`` times the same blocks),
the bounds (``harness.bounds.op_needs``) and the planners (moDNN's task sizes and
Algorithm 1, DYNPROG's C^F and C^B, the recompute planner's segment needs:
``segment_needs``). Only the validator (``harness.validate``) keeps
an independent derivation of its own, to check the others.

The model (papers/004 section 3.1, widened to saved data that differs from the input,
and to recomputation as rotor's vocabulary has it): for stage i of a pass,

- x_i (``input_bytes``) is allocated when the forward of stage i-1 starts (x_0 when the
  forward of stage 0 starts); the model output x_L when the forward of the last stage
  starts, and it lives until B_{L-1} ends;
- a forward allocates at its start its output x_{i+1}, its workspace and
  ``extra_i = max(0, saved_i - input_i)`` (what it saves beyond its input), and frees at
  its end its workspace;
- a forward that saves (``F``) frees at its end ``drop_i = max(0, input_i - saved_i)``,
  the part of x_i that B_i does not need; what remains, ``saved_i`` bytes (the kept part
  of x_i and the extra), is the stage's saved tensor: the unit that is offloaded and
  prefetched, freed when B_i ends;
- a forward that keeps only its input (``Fc``, a checkpoint) frees its extra at its end and
  holds all of x_i until B_i ends: x_i is then the stage's movable tensor (its checkpoint),
  which an offload may move to the host once Fc_i has started (released when Fc_i ends) and a
  prefetch must bring back before R_i, the first operation that reads it again; a forward
  that saves nothing (``Fn``) frees its extra and x_i at its end, and nothing of it moves;
- a recomputation (``R``) is a forward run again before B_i: it allocates like a forward,
  and its extra (and, after an ``Fn``, the kept part of its input, which the
  recomputation of stage i-1 produced) is stage i's recomputed data, freed when B_i ends
  (after an ``Fn`` it is the stage's tensor, but no transfer may move it); its output, when no
  recomputation of stage i+1 reads it, is freed at its end but for the part B_i needs;
- B_i allocates y_i (``grad_bytes``) and its workspace (and, for the last stage, the
  gradient of the output) and frees at its end the workspace, y_{i+1}, the saved tensor
  of stage i (and the last stage's output and its gradient; B_0 frees y_0 too);
- the part of x_{i+1} that B_i needs (``output_saved_bytes`` of stage i, counted in
  saved_{i+1}) stays when B_{i+1} frees saved_{i+1}, and is freed when B_i ends
  (papers/004 section 3.1: "B_i requires x_{i+1}, x_i and y_{i+1}"), provided B_i reads
  the same x_{i+1} as stage i+1 saved (not when one of the two is recomputed alone);
- the weights stay resident throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from harness.model import Algorithm, Profile, Schedule



@dataclass(frozen=True)
class StageMemory:
    """The sizes the operations of one stage deal in (one pass, one algorithm), in bytes."""

    input: int  # x_i
    saved: int  # saved_i: what the forward keeps for B_i
    output: int  # x_{i+1}; for the last stage the model output
    grad: int  # y_i
    grad_in: int  # y_{i+1}; for the last stage the output gradient
    held: int  # output_saved_bytes: the part of x_{i+1} that B_i needs
    fwd_workspace: int
    bwd_workspace: int
    first: bool
    last: bool

    @property
    def kept(self) -> int:
        """The part of x_i that is saved (and so outlives the forward)."""
        return min(self.input, self.saved)

    @property
    def extra(self) -> int:
        """What the forward saves beyond its input (allocated by the forward)."""
        return self.saved - self.kept

    @property
    def drop(self) -> int:
        """The part of x_i that B_i does not need: freed when a saving forward ends."""
        return self.input - self.kept

    @property
    def forward_resident(self) -> int:
        """Bytes the forward needs on the device before it starts: its input (x_0 excepted)."""
        return 0 if self.first else self.input

    @property
    def forward_alloc(self) -> int:
        """Bytes the forward allocates at its start: x_0 for stage 0, its output, workspace, extra."""
        return (self.input if self.first else 0) + self.output + self.fwd_workspace + self.extra

    @property
    def forward_need(self) -> int:
        """The forward's need, weights apart: max(x_i, saved_i) + x_{i+1} + workspace (papers/004 eq. (1))."""
        return self.forward_resident + self.forward_alloc

    @property
    def backward_resident(self) -> int:
        """Bytes B_i needs on the device before it starts: saved_i, its share of x_{i+1}, y_{i+1} (or the output)."""
        return self.saved + self.held + (self.output if self.last else self.grad_in)

    @property
    def backward_alloc(self) -> int:
        """Bytes B_i allocates at its start: y_i, its workspace (the last stage: the output gradient)."""
        return self.grad + self.bwd_workspace + (self.grad_in if self.last else 0)

    @property
    def backward_need(self) -> int:
        """B_i's need, weights apart: the C^B_i of papers/004 eq. (6) with h_i (its share of x_{i+1})."""
        return self.backward_resident + self.backward_alloc


def stage_memory(profile: Profile, i: int, algorithm: Algorithm | int = -1) -> StageMemory:
    """The sizes of stage ``i`` of ``profile`` with ``algorithm`` (an Algorithm, or an index; -1: the default)."""
    stages, n = profile.stages, profile.n_stages
    s = stages[i]
    if isinstance(algorithm, int):  # the stage's own figures are its default algorithm's
        a = s if algorithm < 0 else s.algorithms[algorithm]
    else:
        a = algorithm
    last = i == n - 1
    return StageMemory(
        input=s.input_bytes, saved=s.saved_bytes,
        output=profile.output_bytes if last else stages[i + 1].input_bytes,
        grad=s.grad_bytes, grad_in=profile.output_bytes if last else stages[i + 1].grad_bytes,
        held=s.output_saved_bytes, fwd_workspace=a.fwd_workspace, bwd_workspace=a.bwd_workspace,
        first=i == 0, last=last,
    )


class Block(NamedTuple):
    """One device allocation of a schedule, alive from operation ``born`` to the end of ``dies``.

    ``born_at_end``: allocated (or rather kept, as what remains of a freed tensor) when
    ``born`` ends instead of when it starts. ``tensor`` (``sub_batch * L + stage``, -1 for
    none): the saved tensor the block belongs to, which transfers may move and which is
    freed as a whole when its backward (``dies``) ends.
    """

    name: str
    size: int
    born: int
    dies: int
    born_at_end: bool = False
    tensor: int = -1
    sub_batch: int = 0
    stage: int = 0


@dataclass(frozen=True)
class PassOps:
    """Where the operations of one pass are in ``Schedule.ops``: per stage, its forward,
    recomputation (None when it is not recomputed) and backward, and the forward's kind."""

    forward: tuple[int, ...]
    kind: tuple[str, ...]
    recompute: tuple[int | None, ...]
    backward: tuple[int, ...]

    def producer(self, i: int) -> int:
        """The operation that creates stage i's tensor: its forward for ``F`` (the saved data) and
        ``Fc`` (the checkpoint x_i), its recomputation for ``Fn``."""
        r = self.recompute[i]
        return self.forward[i] if r is None or self.kind[i] == "Fc" else r

    def reader(self, i: int) -> int:
        """The first operation that reads stage i's tensor after its producer: R_i for a checkpoint
        (``Fc``), else B_i. A prefetch of the tensor must be over before it starts."""
        return self.recompute[i] if self.kind[i] == "Fc" else self.backward[i]


def movable_bytes(m: StageMemory, kind: str) -> int:
    """What a forward of ``kind`` leaves on the device until its stage's recomputation or backward,
    which is also what a transfer of the stage moves when its ``nbytes`` is None: an ``F`` stage's
    saved data (saved_i), an ``Fc`` stage's checkpoint (all of x_i); an ``Fn`` stage keeps nothing."""
    return {"F": m.saved, "Fc": m.input, "Fn": 0}[kind]


def pass_ops(schedule: Schedule, n_stages: int) -> list[PassOps]:
    """The operations of every pass of ``schedule`` (one that is well formed: see ``harness.validate``)."""
    n_sb = max(schedule.sub_batches, 1)
    fwd = [[-1] * n_stages for _ in range(n_sb)]
    kind = [["F"] * n_stages for _ in range(n_sb)]
    rec: list[list[int | None]] = [[None] * n_stages for _ in range(n_sb)]
    bwd = [[-1] * n_stages for _ in range(n_sb)]
    for k, op in enumerate(schedule.ops):
        if op.kind == "B":
            bwd[op.sub_batch][op.stage] = k
        elif op.kind == "R":
            rec[op.sub_batch][op.stage] = k
        else:
            fwd[op.sub_batch][op.stage] = k
            kind[op.sub_batch][op.stage] = op.kind
    return [PassOps(tuple(f), tuple(c), tuple(r), tuple(b)) for f, c, r, b in zip(fwd, kind, rec, bwd)]


def schedule_blocks(schedule: Schedule, passes: list[Profile]) -> list[Block]:
    """Every device block of one iteration of ``schedule`` (weights apart), by operation index.

    ``passes`` holds the profile of each sub-batch pass (``harness.simulate.lowering.pass_profiles``).
    Blocks come stage by stage in a fixed order (a memory trace's block ids follow it);
    zero-byte blocks are included.
    """
    n = passes[0].n_stages
    blocks: list[Block] = []
    for sb, (ops, p) in enumerate(zip(pass_ops(schedule, n), passes)):
        mem = [stage_memory(p, i, schedule.algorithm_of(i)) for i in range(n)]
        tag = f"/{sb}" if sb else ""
        for i, m in enumerate(mem):
            blocks += _stage_blocks(i, m, mem[i - 1] if i else None, ops, sb, n, tag)
        f_last, b_last = ops.forward[n - 1], ops.backward[n - 1]
        blocks.append(Block(f"out{tag}", p.output_bytes, f_last, b_last, sub_batch=sb, stage=n - 1))
        blocks.append(Block(f"grad_out{tag}", p.output_bytes, b_last, b_last, sub_batch=sb, stage=n - 1))
        r = ops.recompute[n - 1]
        if r is not None:  # the recomputed output: nothing of it is needed past its recomputation
            blocks.append(Block(f"out.recomputed{tag}", p.output_bytes, r, r, sub_batch=sb, stage=n - 1))
    return blocks


def _stage_blocks(i: int, m: StageMemory, prev: StageMemory | None, ops: PassOps, sb: int, n: int,
                  tag: str) -> list[Block]:
    """The blocks of stage i: its input x_i, workspaces, gradient y_i, saved data, and their variants."""
    t = sb * n + i
    f, b, r, kind = ops.forward[i], ops.backward[i], ops.recompute[i], ops.kind[i]
    born = ops.forward[i - 1] if i else f  # x_i: the output of the forward before
    y_gone = ops.backward[i - 1] if i else b
    # B_{i-1} reads the x_i the forward pass made unless stage i-1 is recomputed
    prev_reads_forward = i > 0 and ops.recompute[i - 1] is None
    held = prev.held if prev is not None else 0

    def block(name: str, size: int, start: int, end: int, *, at_end: bool = False, tensor: int = -1) -> Block:
        return Block(f"{name}{tag}", size, start, end, at_end, tensor, sb, i)

    out: list[Block] = []
    if kind == "F":
        out.append(block(f"x{i}.drop", m.drop, born, f))
    out.append(block(f"wF{i}", m.fwd_workspace, f, f))
    out.append(block(f"wB{i}", m.bwd_workspace, b, b))
    out.append(block(f"y{i}", m.grad, b, y_gone))
    if kind == "F":
        out.append(block(f"x{i}", m.kept, born, b, tensor=t))
        out.append(block(f"saved{i}.extra", m.extra, f, b, tensor=t))
        if prev_reads_forward:  # the part of x_i that B_{i-1} needs outlives saved_i
            out.append(block(f"x{i}.held", held, b, ops.backward[i - 1], at_end=True))
        return out
    # the forward does not save: what it computes beyond its input lives only while it runs
    out.append(block(f"saved{i}.transient", m.extra, f, f))
    share = held if prev_reads_forward else 0  # B_{i-1}'s share of x_i (within x_i in a consistent profile)
    if kind == "Fc":  # the checkpoint: all of x_i until B_i, the stage's movable tensor
        out.append(block(f"x{i}.checkpoint", m.input, born, b, tensor=t))
        if share:
            out.append(block(f"x{i}.held", share, b, ops.backward[i - 1], at_end=True))
    else:  # Fn: x_i goes when the forward ends, but for the share B_{i-1} reads
        out.append(block(f"x{i}.forward", max(0, m.input - share), born, f))
        if share:
            out.append(block(f"x{i}.held", share, born, ops.backward[i - 1]))
    if r is None:
        return out
    # the recomputation: workspace, the recreated saved data, and x_i when stage i-1's recomputation made it
    out.append(block(f"wR{i}", m.fwd_workspace, r, r))
    # after an Fc the tensor is the checkpoint: the recreated extra is freed with B_i, not moved
    out.append(block(f"saved{i}.extra", m.extra, r, b, tensor=t if kind == "Fn" else -1))
    if kind == "Fn":
        r_prev = ops.recompute[i - 1]
        out.append(block(f"x{i}.recomputed.drop", m.drop, r_prev, r))
        out.append(block(f"x{i}", m.kept, r_prev, b, tensor=t))
        if held:  # B_{i-1} reads this x_i (its stage was recomputed too)
            out.append(block(f"x{i}.held", held, b, ops.backward[i - 1], at_end=True))
    # x_{i+1} as recomputed here, when no recomputation of stage i+1 reads it: B_i keeps its share
    feeds_next = i + 1 < n and ops.kind[i + 1] == "Fn" and ops.recompute[i + 1] is not None
    if i + 1 < n and not feeds_next:
        out.append(block(f"x{i + 1}.recomputed", max(0, m.output - m.held), r, r))
        out.append(block(f"x{i + 1}.recomputed.held", m.held, r, b))
    return out


def schedule_needs(schedule: Schedule, passes: list[Profile]) -> list[int]:
    """Bytes each operation of ``schedule`` needs on the device (weights apart) when every saved
    tensor that may be away is away: what is live while it runs, less the tensors whose producer
    has ended and whose reader (``PassOps.reader``: R_i for a checkpoint, else B_i) has not begun."""
    n = passes[0].n_stages
    blocks = schedule_blocks(schedule, passes)
    window = {sb * n + i: (ops.producer(i), ops.reader(i))
              for sb, ops in enumerate(pass_ops(schedule, n)) for i in range(n)}
    needs = [0] * len(schedule.ops)
    for bl in blocks:
        first = bl.born + 1 if bl.born_at_end else bl.born
        for k in range(first, bl.dies + 1):
            movable = bl.tensor >= 0 and window[bl.tensor][0] < k < window[bl.tensor][1]
            if not movable:
                needs[k] += bl.size
    return needs


@dataclass(frozen=True)
class SavedData:
    """What a schedule does with the saved data of one iteration (every sub-batch pass), in bytes.

    The saved data of stage i in a pass is ``saved_i`` (``Stage.saved_bytes``): what its
    forward keeps for B_i. Each of those bytes is counted once, in one of three parts, so
    ``kept + offloaded + recomputed == total`` (the sum of ``saved_i`` over stages and passes):

    - ``recomputed``: re-created by a recomputation R_i before B_i. A stage whose forward saves
      nothing (``Fn``) has all of saved_i recomputed; a checkpoint (``Fc``) keeps the part of its
      input x_i that is saved (``StageMemory.kept``, held on the device as the checkpoint) and
      has the rest (``StageMemory.extra``) recomputed;
    - ``offloaded``: of what remains, the bytes the schedule's offload transfers of that stage and
      pass move to the host (``Transfer.nbytes``, when None all the stage moves: ``movable_bytes``;
      a tensor offloaded in parts counts the parts' sum, at most what remains). An offloaded
      checkpoint counts here: the kept part of x_i is away from Fc_i to R_i;
    - ``kept``: the rest, which stays on the device from its forward to B_i.

    ``recompute_s`` is the forward time of the recomputations (each R at its stage's algorithm);
    ``recompute_s / ideal time`` is the share of the iteration spent computing again.
    """

    kept: int
    offloaded: int
    recomputed: int
    recompute_s: float

    @property
    def total(self) -> int:
        """Every saved byte of the iteration: kept + offloaded + recomputed."""
        return self.kept + self.offloaded + self.recomputed


def saved_data(schedule: Schedule, passes: list[Profile]) -> SavedData:
    """How ``schedule`` keeps, offloads and recomputes its saved data (``SavedData``).

    ``passes`` holds the profile of each sub-batch pass (``harness.simulate.lowering.pass_profiles``),
    as for ``schedule_blocks``.
    """
    n = passes[0].n_stages
    all_ops = pass_ops(schedule, n)
    moved: dict[tuple[int, int], int] = {}
    for tr in schedule.transfers:
        if tr.direction == "offload":
            p, kind = passes[tr.sub_batch], all_ops[tr.sub_batch].kind[tr.stage]
            size = movable_bytes(stage_memory(p, tr.stage, schedule.algorithm_of(tr.stage)), kind) \
                if tr.nbytes is None else tr.nbytes
            moved[tr.sub_batch, tr.stage] = moved.get((tr.sub_batch, tr.stage), 0) + int(size)
    kept = offloaded = recomputed = 0
    recompute_s = 0.0
    for sb, (ops, p) in enumerate(zip(all_ops, passes)):
        for i in range(n):
            m = stage_memory(p, i, schedule.algorithm_of(i))
            again = 0
            if ops.recompute[i] is not None:
                again = m.extra if ops.kind[i] == "Fc" else m.saved if ops.kind[i] == "Fn" else 0
                recompute_s += p.stages[i].algorithm(schedule.algorithm_of(i)).fwd_time
            away = min(m.saved - again, moved.get((sb, i), 0))
            recomputed, offloaded, kept = recomputed + again, offloaded + away, kept + m.saved - again - away
    return SavedData(kept, offloaded, recomputed, recompute_s)


# --------------------------------------------------------------------------- checkpointed segments


def saving_need(m: StageMemory) -> int:
    """The peak of a stage that saves (``F``), above what the stages before it keep: its forward's
    or its backward's need (the B_i share of x_{i+1} is in ``backward_need``, whoever made it)."""
    return max(m.forward_need, m.backward_need)


def segment_needs(mem: list[StageMemory]) -> np.ndarray:
    """The peak of every segment [a, b) checkpointed at a (``harness.schedules.recompute_ops``:
    Fc_a, Fn inside, R_a..R_{b-1} before B_{b-1}) above what the stages before a keep
    (``movable_bytes``), weights apart: an (L, L + 1) int64 array, entry [a, b] for a < b <= L;
    the larger of its two phases (``segment_phase_needs``).
    """
    forward, backward = segment_phase_needs(mem)
    return np.maximum(forward, backward)


def segment_phase_needs(mem: list[StageMemory]) -> tuple[np.ndarray, np.ndarray]:
    """The needs of every segment [a, b) checkpointed at a, by phase: (forward, backward), two
    (L, L + 1) int64 arrays, entry [a, b] for a < b <= L. Forward: the most Fc_a, Fn_{a+1}..Fn_{b-1}
    need; backward: the most R_a..R_{b-1}, B_{b-1}..B_a need. Both are above what the other stages
    keep (weights apart): the stages before a (``movable_bytes``) under a pure recomputation
    schedule, or whatever a planner that offloads leaves of them (the segment's own recomputed
    data is never offloaded).

    ``mem``: ``stage_memory`` of every stage. From the blocks of ``schedule_blocks``, with
    S(k) = saved_{a+1} + ... + saved_{k-1} and cp_a = x_a + extra_a (the checkpoint and the
    extra its recomputation adds), the operations of the segment hold above that prefix:

    - F_a: its forward need; Fn_k: x_a and its forward need;
    - R_a: y_b (B_{b-1}'s incoming gradient; the model output when b = L) and its forward
      need; R_k, k > a: y_b, cp_a, S(k) and its forward need; R_{b-1} holds its output as the
      part B_{b-1} keeps and the rest, so max(x_b, h_{b-1}) where the forward need has x_b;
    - B_k, k > a: cp_a, S(k) and its backward need; B_a: its backward need and drop_a (the part
      of the checkpoint its saved data does not cover).

    Nothing of the stages from b on is live then but y_b (no share of x_b outlives B_b: stage
    b-1 is recomputed). Each row is running maxima over b (O(L) numpy per row).
    """
    n = len(mem)
    forward_table = np.zeros((n, n + 1), dtype=np.int64)
    backward_table = np.zeros((n, n + 1), dtype=np.int64)
    if n == 0:
        return forward_table, backward_table

    def column(f) -> np.ndarray:
        return np.array([f(m) for m in mem], dtype=np.int64)

    fn, bn, saved = column(lambda m: m.forward_need), column(lambda m: m.backward_need), column(lambda m: m.saved)
    grad_in = column(lambda m: m.grad_in)
    # R_k as a segment's last recomputation: its output is B_k's share and the rest (no x_L to split)
    last = fn + column(lambda m: 0 if m.last else max(m.output, m.held) - m.output)
    before = np.concatenate([[0], np.cumsum(saved)])  # before[j] = saved_0 + ... + saved_{j-1}
    for a in range(n):
        ma = mem[a]
        cp = ma.input + ma.extra
        k = np.arange(a + 1, n)  # the stages after a
        above = cp + before[k] - before[a + 1]  # cp_a + S(k)
        fwd = np.maximum.accumulate(np.concatenate([[ma.forward_need], ma.input + fn[k]]))
        bwd = np.maximum.accumulate(np.concatenate([[ma.drop + ma.backward_need], above + bn[k]]))
        # the R_j, j < k, whose output is whole (R_a's and the inside ones'), before each k
        earlier = np.maximum.accumulate(np.concatenate([[0, ma.forward_need], above[:-1] + fn[k[:-1]]]))[:n - a]
        final = np.concatenate([[last[a]], above + last[k]])
        forward_table[a, a + 1:] = fwd
        backward_table[a, a + 1:] = np.maximum(bwd, grad_in[a:] + np.maximum(earlier, final))
    return forward_table, backward_table


def recompute_peak(profile: Profile, segments: list[tuple[int, int]] | tuple = ()) -> int:
    """The peak device bytes (weights apart) of ``recompute_ops(L, segments)`` run with no transfers:
    over the pieces (a saving stage, or a segment) the prefix the stages before keep plus the piece's
    need (``saving_need``, ``segment_needs``)."""
    mem = [stage_memory(profile, i) for i in range(profile.n_stages)]
    return pieces_peak([saving_need(m) for m in mem], [movable_bytes(m, "F") for m in mem],
                       segment_needs(mem) if segments else None, [movable_bytes(m, "Fc") for m in mem], segments)


def pieces_peak(saving: Sequence[int], keep_saved: Sequence[int], segment: Any,
                keep_checkpoint: Sequence[int], segments: Iterable[tuple[int, int]]) -> int:
    """``recompute_peak``'s walk on tables a planner already has: per stage its ``saving_need`` and
    ``movable_bytes`` (``F`` and ``Fc``), and ``segment[a, b]`` the ``segment_needs`` table (or
    any table in the same bytes, e.g. rounded); the pieces left to right, each the prefix the
    pieces before keep plus its own need."""
    start = dict(segments)
    peak = prefix = i = 0
    while i < len(saving):
        b = start.get(i)
        if b is None:
            peak = max(peak, prefix + int(saving[i]))
            prefix += int(keep_saved[i])
            i += 1
        else:
            peak = max(peak, prefix + int(segment[i, b]))
            prefix += int(keep_checkpoint[i])
            i = b
    return peak
