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

import importlib.util

from harness.lazy import Lazy


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def register_builtin(register):
    """Register the built-in model factories (none without torch), without importing torch."""
    if not _installed("torch"):
        return
    register(Lazy("harness.models.builtin.BuiltinModels", "builtin",
                  "tiny models for fast tests: builtin:tiny-cnn, builtin:mlp", names=("builtin:tiny-cnn", "builtin:mlp")))
    if _installed("torchvision"):
        register(Lazy("harness.models.torchvision_models.TorchvisionModels", "torchvision",
                      "every torchvision classification model (random weights), e.g. torchvision:resnet50"))
    if _installed("transformers"):
        register(Lazy("harness.models.transformers_models.TransformersModels", "transformers",
                      "GPT-2-style language models built from a config (no download), e.g. transformers:gpt2"))
