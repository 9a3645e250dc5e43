"""The tables of a published page: iteration time per strategy and budget, time over the budget's
lower bound, the fastest strategy per budget and what it does, the arenas of each allocator, and the
paper's claims."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import pandas as pd

from harness.publish.cells import (TIE, Cell, ExecutorTable, budget_order, executors, fastest, is_measured,
                                   plan_rows, planner_order)
from harness.publish.formats import below_the_weights, fmt_bytes, fmt_ms, fmt_ratio, number


STATUS_MARK = {"infeasible": "infeasible", "oom": "oom", "error": "error"}
FASTEST = "★"
ARENA_FLAG = "†"
FIT_HEADER = f"fastest with its arena in the budget ({ARENA_FLAG} winners)"  # strategy_table's last column
GRAD_FLAG = "‡"
SPLIT_MARK = "÷"  # ÷N: the schedule splits the batch into N sub-batches
MORE_MEMORY_MARK = "↗"  # slower than the same strategy at a smaller budget


def _budget_headers(rows: pd.DataFrame, budgets: list[str], with_lb: bool = False) -> list[str]:
    headers = []
    for label in budgets:
        at = rows[rows["budget_label"] == label]
        size = at["budget_bytes"].dropna()
        parts = [fmt_bytes(size.iloc[0])] if len(size) else []
        lb = at["budget_lower_bound_s"].dropna()
        weights = at["weight_bytes"].dropna()
        if len(size) and len(weights) and below_the_weights(size.iloc[0], weights.iloc[0]):
            parts.append("below the weights: no schedule runs")
        elif with_lb and len(lb):
            parts.append(f"LB {fmt_ms(lb.iloc[0])} ms")
        headers.append(f"{label} ({'; '.join(parts)})" if parts else label)
    return headers


def _marks(cell: Cell) -> str:
    """The marks after a strategy's time or name: ÷N sub-batches, † arena over the budget, ‡ trained differently."""
    return ((f" {SPLIT_MARK}{cell.sub_batches}" if cell.sub_batches > 1 else "")
            + (f" {ARENA_FLAG}" if cell.over_allocators else "")
            + (f" {GRAD_FLAG}" if cell.trained_differently else ""))


def _failure(cell: Cell) -> str:
    """A cell that did not run: its status, how many repeats failed, and the bytes its planner said it needs."""
    mark = STATUS_MARK.get(cell.status, cell.status)
    parts = [f"{cell.failed}/{cell.repeats}"] if cell.repeats > 1 else []
    if cell.status == "infeasible" and not math.isnan(cell.needed_bytes):
        parts.append(f"needs {fmt_bytes(cell.needed_bytes)}")
    return f"{mark} ({'; '.join(parts)})" if parts else mark


def grid(table: ExecutorTable, text: Callable[[str, str, Cell], str]) -> tuple[list[list[str]], set[tuple[int, int]]]:
    """Strategy x budget lines: ``text`` of each cell that ran, the status of each that did not."""
    lines, bad = [], set()
    for i, planner in enumerate(planner_order(table.rows)):
        line = [planner]
        for j, budget in enumerate(budget_order(table.rows), start=1):
            cell = table.cells.get((planner, budget))
            if cell is None:
                line.append("")
            elif not cell.ok:
                line.append(_failure(cell))
                bad.add((i, j))
            else:
                line.append(text(planner, budget, cell))
        lines.append(line)
    return lines, bad


def time_table(table: ExecutorTable) -> tuple[list[str], list[list[str]], set[tuple[int, int]]]:
    """Strategy x budget for one executor: iteration time in ms, the fastest of each budget marked.

    A cell reads ``★ 194.20 ±1.30 (1.34x)``: the fastest at that budget, its time (the suite's
    statistic over repeats), the spread for measured rows, and the time over the ideal
    iteration (``ideal_s``, the same for the whole table), then the marks of ``_marks`` and
    ``MORE_MEMORY_MARK`` where the strategy ran faster at a smaller budget (``slower_with_more_memory``).
    """
    budgets, measured = budget_order(table.rows), is_measured(table.rows)
    winners = {b: fastest(table.cells, b) for b in budgets}
    slower = table.slower_with_more_memory

    def text(planner: str, budget: str, cell: Cell) -> str:
        out = f"{cell.time_s * 1e3:.2f}"
        if measured and not math.isnan(cell.spread_s):
            out += f" ±{cell.spread_s * 1e3:.2f}"
        out += f" ({cell.slowdown:.2f}x)"
        if planner in winners[budget]:
            out = f"{FASTEST} {out}"
        return out + _marks(cell) + (f" {MORE_MEMORY_MARK}" if (planner, budget) in slower else "")

    lines, bad = grid(table, text)
    return ["planner", *_budget_headers(table.rows, budgets)], lines, bad


