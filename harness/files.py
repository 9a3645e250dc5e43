"""Writing a file so that a crash or an interrupt leaves the old one or the new one, never a torn one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` beside ``path`` and rename it over ``path`` (``os.replace`` is atomic)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:  # name the file the caller asked for, not the temporary one
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OSError(exc.errno, exc.strerror, str(path)) from None
