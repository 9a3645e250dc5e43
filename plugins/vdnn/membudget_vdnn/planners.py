"""The vDNN planners: static vDNN_all / vDNN_conv and dynamic vDNN_dyn (papers/001 section 3.4).

Each planner takes a *realiser* (``membudget_vdnn.schedule``): vDNN's synchronous one
here; membudget-vdnnpp builds the vDNN++ planners from the same classes with its own.
"""

from __future__ import annotations

from harness.bounds import peak_memory
from harness.errors import InfeasibleBudget
from harness.model import Profile, Schedule
from harness.options import choice_option
from harness.schedules import check_budget, keep_all_schedule
from harness.units import format_bytes

from membudget_vdnn.dynamic import cached_trial, dynamic_plan
from membudget_vdnn.policy import ALGORITHM_MODES, AlgorithmMode, OffloadPolicy, algorithm_choice, offload_set
from membudget_vdnn.schedule import Attempt, Realiser, synchronous


def refuse(planner: str, profile: Profile, budget: int, attempt: Attempt, what: str,
           keep_all_at_peak: bool = True) -> InfeasibleBudget:
    """The error for a configuration that does not fit: what it needs and what the budget is.

    ``needed_bytes`` is the least budget the planner runs at: the configuration's need, or the keep-all
    peak when that is smaller and the planner runs keep-all there (``keep_all_at_peak``): with
    algorithms of large workspace the offloading configuration can need more than the plain iteration.
    """
    peak = peak_memory(profile)
    needed = min(attempt.needed, peak) if keep_all_at_peak else attempt.needed
    also = (f", or the keep-all peak {peak} bytes ({format_bytes(peak)}) without offloading"
            if needed < attempt.needed else "")
    return InfeasibleBudget(
        f"infeasible: {planner} needs at least {attempt.needed} bytes ({format_bytes(attempt.needed)}) "
        f"with {what}{also} for {profile.model} at batch {profile.batch_size}; "
        f"the budget is {budget} bytes ({format_bytes(budget)})",
        needed_bytes=needed,
    )


class StaticVdnn:
    """Static vDNN (papers/001 section 3.4): offload every layer (``all``) or every CONV layer (``conv``).

    Options: ``algorithms`` (``performance``: fastest, the default; ``memory``: least
    workspace; ``default``: the profile's), ``always`` (apply the policy even when the
    whole iteration fits the budget; by default such a budget gets the plain keep-all
    iteration, as a memory manager only steps in when memory is short), ``duplex``.
    """

    def __init__(self, policy: OffloadPolicy, *, name: str, description: str, realise: Realiser = synchronous):
        self.policy = policy
        self.name = name
        self.description = description
        self.realise = realise

    def plan(self, profile: Profile, budget_bytes: int, algorithms: AlgorithmMode = "performance",
             always: bool = False, duplex: bool = False, **options) -> Schedule:
        """The vDNN_{policy} schedule for ``budget_bytes``; ``InfeasibleBudget`` when it does not fit."""
        choice_option(self.name, "algorithms", algorithms, ALGORITHM_MODES)
        check_budget(profile, budget_bytes, self.name, memory_optimal=True)
        if not always and peak_memory(profile) <= budget_bytes:
            return keep_all_schedule(profile, budget_bytes, self.name)
        attempt = self.realise(
            profile, budget_bytes, offload_set(profile, self.policy), algorithm_choice(profile, algorithms),
            planner=self.name, duplex=duplex, options={"offload": self.policy, "algorithms": algorithms},
        )
        if not attempt.ok:
            raise refuse(self.name, profile, budget_bytes, attempt, f"{algorithms}-optimal algorithms"
                         if algorithms != "default" else "default algorithms", keep_all_at_peak=not always)
        return attempt.schedule


class DynamicVdnn:
    """vDNN_dyn (papers/001 section 3.4): profiling passes pick the offload policy and the algorithms.

    Options: ``duplex`` (copy engines per direction in the trials).
    """

    def __init__(self, *, name: str, description: str, realise: Realiser = synchronous):
        self.name = name
        self.description = description
        self.realise = realise

    def plan(self, profile: Profile, budget_bytes: int, duplex: bool = False, **options) -> Schedule:
        """Adopt the first configuration of the passes whose simulated trial fits ``budget_bytes``."""
        check_budget(profile, budget_bytes, self.name, memory_optimal=True)
        trial = cached_trial(profile, self.realise, budget_bytes, planner=self.name, duplex=duplex)
        attempt, trainable = dynamic_plan(profile, trial)
        if not trainable:
            if peak_memory(profile) <= budget_bytes:  # "memory-optimal" algorithms that need more than the defaults
                return keep_all_schedule(profile, budget_bytes, self.name)
            raise refuse(self.name, profile, budget_bytes, attempt,
                         "vDNN_all and memory-optimal algorithms, its least-memory configuration")
        return attempt.schedule
