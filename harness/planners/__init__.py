"""Built-in planners (``keep-all``, the torch peers)."""


def register_builtin(register):
    """Register the built-in planners."""
    from harness.planners.keep_all import KeepAll

    register(KeepAll())