def bound_table(table: ExecutorTable) -> tuple[list[str], list[list[str]], set[tuple[int, int]]]:
    """Strategy x budget: iteration time over the budget's lower bound (the same bound for the column)."""
    lines, bad = grid(table, lambda p, b, cell: fmt_ratio(cell.ratio_to_budget_lb))
    return ["planner", *_budget_headers(table.rows, budget_order(table.rows), with_lb=True)], lines, bad


def does_what(rows: pd.DataFrame) -> bool:
    """True when ``rows`` say what their schedules do with the saved data (``kept_bytes``...; rows
    written before those columns existed do not)."""
    return bool(rows["kept_bytes"].notna().any())


def _lead(time_s: float, winner_s: float) -> str:
    """``time_s`` over the winner's, to three decimals: a 0.4% lead reads 1.004x, not a tie's 1.00x; a
    lead below 0.05% (not a tie: that is named) to the first digit that shows it (1.0001x)."""
    if winner_s <= 0:
        return "-"
    ratio = time_s / winner_s
    text = f"{ratio:.3f}x"
    digits = 3
    while ratio > 1 and float(text[:-1]) == 1.0 and digits < 12:
        digits += 1
        text = f"{ratio:.{digits}f}x"
    return text


def strategy_table(table: ExecutorTable) -> tuple[list[str], list[list[str]], set[tuple[int, int]]]:
    """Budget x (the fastest strategy, its time, the runner-up and the lead, what the winner does).

    One line per budget, ascending: the fastest strategy by iteration time (the quantity common
    to the budget; every strategy of a tie, the first listed describing the line), its time and
    slowdown over the ideal iteration, the fastest of the others (every one of a tie) and how many times faster the
    winner is (its time over the winner's), and the winner's saved data
    of one iteration kept on the device, offloaded and recomputed. Names carry ``_marks``. When a
    winner's arena exceeds the budget (†), a last column names the fastest whose arena fits in every
    allocator model of the suite, with its time over the winner's. A budget where nothing ran says
    so (and is marked).
    """
    planners = planner_order(table.rows)
    fit_column = any(table.cells[p, b].over_allocators for b in budget_order(table.rows)
                     for p in fastest(table.cells, b))
    lines, bad = [], set()
    for i, budget in enumerate(budget_order(table.rows)):
        at = table.rows[table.rows["budget_label"] == budget]
        size = at["budget_bytes"].dropna()
        line = [f"{budget} ({fmt_bytes(size.iloc[0]) if len(size) else '-'})"]
        winners = fastest(table.cells, budget)
        if not winners:
            any_ran = any(c.ok for (p, b), c in table.cells.items() if b == budget)
            lines.append(line + [f"none trained the same network ({GRAD_FLAG})" if any_ran else "none fits",
                                 *["-"] * (8 if fit_column else 7)])
            bad.add((i, 1))
            continue
        tied = [p for p in planners if p in winners]
        winner = tied[0]  # what the line says the winner does: the first listed of a tie
        cell = table.cells[winner, budget]
        time_s = cell.time_s
        others = sorted(((c.time_s, p) for (p, b), c in table.cells.items()
                         if b == budget and p not in winners and c.ranked),
                        key=lambda r: (r[0], planners.index(r[1])))
        ran = [(table.cells[p, budget].time_s, p) for p in tied] + others
        names = ", ".join(p + _marks(table.cells[p, budget]) for p in tied)
        line += [names + (" (tie)" if len(tied) > 1 else ""), f"{time_s * 1e3:.2f}", f"{cell.slowdown:.2f}x"]
        if others:
            same = cell.schedule and table.cells[others[0][1], budget].schedule == cell.schedule
            noise = " (the same schedule: noise)" if same else \
                " (within the spreads)" if budget in table.close_calls else ""
            runners_up = [p for t, p in others if t <= others[0][0] * (1 + TIE)]  # a tie, as ``fastest`` has it
            line += [", ".join(p + _marks(table.cells[p, budget]) for p in runners_up)
                     + (" (tie)" if len(runners_up) > 1 else ""), _lead(others[0][0], time_s) + noise]
        else:
            line += ["-", "-"]
        plan = plan_rows(at[at["planner_label"] == winner]).iloc[0]
        line += [fmt_bytes(plan["kept_bytes"]), fmt_bytes(plan["offloaded_bytes"]), fmt_bytes(plan["recomputed_bytes"])]
        if fit_column:
            fits = [(t, p) for t, p in ran if not table.cells[p, budget].over_allocators]
            lead = f" ({_lead(fits[0][0], time_s)} the winner's time)" if fits and time_s > 0 else ""
            line.append("-" if not cell.over_allocators else "none" if not fits else
                        f"{fits[0][1]}{_marks(table.cells[fits[0][1], budget])}{lead}")
        lines.append(line)
    headers = ["budget", "fastest", "time ms", "x ideal", "runner-up", "lead", "kept", "offloaded", "recomputed"]
    return headers + ([FIT_HEADER] if fit_column else []), \
        lines, bad


