"""The model registry's built-in factories.

- ``torchvision:<name>``: every torchvision classification model (``torchvision_models.py``);
- ``transformers:<name>``: GPT-2-style language models built from a config, no download
  (``transformers_models.py``), registered only when ``transformers`` is installed;
- ``builtin:tiny-cnn``, ``builtin:mlp``: tiny models for fast tests (``builtin.py``).

Plugins add more through the ``membudget_register_models`` hook: an object with
``name``, ``description``, ``names()`` and ``build(workload, device) -> (module, input)``
(optionally ``default_input_size(model)``).
"""

from __future__ import annotations


def register_builtin(register):
    """Register the built-in model factories (none without torch)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    from harness.models.builtin import BuiltinModels
    from harness.models.torchvision_models import TorchvisionModels

    register(BuiltinModels())
    try:
        import torchvision  # noqa: F401
    except ImportError:
        pass
    else:
        register(TorchvisionModels())
    from harness.models import transformers_models

    if transformers_models.available():
        register(transformers_models.TransformersModels())
