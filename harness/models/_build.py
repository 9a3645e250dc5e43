"""The old name of :mod:`harness.models.build`, kept for model plugins written against it."""

from __future__ import annotations

import warnings

from harness.models.build import image_batch, on_device, prepare, token_batch, torch_dtype

__all__ = ["image_batch", "on_device", "prepare", "token_batch", "torch_dtype"]

warnings.warn("harness.models._build is now harness.models.build", DeprecationWarning, stacklevel=2)
