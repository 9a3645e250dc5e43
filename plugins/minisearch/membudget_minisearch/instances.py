"""Hard placement instances for tests and benchmarks, some with a known optimum.

- :func:`cut_rectangle`: a ``width`` x ``horizon`` rectangle (bytes x time) cut into
  ``blocks`` pieces by random guillotine cuts; every time unit is full, so the max-live
  bytes are ``width`` and the optimum is ``width`` (the cut itself is a placement). The
  pieces are shuffled so the trace order tells nothing.
- :func:`cut_rectangle_dnn`: the same with DNN-like shapes: a few tall long-lived pieces
  (weights, saved activations) and many short thin ones (workspaces, gradients).
- :func:`random_instance`: random lifetimes and sizes; the optimum is unknown (tests
  compare with CP-SAT on small ones).
"""

from __future__ import annotations

import numpy as np

from harness.allocators.trace import IntTrace

__all__ = ["cut_rectangle", "cut_rectangle_dnn", "random_instance"]


def cut_rectangle(blocks: int, seed: int = 0, width: int = 1 << 20, horizon: int | None = None,
                  granule: int = 256, time_bias: float = 0.5) -> IntTrace:
    """A perfect packing of ``blocks`` pieces into ``width`` bytes: optimum = max-live = ``width``.

    Repeatedly cut the largest piece (by area) in two, across time with probability
    ``time_bias`` (when it spans more than one time unit) else across addresses (at a
    multiple of ``granule`` bytes, when it is at least two granules tall).
    """
    rng = np.random.default_rng(seed)
    horizon = horizon or 2 * blocks
    pieces = [(0, horizon, 0, width)]  # (t0, t1, y0, y1)
    stuck = 0
    while len(pieces) < blocks and stuck < 100:
        areas = [(p[1] - p[0]) * (p[3] - p[2]) for p in pieces]
        k = int(rng.choice(len(pieces), p=np.asarray(areas, float) / sum(areas)))
        t0, t1, y0, y1 = pieces[k]
        can_t = t1 - t0 >= 2
        can_y = (y1 - y0) // granule >= 2
        if not (can_t or can_y):
            stuck += 1
            continue
        _cut(pieces, k, rng, granule, across_time=can_t and (not can_y or rng.random() < time_bias))
    return _as_trace(pieces, rng)


def _cut(pieces: list, k: int, rng: np.random.Generator, granule: int, across_time: bool) -> None:
    """Split piece ``k`` in two at a random time (``across_time``) or address (a multiple of ``granule``)."""
    t0, t1, y0, y1 = pieces[k]
    if across_time:
        c = int(rng.integers(t0 + 1, t1))
        pieces[k : k + 1] = [(t0, c, y0, y1), (c, t1, y0, y1)]
    else:
        c = y0 + granule * int(rng.integers(1, (y1 - y0) // granule))
        pieces[k : k + 1] = [(t0, t1, y0, c), (t0, t1, c, y1)]


def _as_trace(pieces: list, rng: np.random.Generator) -> IntTrace:
    """The pieces (t0, t1, y0, y1) as blocks in a random order."""
    rng.shuffle(pieces)
    arr = np.asarray(pieces, dtype=np.int64)
    return IntTrace(arr[:, 0], arr[:, 1], arr[:, 3] - arr[:, 2])


def cut_rectangle_dnn(blocks: int, seed: int = 0, width: int = 1 << 30, granule: int = 512) -> IntTrace:
    """A perfect packing shaped like a training iteration: long pieces first, then short ones.

    The first quarter of the cuts go across addresses only (tall-to-thin, whole-horizon
    strips: weights and long-lived activations); the rest mostly across time (short
    blocks). Optimum = max-live = ``width``.
    """
    rng = np.random.default_rng(seed)
    horizon = 2 * blocks
    strips = max(2, blocks // 4)
    pieces = [(0, horizon, 0, width)]
    while len(pieces) < strips:
        _cut(pieces, max(range(len(pieces)), key=lambda j: pieces[j][3] - pieces[j][2]), rng, granule, False)
    # nest: cut strips in time, around a "middle" (forward then backward)
    stuck = 0
    while len(pieces) < blocks and stuck < 100:
        k = int(rng.integers(len(pieces)))
        t0, t1, y0, y1 = pieces[k]
        if t1 - t0 < 2:
            stuck += 1
            continue
        _cut(pieces, k, rng, granule, across_time=rng.random() < 0.8 or (y1 - y0) // granule < 2)
    return _as_trace(pieces, rng)


def random_instance(blocks: int, seed: int = 0, max_size: int = 16, max_len: int | None = None,
                    horizon: int | None = None) -> IntTrace:
    """Random lifetimes (1..``max_len`` long, starting in ``0..horizon``, default 2 x ``blocks``)
    and sizes 1..``max_size``."""
    rng = np.random.default_rng(seed)
    max_len = max_len or blocks
    lo = rng.integers(0, horizon or 2 * blocks, blocks)
    return IntTrace(lo, lo + rng.integers(1, max_len + 1, blocks), rng.integers(1, max_size + 1, blocks))
