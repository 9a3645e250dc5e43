"""Files: writing one so that a crash or an interrupt leaves the old one or the new one, never a torn one;
and the words for one that is not UTF-8 text."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable


def replace_atomic(path: str | Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` a file beside ``path``, then rename it over ``path`` (``os.replace`` is atomic).

    On failure (a full disk) the temporary file goes and the ``OSError`` names ``path``, the file the
    caller asked for.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` beside ``path`` and rename it over ``path`` (``replace_atomic``)."""
    replace_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def not_utf8(exc: UnicodeDecodeError) -> str:
    """What is wrong with a file that does not decode, for a one-line error naming it:
    ``not UTF-8 text (invalid start byte at byte 0)``."""
    return f"not UTF-8 text ({exc.reason} at byte {exc.start})"
