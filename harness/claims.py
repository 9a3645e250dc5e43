"""The claims of Beaumont, Eyraud-Dubois and Shilova (NeurIPS 2021), checked on a run's rows.

"Efficient Combination of Rematerialization and Offloading for Training DNNs" reports that
adding offloading to rematerialization (recomputation) removes about a third of its time
overhead, and that the two together cut activation memory 4-6x at under 20% overhead. For
the rows of one model (one batch and input size) on one executor, this module computes:

- ``overhead_share``: over the budgets where both ran and recomputation costs anything (its schedule
  recomputes some saved data, ``recomputed_bytes`` > 0, and takes longer than T_ideal: a measured row
  that recomputes nothing is above T_ideal by the executor's overhead and noise alone), the
  overhead the combined strategy removes over the overhead recomputation has, both summed:
  sum(T_recompute - T_combined) / sum(T_recompute - T_ideal), so that a budget where
  recomputation costs next to nothing weighs next to nothing (a mean of per-budget ratios
  would give its share, on a denominator near zero, the weight of the budgets where the
  overhead is). T_recompute is the
  ``recompute`` planner's time when it ran in the suite, else the best recompute-only planner
  there (``torch-checkpoint``); T_combined is the ``hybrid`` planner's (none: "not run");
  T_ideal is the row's ``ideal_s`` (the unconstrained keep-all iteration);
- ``memory_reduction``: A_keep-all / A_budget, where the activation memory of a budget M is
  what it leaves beside the resident weights, M - ``weight_bytes``, and A_keep-all is the
  keep-all peak's, ``peak_memory_bytes`` (M_peak, ``harness.bounds.peak_memory``) -
  ``weight_bytes``; A_budget is that of the smallest budget of the suite at which the
  combined strategy (``hybrid``; without it, the fastest of every strategy that ran, said so)
  runs within 1.2x T_ideal. The suite's budgets are a grid: the reduction is the grid's, a
  lower bound of the strategy's.

``held`` compares them with the paper: a share within 1/3 +- 0.1, a reduction of 4x or more (not
checked, below 4x, when the smallest budget at which any strategy ran leaves more than a quarter of
A_keep-all: neither the grid nor the chain can show the claim there).
Times are each strategy's iteration times as the published tables summarise them
(``harness.publish.summarise``, handed in by the caller).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import pandas as pd

PAPER = ("Beaumont, Eyraud-Dubois, Shilova, NeurIPS 2021, \"Efficient Combination of Rematerialization and "
         "Offloading for Training DNNs\"")
RECOMPUTE_ONLY = ("recompute", "torch-checkpoint")  # in order of preference
COMBINED = "hybrid"
SHARE_CLAIM, SHARE_TOLERANCE = 1 / 3, 0.1
REDUCTION_CLAIM = 4.0  # the paper's 4-6x: held from its lower end
OVERHEAD_LIMIT = 1.2  # "under 20% overhead"


@dataclass(frozen=True)
class Claims:
    """The two numbers of the paper for one model on one executor, and where they come from."""

    recompute_planner: str | None  # the planner T_recompute came from (None: no recompute-only planner ran)
    combined_planner: str | None  # "hybrid", or None when it did not run
    overhead_share: float | None  # None: not run or no budget where both ran with an overhead
    share_budgets: int  # how many budgets the sums are over
    reduction_strategy: str  # "hybrid", or "fastest of <planners>" without it
    memory_reduction: float | None  # None: no budget within the overhead limit
    reduction_budget: int | None  # the budget (bytes) it was reached at
    activation_bytes: int | None  # A_keep-all: peak_memory_bytes - weight_bytes
    grid_reduction: float | None = None  # the most the grid can show: A_keep-all over that of the smallest
    # budget at which any strategy ran

    @property
    def share_held(self) -> bool | None:
        """True when the share is within 1/3 +- 0.1 (None: nothing to judge)."""
        if self.overhead_share is None:
            return None
        return abs(self.overhead_share - SHARE_CLAIM) <= SHARE_TOLERANCE

    @property
    def reduction_held(self) -> bool | None:
        """True when the combined strategy's reduction is at least 4x (None: nothing to judge, or no
        combined strategy ran: the claim is about offloading and recomputation together, so the
        fastest of the others is shown but not judged)."""
        if self.memory_reduction is None or self.combined_planner is None:
            return None
        if self.grid_reduction is not None and self.grid_reduction < REDUCTION_CLAIM:
            return None  # no strategy ran where 4x could show (nor did this one): the claim is not tested here
        return self.memory_reduction >= REDUCTION_CLAIM


def _times(rows: pd.DataFrame, cells: Mapping[tuple[str, str], Any]) -> dict[str, dict[str, tuple[int, float, Any]]]:
    """planner name -> budget label -> (budget bytes, iteration time, cell) of the strategies that ran and
    trained the same network (``Cell.ranked``); a planner listed under several labels keeps its fastest cell
    at each budget."""
    names = dict(zip(rows["planner_label"], rows["planner"]))
    sizes = rows.groupby("budget_label", sort=False)["budget_bytes"].median()
    out: dict[str, dict[str, tuple[int, float, Any]]] = {}
    for (label, budget), cell in cells.items():
        if cell.ranked and not pd.isna(sizes.get(budget)):  # ran, and trained the same network
            at = out.setdefault(names[label], {})
            if budget not in at or cell.time_s < at[budget][1]:
                at[budget] = (int(sizes[budget]), cell.time_s, cell)
    return out


def _first(rows: pd.DataFrame, column: str) -> float | None:
    values = pd.to_numeric(rows[column], errors="coerce").dropna()
    return float(values.iloc[0]) if len(values) else None


def check_claims(rows: pd.DataFrame, cells: Mapping[tuple[str, str], Any]) -> Claims:
    """The paper's two numbers on the rows of one model group and one executor (``Claims``).

    ``cells`` are those rows summarised as the published tables summarise them, (planner label,
    budget label) -> a cell with ``ok`` and ``time_s`` (``harness.publish.summarise``): the
    claims read the same iteration times the tables rank.
    """
    times = _times(rows, cells)
    ideal = _first(rows, "ideal_s")
    recompute = next((p for p in RECOMPUTE_ONLY if p in times), None)
    combined = COMBINED if COMBINED in times else None
    share, used = None, 0
    if recompute and combined and ideal:
        # a cell whose schedule recomputes nothing has no overhead of recomputation (NaN: not said, counted)
        pairs = [(t_rec, times[combined][budget][1]) for budget, (_, t_rec, cell) in times[recompute].items()
                 if budget in times[combined] and t_rec > ideal * (1 + 1e-9) and cell.recomputed_bytes != 0]
        if pairs:
            removed = sum(t_rec - t_comb for t_rec, t_comb in pairs)
            share, used = removed / sum(t_rec - ideal for t_rec, _ in pairs), len(pairs)
    if combined:
        candidates, strategy = {combined: times[combined]}, combined
    else:
        candidates, strategy = times, "fastest of " + ", ".join(sorted(times)) if times else "nothing ran"
    peak, weights = _first(rows, "peak_memory_bytes"), _first(rows, "weight_bytes")
    activation = int(peak - weights) if peak is not None and weights is not None else None
    within = [size for at in candidates.values() for size, t, _ in at.values()
              if ideal and t <= OVERHEAD_LIMIT * ideal]
    reduction, budget, grid = None, None, None
    if activation is not None and weights is not None:
        smallest = min((size for at in times.values() for size, _, _ in at.values()), default=None)
        if smallest is not None:  # the reduction's budget is one where a strategy ran: grid >= reduction
            grid = activation / (smallest - weights) if smallest > weights else float("inf")
        if within:
            budget = min(within)
            if budget > weights:
                reduction = activation / (budget - weights)
    return Claims(recompute, combined, share, used, strategy, reduction, budget, activation, grid)


def verdict(held: bool | None) -> str:
    """``held``, ``not held`` or ``not checked``."""
    return "not checked" if held is None else "held" if held else "not held"
