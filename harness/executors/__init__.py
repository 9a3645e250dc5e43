"""Built-in executors: the event simulator (and the torch executor)."""


def register_builtin(register):
    """Register the built-in executors."""
    from harness.simulate.executor import Simulator

    register(Simulator())
