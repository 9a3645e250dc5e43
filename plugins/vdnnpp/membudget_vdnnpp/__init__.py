"""vDNN++ as a membudget plugin: planners ``vdnnpp-all``, ``vdnnpp-conv``, ``vdnnpp-dyn``.

papers/001 section 4 ("vDNNExt"): vDNN's offload and prefetch choices (reused from
membudget-vdnn) without the end-of-layer synchronisation of the two streams.
"""

from harness import hookimpl
from membudget_vdnn import DynamicVdnn, StaticVdnn

from membudget_vdnnpp.realise import asynchronous

__all__ = ["asynchronous", "planners"]


def planners() -> list:
    """The three vDNN++ planners this plugin registers."""
    return [
        StaticVdnn("all", name="vdnnpp-all", realise=asynchronous,
                   description="vDNN++ all: offload every layer, no per-layer sync, vDNN's peak (papers/001 sec. 4)"),
        StaticVdnn("conv", name="vdnnpp-conv", realise=asynchronous,
                   description="vDNN++ conv: offload every CONV layer, no per-layer sync (papers/001 sec. 4)"),
        DynamicVdnn(name="vdnnpp-dyn", realise=asynchronous,
                    description="vDNN++ dyn: vDNN_dyn's profiling passes without per-layer sync (papers/001 sec. 3.4, 4)"),
    ]


@hookimpl
def membudget_register_planners(register):
    """Register the vDNN++ planners."""
    for planner in planners():
        register(planner)
