"""The error a suite that cannot run raises, and how it names the place: ``file:line: field: ...``."""

from __future__ import annotations

from typing import Any

from harness.errors import MembudgetError, UnknownPlugin


Path_ = tuple[Any, ...]


Locations = dict[Path_, tuple[str, int]]


class SuiteError(MembudgetError):
    """A suite that cannot be run: the message names the file, line and field."""

    def __init__(self, message: str, *, source: str = "", line: int | None = None, field: str = "",
                 choices: list[str] | None = None):
        self.source, self.line, self.field, self.choices = source, line, field, choices or []
        MembudgetError.__init__(self, message)


class UnknownSuitePlugin(SuiteError, UnknownPlugin):
    """A suite names a profiler, model, planner, executor or allocator nobody registered."""

    def __init__(self, message: str, exc: UnknownPlugin, *, source: str, line: int, field: str):
        super().__init__(message, source=source, line=line, field=field, choices=list(exc.available))
        self.kind, self.name, self.available = exc.kind, exc.name, exc.available


def where(source: str, line: int | None, field_name: str) -> str:
    """The ``file:line: field: `` prefix of a suite error message."""
    at = f"{source}:{line}" if line else source
    return f"{at}: {field_name}: " if field_name else f"{at}: "


def field_name(loc: tuple[Any, ...]) -> str:
    """A location in a suite as written in a message: ``("models", 0, "batch_sizes")`` -> ``models[0].batch_sizes``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out
