"""A run's rows as its pages read them: grouped by model, ordered, and summarised into one cell per
strategy and budget on each executor, the fastest of each budget found by the quantity common to it,
the iteration time."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import pandas as pd

from harness.publish.formats import slug


@dataclass(frozen=True)
class Group:
    """The rows of one model at one batch and input size; ``named``, the model a profile file names when
    the rows' model is that file (a suite's ``profiler: file``)."""

    model: str
    batch_size: int
    input_size: str
    rows: pd.DataFrame
    named: str = ""

    @property
    def title(self) -> str:
        """``torchvision:resnet18, batch 32, 3x224x224``; for a profile file, ``torchvision:resnet50 (profile
        results/profiles/resnet50-b32-h100-measured.json), batch 256, 3x224x224``."""
        model = f"{self.named} (profile {self.model})" if self.named and self.named != self.model else self.model
        return f"{model}, batch {self.batch_size}, {self.input_size}"

    @property
    def key(self) -> str:
        """A file-name stem."""
        return slug(f"{self.model}-b{self.batch_size}-{self.input_size}")


def model_groups(frame: pd.DataFrame, profiles: Any = None) -> list[Group]:
    """Rows split by (model, batch, input size), in order of appearance; with ``profiles``
    (``harness.results.RunProfiles``) each group of a profile file says the model the file names."""
    out = []
    for (model, batch, size), rows in frame.groupby(["model", "batch_size", "input_size"], sort=False):
        profile = profiles.of(rows.iloc[0]) if profiles is not None else None
        out.append(Group(model, int(batch), size, rows, getattr(profile, "model", "") or ""))
    return out


def ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows by model (as they first appear), strategy (likewise), budget, allocator."""
    def rank(values: pd.Series) -> pd.Series:
        return values.map({v: i for i, v in enumerate(dict.fromkeys(values))})

    group = frame["model"] + "/" + frame["batch_size"].astype(str) + "/" + frame["input_size"]
    keyed = frame.assign(_g=rank(group), _p=rank(frame["planner_label"]))
    keyed = keyed.sort_values(["_g", "_p", "budget_bytes", "allocator", "case_id"], kind="stable")
    return keyed.drop(columns=["_g", "_p"])


def plan_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per planned case: the first allocator's (plans do not depend on the allocator)."""
    if (rows["allocator"] == "").all():
        return rows
    first = rows["allocator"].iloc[0]
    return rows[rows["allocator"] == first]


def budget_order(rows: pd.DataFrame) -> list[str]:
    """The budget labels of ``rows``, smallest budget first."""
    order = rows.groupby("budget_label", sort=False)["budget_bytes"].median().sort_values(kind="stable")
    return list(order.index)


def planner_order(rows: pd.DataFrame) -> list[str]:
    """The planner labels of ``rows``, in order of appearance (the suite's order)."""
    return list(dict.fromkeys(rows["planner_label"]))


def executors(rows: pd.DataFrame) -> list[str]:
    """The executors of ``rows``, in order of appearance."""
    return list(dict.fromkeys(rows["executor"]))


def is_measured(rows: pd.DataFrame) -> bool:
    """True when ``rows`` were timed on real hardware (the executor reports its iterations' spread)."""
    return bool(rows["time_iqr_s"].notna().any())


NOTHING_FINISHED = "no case finished"


def kind_of(rows: pd.DataFrame) -> str:
    """``measured``, ``simulated``, or, when no row has an iteration time (every case failed, was
    infeasible or ran out of memory), ``NOTHING_FINISHED``: such rows say neither."""
    if is_measured(rows):
        return "measured"
    return "simulated" if rows["makespan_s"].notna().any() else NOTHING_FINISHED


STATISTICS = ("trimmed-mean", "median", "mean")


