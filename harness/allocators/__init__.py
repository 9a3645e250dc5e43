"""Built-in allocators: place the blocks of a memory trace in one arena."""


def register_builtin(register):
    """Register the built-in allocators."""
