"""vDNN++'s realiser (papers/001 section 4.3, "vDNNExt"): vDNN's choices without its stream synchronisation.

The offloads and prefetches are vDNN's (same layers, same issue points, Figure 6), but
no transfer is awaited at the end of a layer: the next layer starts at once, and only a
layer whose own saved data is still on its way back waits for it (the simulator makes
B_i wait for its data). Memory is capped at vDNN's peak for the same configuration
("a solution which removes the synchronization while having peak memory consumption same
as that of vDNN", section 4.1): an allocation that would exceed it stalls until offloads
release memory (section 4.2), and an offloaded tensor is released once both its copy and
the forward that reads it are done (the simulator's release rule).

The cap is the schedule's ``budget_bytes`` (at most the budget asked for), which is what
the executors enforce. A budget below vDNN's peak is tried as it is: the run then waits
on memory more often, and the configuration fits when the simulated trial completes.
"""

from __future__ import annotations

from typing import Any

from harness.model import Profile

from membudget_vdnn.schedule import Attempt, fits, unconstrained_peak, vdnn_schedule


def asynchronous(profile: Profile, budget: int, offloaded: tuple[int, ...], algorithms: tuple[int, ...], *,
                 planner: str, duplex: bool = False, options: dict[str, Any] | None = None) -> Attempt:
    """vDNN++'s realiser: the unsynchronised schedule capped at min(budget, vDNN's peak)."""
    reference = vdnn_schedule(profile, budget, offloaded, algorithms=algorithms, sync=True)
    vdnn_peak = unconstrained_peak(reference, profile, duplex)
    cap = min(int(budget), vdnn_peak)
    schedule = vdnn_schedule(
        profile, cap, offloaded, algorithms=algorithms, sync=False, planner=planner,
        options={**(options or {}), "sync": False, "vdnn_peak": vdnn_peak},
        notes="vDNN++: no end-of-layer waits; memory capped at vDNN's peak (papers/001 section 4.3)",
    )
    return Attempt(schedule if fits(schedule, profile, duplex) else None, vdnn_peak)