def central(values: Sequence[float], statistic: str = "trimmed-mean") -> tuple[float, list[float]]:
    """The summary of a case's repeated times and the values it kept.

    ``trimmed-mean`` drops the fastest and the slowest when there are three or more (MLPerf's
    rule), then averages; ``median`` and ``mean`` are what they say.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of {', '.join(STATISTICS)}")
    xs = sorted(float(v) for v in values)
    if not xs:
        return math.nan, []
    if statistic == "median":
        return statistics.median(xs), xs
    kept = xs[1:-1] if statistic == "trimmed-mean" and len(xs) >= 3 else xs
    return sum(kept) / len(kept), kept


# grad_error above which a strategy did not train the same network: another convolution algorithm's or
# TF32's rounding stays orders of magnitude below it, a lost or doubled gradient contribution far above
GRAD_TOLERANCE = 0.05


@dataclass(frozen=True)
class Cell:
    """One strategy at one budget on one executor: its repeats summarised.

    ``time_s`` is the column's common quantity (the iteration time); ``spread_s`` is half the
    interquartile range of a measured run's timed iterations, or half the range of the kept
    repeats; ``over_allocators`` names the allocator models of the suite whose arena for the
    schedule's trace exceeds the budget (empty when all fit; ``arena_note`` gives the amounts);
    ``grad_error`` is the largest gradient error of its torch rows (NaN without a gradient check);
    ``sub_batches``, how many parts the schedule splits the batch into (1: it does not);
    ``needed_bytes``, on a refused budget, the most its planner said it would need (NaN: not said);
    ``schedule``, the fingerprint of what it ran (``Schedule.fingerprint``; empty: rows older than
    the column, or repeats that ran different schedules); ``predicted_s``, for a measured run, the
    simulator's time for the same schedule (NaN: a simulated cell, or none given); ``recomputed_bytes``,
    the most saved data its schedule recomputes (NaN: rows older than the column).
    """

    status: str
    time_s: float = math.nan
    spread_s: float = math.nan
    ratio_to_budget_lb: float = math.nan
    slowdown: float = math.nan
    repeats: int = 1
    failed: int = 0
    over_allocators: tuple[str, ...] = ()
    grad_error: float = math.nan
    sub_batches: int = 1
    needed_bytes: float = math.nan
    schedule: str = ""
    predicted_s: float = math.nan
    recomputed_bytes: float = math.nan

    @property
    def ok(self) -> bool:
        """True when the strategy ran at this budget (every repeat)."""
        return self.status == "ok"

    @property
    def ranked(self) -> bool:
        """True when the strategy contends at this budget: it ran, has a time, and trained the same network."""
        return self.ok and not math.isnan(self.time_s) and not self.trained_differently

    @property
    def trained_differently(self) -> bool:
        """True when its gradients differ from the unmodified model's by more than ``GRAD_TOLERANCE``:
        not the same training, so never ranked the fastest."""
        return self.grad_error > GRAD_TOLERANCE  # False for NaN


def over_budget_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The allocator rows whose arena the runner found not to fit the budget (``arena_fits_budget``)."""
    return rows[(rows["allocator"] != "") & rows["arena_fits_budget"].eq(False).fillna(False)]


TIE = 1e-9  # times within this relative difference are a tie (``fastest``)


def _apart(times: list[float]) -> bool:
    """True when the times are further apart than ``fastest`` calls a tie (one time never is)."""
    return max(times) > min(times) * (1 + TIE)


def summarise(rows: pd.DataFrame, statistic: str = "trimmed-mean") -> dict[tuple[str, str], Cell]:
    """(planner label, budget label) -> Cell, for the rows of one model group on one executor."""
    out: dict[tuple[str, str], Cell] = {}
    for (planner, budget), cell in rows.groupby(["planner_label", "budget_label"], sort=False):
        planned = plan_rows(cell)
        failed = planned[planned["status"] != "ok"]
        names = tuple(dict.fromkeys(over_budget_rows(cell)["allocator"]))
        if not failed.empty:
            needed = pd.to_numeric(failed.get("needed_bytes", pd.Series(dtype=float)), errors="coerce").dropna()
            out[planner, budget] = Cell(str(failed["status"].iloc[0]), repeats=len(planned), failed=len(failed),
                                        needed_bytes=float(needed.max()) if len(needed) else math.nan)
            continue
        time_s, kept = central(planned["makespan_s"], statistic)
        if len(planned) > 1:
            spread = (max(kept) - min(kept)) / 2
        else:
            spread = float(planned["time_iqr_s"].iloc[0]) / 2
        budget_lb = planned["budget_lower_bound_s"].dropna()
        ideal = planned["ideal_s"].dropna()
        grads = pd.to_numeric(planned["grad_error"], errors="coerce").dropna()
        parts = planned["sub_batches"].dropna()
        prints = set(planned.get("schedule_fingerprint", ()))  # a frame built by hand may not have it
        predicted = pd.to_numeric(planned.get("predicted_s", pd.Series(dtype=float)), errors="coerce").dropna()
        recomputed = pd.to_numeric(planned.get("recomputed_bytes", pd.Series(dtype=float)), errors="coerce")
        out[planner, budget] = Cell(
            "ok", time_s, spread,
            time_s / float(budget_lb.iloc[0]) if len(budget_lb) and budget_lb.iloc[0] > 0 else math.nan,
            time_s / float(ideal.iloc[0]) if len(ideal) and ideal.iloc[0] > 0 else math.nan,
            repeats=len(planned), over_allocators=names, grad_error=float(grads.max()) if len(grads) else math.nan,
            sub_batches=int(parts.max()) if len(parts) else 1, schedule=prints.pop() if len(prints) == 1 else "",
            predicted_s=float(predicted.median()) if len(predicted) else math.nan,
            recomputed_bytes=float(recomputed.max()) if recomputed.notna().all() else math.nan,
        )
    return out


