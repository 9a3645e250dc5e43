"""The committed recompute-offload run (``tox -e publish``) holds issue #17's orderings on every case.

On each model and budget of ``suites/recompute-offload.yaml`` (analytic H100 profiles of
ResNet-50/101, DenseNet-121, ViT-B/16, GPT-2 and the measured H100 ResNet-50/VGG-16 profiles,
simulated): ``recompute`` is never slower than ``torch-checkpoint`` and ``hybrid`` never slower
than the best of ``recompute`` and ``dynprog``, and each runs wherever the other does. The rows
are what the planners produce from the code at the commit the run names, so a planner change
that breaks an ordering fails here once the run is regenerated.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

ROWS = Path(__file__).resolve().parent.parent / "results" / "recompute-offload" / "published" / "rows.csv"
REL = 1e-9  # the planners return the fastest of their candidates by the same simulator: no slack


def test_the_published_rows_are_committed():
    """The checks below read them: without the file they would all go quiet (tox -e publish writes it)."""
    assert ROWS.exists(), f"{ROWS} is committed; tox -e publish regenerates it"


def _times() -> dict[tuple[str, str, str], dict[str, float]]:
    """(model, input size, budget) -> planner -> iteration time (inf: refused)."""
    rows = pd.read_csv(ROWS, keep_default_na=False, dtype=str)
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for _, row in rows.iterrows():
        time = float(row["makespan_s"]) if row["status"] == "ok" else math.inf
        out.setdefault((row["model"], row["input_size"], row["budget_label"]), {})[row["planner"]] = time
    return out


def test_the_run_has_every_planner_at_every_case():
    times = _times()
    assert len(times) >= 7 * 10
    for case, by_planner in times.items():
        assert {"torch-checkpoint", "recompute", "dynprog", "hybrid"} <= set(by_planner), case


def test_recompute_is_never_slower_than_torch_checkpoint():
    for case, t in _times().items():
        assert t["recompute"] <= t["torch-checkpoint"] * (1 + REL), case


def test_hybrid_is_never_slower_than_recompute_or_dynprog():
    wins = 0
    for case, t in _times().items():
        best = min(t["recompute"], t["dynprog"])
        assert t["hybrid"] <= best * (1 + REL), (case, t)
        wins += t["hybrid"] < best * (1 - 1e-6)
    assert wins > 0  # and the combination pays somewhere on these profiles
