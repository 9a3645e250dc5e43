"""The model registry's built-in factories (torchvision, transformers)."""


def register_builtin(register):
    """Register the built-in model factories."""
