"""vDNN as a membudget plugin: planners ``vdnn-all``, ``vdnn-conv``, ``vdnn-dyn`` and ``vdnn-chain``.

vDNN (Rhu et al.) as papers/001 section 3 describes it, with its per-layer stream
synchronisation expressed as transfer waits; ``vdnn-chain`` is the VDNN heuristic of
papers/004 section 6.1 for chains without layer kinds. The offload-choice functions and
planner classes are shared with membudget-vdnnpp.
"""

from harness import hookimpl

from membudget_vdnn.chain import VdnnChain, candidate_sets
from membudget_vdnn.dynamic import dynamic_plan, greedy_downgrade
from membudget_vdnn.planners import DynamicVdnn, StaticVdnn
from membudget_vdnn.policy import (
    algorithm_choice, downgrade_path, find_prefetch_layer, memory_optimal, offload_set, performance_optimal,
    prefetch_plan,
)
from membudget_vdnn.schedule import Attempt, synchronous, unconstrained_peak, vdnn_schedule

__all__ = [
    "Attempt", "DynamicVdnn", "StaticVdnn", "VdnnChain", "algorithm_choice", "candidate_sets",
    "downgrade_path", "dynamic_plan", "find_prefetch_layer", "greedy_downgrade", "memory_optimal",
    "offload_set", "performance_optimal", "planners", "prefetch_plan", "synchronous", "unconstrained_peak",
    "vdnn_schedule",
]


def planners() -> list:
    """The four vDNN planners this plugin registers."""
    return [
        StaticVdnn("all", name="vdnn-all",
                   description="vDNN_all: offload every layer, per-layer stream sync (Rhu et al.; papers/001 sec. 3)"),
        StaticVdnn("conv", name="vdnn-conv",
                   description="vDNN_conv: offload every CONV layer, per-layer stream sync (papers/001 sec. 3.4)"),
        DynamicVdnn(name="vdnn-dyn",
                    description="vDNN_dyn: profiling passes pick offloads and conv algorithms (papers/001 sec. 3.4)"),
        VdnnChain(),
    ]


@hookimpl
def membudget_register_planners(register):
    """Register the vDNN planners."""
    for planner in planners():
        register(planner)
