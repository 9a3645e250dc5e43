"""Register objects without importing their modules: every command loads the registry,
and importing torch or torchvision for it would cost seconds."""

from __future__ import annotations

import importlib
from typing import Any, Sequence


class Lazy:
    """Stands in for the object ``module.Class()`` until first used, then delegates to it.

    ``name`` and ``description`` are known up front (``membudget list`` shows them);
    ``names`` (for model factories) may be given up front too.
    """

    def __init__(self, target: str, name: str, description: str, names: Sequence[str] | None = None):
        self.name, self.description = name, description
        self._target, self._names, self._obj = target, tuple(names) if names is not None else None, None

    def resolve(self) -> Any:
        """The real object (imported and built on first call)."""
        if self._obj is None:
            self._obj = load(self._target)()
        return self._obj

    def names(self) -> Sequence[str]:
        return list(self._names) if self._names is not None else self.resolve().names()

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.resolve(), attr)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_obj": None}  # re-import on the other side of a process pool


def load(target: str) -> Any:
    """The object a dotted path names (``package.module.Name``), its module imported."""
    module, name = target.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def resolve(obj: Any) -> Any:
    """The real object behind ``obj`` if it is a ``Lazy``, else ``obj``."""
    return obj.resolve() if isinstance(obj, Lazy) else obj