PLACEMENT_TABLE = (
    "One line per schedule that ran (executor, strategy, budget): every allocator placed that schedule's "
    "allocation trace, so the line shares one lower bound, the trace's max-live bytes. Each cell is the arena "
    "the allocator needed with no cap and, in brackets, the arena over max-live (whether a schedule fits its "
    "budget, the time table's mark, is judged by this arena, except for a model of PyTorch's caching allocator, "
    "which gives cached segments back at a cap: it is replayed capped at the budget, which may need less).")
PLACEMENT_MARKS = f" {FASTEST} marks the smallest arena of the line; '-' is an allocator that did not place the trace."


def placement_table(rows: pd.DataFrame) -> tuple[list[str], list[list[str]], str] | None:
    """(executor, strategy, budget) x allocator: the arena each allocator needed for the same trace,
    and the note that says how to read it.

    Allocators are compared only where they placed the same allocation trace (one schedule, one
    budget), against that trace's max-live bytes, never through an average over budgets whose
    sets differ between strategies. None when ``rows`` have no allocator.
    """
    placed = rows[(rows["allocator"] != "") & (rows["status"] == "ok")]
    if placed.empty:
        return None
    allocators = list(dict.fromkeys(placed["allocator"]))
    several = placed["executor"].nunique() > 1
    lines = []
    for executor in executors(placed):
        at = placed[placed["executor"] == executor]
        for planner in planner_order(at):
            mine = at[at["planner_label"] == planner]
            for budget in budget_order(mine):
                lines.append(([executor] if several else []) + [planner, budget] +
                             _arena_cells(mine[mine["budget_label"] == budget], allocators))
    headers = (["executor"] if several else []) + ["strategy", "budget", "max-live", *allocators]
    return headers, lines, PLACEMENT_TABLE + (PLACEMENT_MARKS if len(allocators) > 1 else "")


def _arena_cells(trace: pd.DataFrame, allocators: list[str]) -> list[str]:
    """The trace's max-live, then each allocator's arena for it (ratio to max-live), the smallest
    marked when there are several allocators."""
    live = number(trace["max_live_bytes"].max())
    arenas = {a: number(trace.loc[trace["allocator"] == a, "arena_bytes"].min()) for a in allocators}
    smallest = min((v for v in arenas.values() if v is not None), default=None)
    cells = [fmt_bytes(live)]
    for v in arenas.values():
        text = "-" if v is None else fmt_bytes(v) + (f" ({v / live:.3f})" if live else "")
        cells.append(f"{FASTEST} {text}" if v is not None and v == smallest and len(allocators) > 1 else text)
    return cells


def claims_table(tables: Sequence[ExecutorTable]) -> tuple[list[str], list[list[str]]] | None:
    """The paper's claims (``harness.claims``) per model and executor; None when no table has a
    recompute-only strategy and the new columns."""
    from harness.claims import OVERHEAD_LIMIT, check_claims, verdict

    lines = []
    for table in tables:
        if not does_what(table.rows):
            continue
        c = check_claims(table.rows, table.cells)
        if c.recompute_planner is None:
            continue
        if c.combined_planner is None:
            share = "not run (no hybrid planner in the suite)"
        elif c.overhead_share is None:
            share = f"no budget where {c.recompute_planner} and hybrid both ran with an overhead"
        else:
            budgets = "budget" if c.share_budgets == 1 else "budgets"
            share = f"{c.overhead_share:.2f} over {c.share_budgets} {budgets} ({c.recompute_planner} vs hybrid)"
        if c.memory_reduction is None:
            reduction = f"no budget within {OVERHEAD_LIMIT:.1f}x the ideal time"
        elif c.grid_reduction is not None and c.grid_reduction <= 1:  # QA: "0.31x" read as a reduction
            reduction = "no budget below the keep-all peak"
        else:
            reduction = (f"{c.memory_reduction:.2f}x ({fmt_bytes(c.activation_bytes)} of activations at the keep-all "
                         f"peak; budget {fmt_bytes(c.reduction_budget)}; {c.reduction_strategy})")
            if c.reduction_held is None and c.combined_planner is not None:
                reduction += f"; nothing ran where more than {c.grid_reduction:.2f}x could show"
        lines.append([table.title, share, verdict(c.share_held), reduction, verdict(c.reduction_held)])
    if not lines:
        return None
    return ["model, executor", "overhead share offloading removes (paper: about 1/3)", "",
            "activation-memory reduction at under 20% overhead (paper: 4-6x)", ""], lines
