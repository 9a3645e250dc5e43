"""The dtype names a workload may give, without importing torch (a suite is checked before any model is built)."""

from __future__ import annotations

# name (as a suite or the CLI writes it, in any case) -> the torch dtype's attribute name
DTYPE_NAMES = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float64": "float64",
}


def unknown_dtype(name: str) -> str | None:
    """The one-line complaint about dtype ``name``, or None when it is known."""
    if name.lower() in DTYPE_NAMES:
        return None
    return f"unknown dtype {name!r}; use one of {', '.join(sorted(DTYPE_NAMES))}"
