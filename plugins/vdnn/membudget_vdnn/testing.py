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
    """``analytic(model, batch, device, image=224)``: a real model's analytic profile (cached); a skip only
    where torch or torchvision is not installed. The analytic profiler is a core built-in, so any other
    error (a profiler that raises, an unknown model) fails the test that asked: a skip would hide it."""
    pytest.importorskip("torch", reason="the analytic profiler builds the model with torch")
    pytest.importorskip("torchvision", reason="the paper checks profile torchvision models")

    def get(model: str, batch: int, device: str, image: int = 224):
        return _profile(model, batch, device, image)

    return get
