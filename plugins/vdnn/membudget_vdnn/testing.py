"""Test support shared by the vDNN, vDNN++ and capacity plugins' paper checks (a pytest fixture)."""

from __future__ import annotations

import functools

import pytest

from membudget_vdnn.shapes import analytic as _analytic


@functools.cache
def _profile(model: str, batch: int, device: str, image: int):
    return _analytic(model, batch, device, image)


@pytest.fixture(scope="session")
def analytic():
    """``analytic(model, batch, device, image=224)``: a real model's analytic profile (cached), or a skip saying why not."""
    def get(model: str, batch: int, device: str, image: int = 224):
        try:
            return _profile(model, batch, device, image)
        except Exception as exc:  # torch missing, profiler not registered, model unknown
            pytest.skip(f"analytic profiler unavailable for {model}: {type(exc).__name__}: {exc}")

    return get
