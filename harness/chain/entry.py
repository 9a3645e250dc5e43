"""How a stage's input enters it, so that its backward hands y_i over as the chain does.

A stage runs on a detached copy of its input (its backward stops there). Made a leaf, that
input would receive y_i through autograd's ``AccumulateGrad``, which copies a gradient that
does not have the input's layout (a slice of a concatenation's gradient) into a buffer of
its own: a copy the previous stage of a real chain never makes. ``StageEntry`` is an
identity whose backward keeps y_i as it arrives, in a box; the torch executor and the
profilers both feed each stage through it.
"""

from __future__ import annotations

from typing import Any

import torch


class StageEntry(torch.autograd.Function):
    """Identity on a stage input; its backward stores the input's gradient (y_i) in a box.

    ``StageEntry.apply(token, x, box)``: ``token`` is any tensor that requires a gradient (it
    makes autograd run the backward, and receives none), ``x`` the detached input, ``box`` a dict
    whose ``"grad"`` the backward sets.
    """

    @staticmethod
    def forward(ctx: Any, token: torch.Tensor, x: torch.Tensor, box: dict) -> torch.Tensor:  # noqa: D102
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:  # noqa: D102
        ctx.box["grad"] = grad
        return None, None, None