def fastest(cells: dict[tuple[str, str], Cell], budget: str, rel: float = TIE) -> set[str]:
    """The planner labels with the smallest iteration time at ``budget`` (ties within ``rel``); empty
    when nothing ran. A strategy that trained a different network (``Cell.trained_differently``) is not
    a contender."""
    ran = {p: c.time_s for (p, b), c in cells.items() if b == budget and c.ranked}
    if not ran:
        return set()
    best = min(ran.values())
    return {p for p, t in ran.items() if t <= best * (1 + rel)}


# a strategy more than this much slower than at a smaller budget is not merely noise or rounding
MORE_MEMORY_SLACK = 0.01


def slower_with_more_memory(cells: dict[tuple[str, str], Cell], budgets: Sequence[str]) -> dict[tuple[str, str], str]:
    """(planner, budget) -> the smaller budget at which the same planner ran faster, by more than
    ``MORE_MEMORY_SLACK`` and (measured rows) beyond both cells' spreads, and, where both were measured
    with the simulator's time beside them, by more than ``MORE_MEMORY_SLACK`` in those too (a measured gap
    between two plans the simulator times alike is the device's noise, not a plan the planner missed).
    The plan made for the smaller budget fits the larger one, so such a cell is the planner's shortfall,
    not the budget's. ``budgets`` ascending (``budget_order``); the fastest smaller budget is named."""
    out: dict[tuple[str, str], str] = {}
    for planner in dict.fromkeys(p for p, _ in cells):
        best: tuple[Cell, float, str] | None = None  # the fastest so far: its cell, spread, budget
        for budget in budgets:
            cell = cells.get((planner, budget))
            if cell is None or not cell.ranked:
                continue
            spread = 0.0 if math.isnan(cell.spread_s) else cell.spread_s
            if best is not None and (cell.time_s - spread > (best[0].time_s + best[1]) * (1 + MORE_MEMORY_SLACK)):
                alike = cell.predicted_s <= best[0].predicted_s * (1 + MORE_MEMORY_SLACK)  # False with a NaN
                if not alike:
                    out[(planner, budget)] = best[2]
            if best is None or cell.time_s < best[0].time_s:
                best = (cell, spread, budget)
    return out


@dataclass(frozen=True)
class ExecutorTable:
    """The rows of one model group on one executor, summarised once for its tables and plots."""

    group: Group
    executor: str
    rows: pd.DataFrame
    cells: dict[tuple[str, str], Cell]

    @classmethod
    def of(cls, group: Group, executor: str, statistic: str = "trimmed-mean") -> ExecutorTable:
        """The rows of ``group`` that ``executor`` ran, each strategy and budget summarised by ``statistic``."""
        rows = group.rows[group.rows["executor"] == executor]
        return cls(group, executor, rows, summarise(rows, statistic))

    @cached_property
    def slower_with_more_memory(self) -> dict[tuple[str, str], str]:
        """``slower_with_more_memory`` of this table's cells, once for its time table and its note."""
        return slower_with_more_memory(self.cells, budget_order(self.rows))

    @cached_property
    def close_calls(self) -> dict[str, tuple[str, str]]:
        """budget -> (the fastest, the runner-up) where the runner-up's time minus its spread is not above
        the winner's plus its spread: the timings do not tell the two apart (measured rows, or repeats
        that differ). Ties (``fastest``) are not close calls: they are named as ties."""
        out = {}
        for budget in budget_order(self.rows):
            winners = fastest(self.cells, budget)
            ranked = sorted((c.time_s, p) for (p, b), c in self.cells.items()
                            if b == budget and c.ranked and p not in winners)
            if not winners or not ranked:
                continue
            winner = next(p for p in planner_order(self.rows) if p in winners)  # the first listed of a tie
            first, second = self.cells[winner, budget], self.cells[ranked[0][1], budget]
            spreads = [0.0 if math.isnan(c.spread_s) else c.spread_s for c in (first, second)]
            if sum(spreads) > 0 and second.time_s - spreads[1] <= first.time_s + spreads[0]:
                out[budget] = (winner, ranked[0][1])
        return out

    @cached_property
    def same_schedules(self) -> dict[str, list[list[str]]]:
        """budget -> the groups of strategies (each in the suite's order) that ran one and the same schedule
        (``Cell.schedule``) and got times further apart than ``fastest`` calls a tie: measured noise alone."""
        out: dict[str, list[list[str]]] = {}
        for budget in budget_order(self.rows):
            by_print: dict[str, list[str]] = {}
            for planner in planner_order(self.rows):
                cell = self.cells.get((planner, budget))
                if cell is not None and cell.ranked and cell.schedule:
                    by_print.setdefault(cell.schedule, []).append(planner)
            groups = [ps for ps in by_print.values() if _apart([self.cells[p, budget].time_s for p in ps])]
            if groups:
                out[budget] = groups
        return out

    @property
    def title(self) -> str:
        """``torchvision:resnet18, batch 32, 3x224x224, simulate executor``."""
        return f"{self.group.title}, {self.executor} executor"
