"""vDNN_dyn: the profiling passes of papers/001 section 3.4, each a simulated trial.

1. vDNN_all with memory-optimal algorithms: can the network be trained at all?
2. no offloading, fastest algorithms; if that fails, vDNN_conv then vDNN_all with the
   fastest algorithms;
3. the greedy per-layer downgrade: walking the layers in order, each takes the fastest
   algorithm that does not overflow the memory, stepping down towards the memory-
   optimal one; tried with vDNN_conv, then vDNN_all; then vDNN_conv with memory-optimal
   algorithms everywhere; else back to pass 1's configuration.

The first configuration whose trial passes is adopted. A trial is the realiser's verdict
(for vDNN: the unconstrained peak fits the budget), so vDNN and vDNN++ share this code.
"""

from __future__ import annotations

from typing import Callable

from harness.model import Profile

from membudget_vdnn.policy import (
    OffloadPolicy, algorithm_choice, downgrade_path, memory_optimal, normalise, offload_set,
)
from membudget_vdnn.schedule import Attempt

Trial = Callable[[OffloadPolicy, tuple[int, ...], str], Attempt]


def greedy_downgrade(profile: Profile, policy: OffloadPolicy, trial: Trial) -> Attempt | None:
    """Pass 3's greedy: per layer, the fastest algorithm that fits, layers not yet visited memory-optimal.

    The layers after the current one keep their memory-optimal algorithm during its trial,
    so a choice made for an earlier layer never makes a later one impossible.
    """
    label = f"{policy}(greedy)"
    chosen = [memory_optimal(s) for s in profile.stages]
    last: Attempt | None = None
    for i, stage in enumerate(profile.stages):
        path = downgrade_path(stage)
        if len(path) == 1:
            continue
        for index in path:
            chosen[i] = index
            attempt = trial(policy, normalise(tuple(chosen)), label)
            if attempt.ok:
                last = attempt
                break
        else:
            return None  # not even the memory-optimal algorithm fits: no later layer can help
    if last is None:  # no layer had a choice to make
        last = trial(policy, normalise(tuple(chosen)), label)
    return last if last.ok else None


def dynamic_plan(profile: Profile, trial: Trial) -> tuple[Attempt, bool]:
    """Run the passes in order; the adopted attempt, and whether the network is trainable at all.

    When pass 1 fails the network cannot be trained (papers/001: it "requires the least GPU
    memory"); the returned attempt is then pass 1's, whose ``needed`` says how much it takes.
    """
    memory = algorithm_choice(profile, "memory")
    fastest = algorithm_choice(profile, "performance")
    trainable = trial("all", memory, "all(m)")
    if not trainable.ok:
        return trainable, False
    for policy, algorithms, label in (("none", fastest, "base(p)"), ("conv", fastest, "conv(p)"),
                                      ("all", fastest, "all(p)")):
        attempt = trial(policy, algorithms, label)
        if attempt.ok:
            return attempt, True
    for policy in ("conv", "all"):
        attempt = greedy_downgrade(profile, policy, trial)
        if attempt is not None:
            return attempt, True
    attempt = trial("conv", memory, "conv(m)")
    return (attempt if attempt.ok else trainable), True


def cached_trial(profile: Profile, realise: Callable[..., Attempt], budget: int, *, planner: str,
                 duplex: bool = False) -> Trial:
    """A ``Trial`` over ``realise`` that runs each (policy, algorithms) configuration once."""
    seen: dict[tuple[str, tuple[int, ...]], Attempt] = {}

    def trial(policy: OffloadPolicy, algorithms: tuple[int, ...], label: str) -> Attempt:
        key = (policy, algorithms)
        if key not in seen:
            seen[key] = realise(profile, budget, offload_set(profile, policy), algorithms, planner=planner,
                                duplex=duplex, options={"offload": policy, "pass": label})
        return seen[key]

    return trial
