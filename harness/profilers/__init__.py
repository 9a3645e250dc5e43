"""Built-in profilers: turn a workload into a chain ``Profile``."""


def register_builtin(register):
    """Register the built-in profilers."""
