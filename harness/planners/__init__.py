"""Built-in planners (``keep-all``, the torch peers)."""


def register_builtin(register):
    """Register the built-in planners: keep-all and the PyTorch peers (save_on_cpu, checkpointing)."""
    from harness.planners.keep_all import KeepAll
    from harness.planners.torch_peers import TorchCheckpoint, TorchSaveOnCpu

    register(KeepAll())
    register(TorchSaveOnCpu())
    register(TorchCheckpoint())
