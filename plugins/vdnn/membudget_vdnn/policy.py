"""vDNN's choices, as papers/001 section 3 describes them: what to offload, when to prefetch, which algorithm.

- offload sets: vDNN_all offloads every layer's saved data, vDNN_conv only that of CONV
  layers (papers/001 section 3.4, "Static vDNN"); a stage of kind ``conv`` is a CONV layer
  and stages with nothing saved are never offloaded (there is nothing to move);
- prefetch: Figure 6's ``findPrefetchLayer``: when layer m's backward starts, search the
  layers below it for the closest one offloaded and not yet prefetched, but no further
  than the closest CONV layer; at most one prefetch per layer. The start of the backward
  pass acts as layer L (it may prefetch the last layer);
- algorithms: "memory-optimal" is the alternative with the least workspace, "performance-
  optimal" the fastest (papers/001 section 3.4); the stage default counts as a candidate.
"""

from __future__ import annotations

from typing import Literal

from harness.model import Algorithm, Profile, Stage

OffloadPolicy = Literal["none", "conv", "all"]
AlgorithmMode = Literal["default", "memory", "performance"]
OFFLOAD_POLICIES: tuple[str, ...] = ("none", "conv", "all")
ALGORITHM_MODES: tuple[str, ...] = ("default", "memory", "performance")


def offload_set(profile: Profile, policy: OffloadPolicy) -> tuple[int, ...]:
    """The stages whose saved data vDNN_{policy} offloads (papers/001 section 3.4)."""
    if policy not in OFFLOAD_POLICIES:
        raise ValueError(f"unknown offload policy {policy!r}; choose one of {OFFLOAD_POLICIES}")
    if policy == "none":
        return ()
    return tuple(
        i for i, s in enumerate(profile.stages)
        if s.saved_bytes > 0 and (policy == "all" or s.kind == "conv")
    )


def find_prefetch_layer(profile: Profile, current: int, offloaded: set[int], prefetched: set[int]) -> int | None:
    """papers/001 Figure 6: the layer whose prefetch layer ``current`` issues, or None.

    Searches ``current - 1`` down to 0 for the closest layer offloaded and not yet
    prefetched (and marks it prefetched); gives up at the first CONV layer that is not
    such a layer (Figure 6, lines 13-15).
    """
    for layer in range(current - 1, -1, -1):
        if layer in offloaded and layer not in prefetched:
            prefetched.add(layer)
            return layer
        if profile.stages[layer].kind == "conv":
            return None
    return None


def prefetch_plan(profile: Profile, offloaded: tuple[int, ...] | set[int]) -> list[tuple[int, int]]:
    """(stage, issuing layer) for every prefetch, in issue order (backward start = layer L).

    Every offloaded stage i is prefetched by layer i + 1 at the latest, since the search
    starts just below the current layer.
    """
    wanted, done = set(offloaded), set()
    plan = []
    for current in range(profile.n_stages, 0, -1):
        layer = find_prefetch_layer(profile, current, wanted, done)
        if layer is not None:
            plan.append((layer, current))
    return plan


def _candidates(stage: Stage) -> list[tuple[int, Algorithm]]:
    return [(-1, stage.algorithm(-1)), *enumerate(stage.algorithms)]


def _workspace_key(a: Algorithm) -> tuple[int, int]:
    return max(a.fwd_workspace, a.bwd_workspace), a.fwd_workspace + a.bwd_workspace


def memory_optimal(stage: Stage) -> int:
    """The index of the stage's least-workspace algorithm (ties: the faster; -1 the default)."""
    return min(_candidates(stage), key=lambda c: (_workspace_key(c[1]), c[1].fwd_time + c[1].bwd_time))[0]


def performance_optimal(stage: Stage) -> int:
    """The index of the stage's fastest algorithm (ties: the one with less workspace)."""
    return min(_candidates(stage), key=lambda c: (c[1].fwd_time + c[1].bwd_time, _workspace_key(c[1])))[0]


def downgrade_path(stage: Stage) -> list[int]:
    """The stage's algorithms from the fastest down to the memory-optimal one (vDNN_dyn's pass 3).

    Each step is slower but uses less workspace than every faster step (the time/workspace
    Pareto front), so the path ends at ``memory_optimal(stage)``.
    """
    ordered = sorted(_candidates(stage), key=lambda c: (c[1].fwd_time + c[1].bwd_time, _workspace_key(c[1])))
    path: list[int] = []
    best = None
    for index, algo in ordered:
        key = _workspace_key(algo)
        if best is None or key < best:
            path.append(index)
            best = key
    return path


def algorithm_choice(profile: Profile, mode: AlgorithmMode) -> tuple[int, ...]:
    """Per-stage algorithm indices for ``mode`` (empty for the defaults everywhere)."""
    if mode not in ALGORITHM_MODES:
        raise ValueError(f"unknown algorithm mode {mode!r}; choose one of {ALGORITHM_MODES}")
    if mode == "default":
        return ()
    pick = memory_optimal if mode == "memory" else performance_optimal
    return normalise(tuple(pick(s) for s in profile.stages))


def normalise(algorithms: tuple[int, ...]) -> tuple[int, ...]:
    """The canonical form of an algorithm tuple: empty when every stage uses its default."""
    return () if all(a == -1 for a in algorithms) else tuple(algorithms)
