"""Sub-batch size selection (papers/000 section IV.A, eq. 1-3).

The tasks of moDNN's graph are the chain's operations F_i and B_i. A task holds its
inputs, its output and its workspace (eq. 1); in the chain model (``harness.memory``'s
forward and backward needs) that is, weights apart,

- F_i: x_i (or the saved data when it is larger), x_{i+1} and the forward workspace;
- B_i: the saved data of stage i, y_{i+1}, y_i and the backward workspace (the last
  stage: the output and its gradient instead of y_{i+1}).

``Schedule.algorithms`` holds one algorithm per stage, used by both F_i and B_i, so the
"baseline algorithm" of a stage is the one whose larger task is smallest, and the
"fastest" the one with the smallest F_i + B_i time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.errors import InfeasibleBudget
from harness.memory import stage_memory
from harness.model import Algorithm, Profile
from harness.units import format_bytes

MAX_ITERATIONS = 32


def candidates(profile: Profile, i: int) -> list[tuple[int, Algorithm]]:
    """Stage ``i``'s algorithms as (index, algorithm): the default (-1) first, then the alternatives."""
    stage = profile.stages[i]
    return [(-1, stage.algorithm(-1)), *enumerate(stage.algorithms)]


def task_bytes(profile: Profile, i: int, algorithm: Algorithm) -> tuple[int, int]:
    """eq. (1) for F_i and B_i of stage ``i`` with ``algorithm`` (weights excluded): ``harness.memory``'s needs."""
    m = stage_memory(profile, i, algorithm)
    return m.forward_need, m.backward_need


def baseline_algorithm(profile: Profile, i: int) -> int:
    """The memory-optimal algorithm of stage ``i`` (smallest larger task; ties: faster, then default)."""
    def key(item: tuple[int, Algorithm]):
        index, a = item
        return (max(task_bytes(profile, i, a)), a.fwd_time + a.bwd_time, index != -1, index)

    return min(candidates(profile, i), key=key)[0]


def fastest_algorithm(profile: Profile, i: int) -> int:
    """The fastest algorithm of stage ``i`` (ties: smaller tasks, then the default)."""
    def key(item: tuple[int, Algorithm]):
        index, a = item
        return (a.fwd_time + a.bwd_time, max(task_bytes(profile, i, a)), index != -1, index)

    return min(candidates(profile, i), key=key)[0]


def max_task_bytes(profile: Profile, fastest: bool) -> int:
    """max over tasks of eq. (1), with every stage's fastest or baseline algorithm."""
    pick = fastest_algorithm if fastest else baseline_algorithm
    return max(max(task_bytes(profile, i, profile.stages[i].algorithm(pick(profile, i))))
               for i in range(profile.n_stages))


def ideal_memory(profile: Profile) -> int:
    """papers/000 V: the "ideal case", a device "sufficient to hold all data involved during training".

    Every data block of the task graph at once: the weights (S_W), each stage's input
    and saved data, each gradient, every workspace of the default algorithms, the output
    and its gradient. (The keep-all peak, ``harness.bounds.peak_memory``, is smaller: it
    frees what the iteration no longer needs.)
    """
    mem = [stage_memory(profile, i) for i in range(profile.n_stages)]
    blocks = sum(m.input + m.extra + m.grad + m.fwd_workspace + m.bwd_workspace for m in mem)
    return profile.weight_bytes + blocks + mem[-1].output + mem[-1].grad_in  # the output and its gradient


def m_min(profile: Profile) -> int:
    """eq. (2): S_W plus the largest task at sub-batch 1 with baseline algorithms."""
    return profile.weight_bytes + max_task_bytes(profile.at_batch(1), fastest=False)


@dataclass(frozen=True)
class SubBatching:
    """The outcome of eq. (3): ``sub_batches`` passes of ``sub_batch`` samples each."""

    sub_batch: int
    sub_batches: int
    iterations: tuple[int, ...]  # the b of every round of eq. (3)
    profile: Profile  # the profile at ``sub_batch`` (measured variant or scaled)


def select_sub_batch(profile: Profile, budget: int, planner: str = "modnn") -> SubBatching:
    """eq. (3), iterated with profiling at the candidate size until b stops changing.

    Read as a fixed point: b_{k+1} = b_k (M - S_W) / max_t M_min(t, b_k), where
    M_min(t, b) uses the fastest algorithm's workspace (eq. 3's remark), so that b is
    the largest sub-batch whose heaviest task fits the budget with its fastest
    algorithm; each round re-profiles at b_k (``Profile.at_batch``: a measured variant
    when the profiler supplied one). A cycle ends at its smallest b. The batch is then
    split into n = ceil(B / b) equal passes, and n grows until the heaviest task with
    baseline algorithms fits (eq. 2 guarantees n = B does when M >= M_min).
    """
    need = m_min(profile)
    if budget < need:
        raise InfeasibleBudget(
            f"infeasible: {planner} needs at least {need} bytes ({format_bytes(need)}) for {profile.model} "
            f"(papers/000 eq. 2: sub-batch 1, baseline algorithms); the budget is {budget} bytes "
            f"({format_bytes(budget)})",
            needed_bytes=need,
        )
    batch, room = profile.batch_size, budget - profile.weight_bytes
    b, seen = batch, []
    for _ in range(MAX_ITERATIONS):
        seen.append(b)
        heaviest = max_task_bytes(profile.at_batch(b), fastest=True)
        nxt = batch if heaviest <= 0 else max(1, min(batch, math.floor(b * room / heaviest)))
        if nxt == b:
            break
        if nxt in seen:
            b = min(seen[seen.index(nxt):])
            break
        b = nxt
    n = math.ceil(batch / b)
    # the fixed point can stop below the largest fitting size (a cycle, or sizes that round
    # to nothing at small b): take fewer passes while the larger sub-batch still fits
    while n > 1 and max_task_bytes(profile.at_batch(math.ceil(batch / (n - 1))), fastest=True) <= room:
        n -= 1
    sub = math.ceil(batch / n)
    while sub > 1 and max_task_bytes(profile.at_batch(sub), fastest=False) > room:
        sub -= 1
    n = math.ceil(batch / sub)
    sub = math.ceil(batch / n)
    return SubBatching(sub, n, tuple(seen), profile.at_batch(sub))
