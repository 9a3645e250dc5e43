"""moDNN (papers/000, Chen, Chen, Hu, DATE 2018) as a membudget plugin: planners ``modnn`` and ``vdnn-plus``."""

from harness import hookimpl

from membudget_modnn.planner import MoDNN, VDNNPlus
from membudget_modnn.subbatch import ideal_memory, m_min, select_sub_batch

__all__ = ["MoDNN", "VDNNPlus", "ideal_memory", "m_min", "select_sub_batch"]


@hookimpl
def membudget_register_planners(register):
    """Register ``modnn`` and ``vdnn-plus``."""
    register(MoDNN())
    register(VDNNPlus())


@hookimpl
def membudget_register_models(register):
    """Register the model factory for ``modnn:vgg101`` and ``modnn:fcn32s``."""
    from membudget_modnn.models import ModnnModels

    register(ModnnModels())
