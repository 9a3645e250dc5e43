"""``membudget publish`` and ``membudget compare``: the tables and plots people read.

``publish(results, out)`` writes, for each run (the latest of each suite given):

- ``<out>/<suite>/index.md`` and ``index.html`` (well-formed XHTML): per model, the
  makespan / LB table (strategy x budget), the plots, the placement table when the
  suite has allocators, and every case with its status and message;
- the plots (PNG, matplotlib's Agg backend), per model: makespan / LB against the
  memory limit (papers/004 Figure 5), throughput against memory (papers/004 Figures
  13-19), iteration time against the budget (papers/000 Figure 8), and a timeline of
  compute and copies for one case (from the run's ``timelines/``);
- ``<out>/index.md`` and ``index.html`` linking the suites.

``compare(a, b)`` lines up the rows of two runs by case id and reports what changed.
"""

from __future__ import annotations

import html
import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd

from harness.results import (ROWS_CSV, ResultsError, RunFolder, RunProfiles, check_results_table, find_runs, load_rows,
                             read_meta, read_notes, write_frame_csv)
from harness.units import format_bytes

STATUS_MARK = {"infeasible": "infeasible", "oom": "oom", "error": "error"}
_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.bad { color: #a00; }
img { max-width: 100%; border: 1px solid #eee; }
code { background: #f4f4f4; padding: 0 0.2em; }
.small { color: #666; font-size: 0.85em; }
"""


# --------------------------------------------------------------------------- documents


class Doc:
    """A page written twice, as Markdown and as XHTML, from the same calls."""

    def __init__(self, title: str):
        self.title = title
        self.md: list[str] = [f"# {title}", ""]
        self.html: list[str] = [f"<h1>{html.escape(title)}</h1>"]

    def heading(self, text: str, level: int = 2) -> None:
        """A section heading."""
        self.md += [f"{'#' * level} {text}", ""]
        self.html.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def para(self, text: str, small: bool = False) -> None:
        """A paragraph of plain text."""
        self.md += [text, ""]
        cls = ' class="small"' if small else ""
        self.html.append(f"<p{cls}>{html.escape(text)}</p>")

    def link_para(self, before: str, label: str, href: str, after: str = "", small: bool = False) -> None:
        """A paragraph of plain text with one link in it."""
        self.md += [f"{before}[{label}]({href}){after}", ""]
        cls = ' class="small"' if small else ""
        self.html.append(f'<p{cls}>{html.escape(before)}<a href="{html.escape(href)}">{html.escape(label)}</a>'
                         f"{html.escape(after)}</p>")

    def markdown(self, text: str) -> None:
        """A passage written in Markdown by a person (a run's notes): as it is on the Markdown page, rendered
        on the HTML one."""
        import markdown

        self.md += [text, ""]
        self.html.append(markdown.markdown(text, extensions=["tables"], output_format="xhtml"))

    def link_list(self, items: Sequence[tuple[str, str]]) -> None:
        """A bulleted list of (text, href) links."""
        self.md += [f"- [{text}]({href})" for text, href in items] + [""]
        lis = "".join(f'<li><a href="{html.escape(href)}">{html.escape(text)}</a></li>' for text, href in items)
        self.html.append(f"<ul>{lis}</ul>")

    def image(self, src: str, alt: str) -> None:
        """An image (a plot file beside the page)."""
        self.md += [f"![{alt}]({src})", ""]
        self.html.append(f'<p><img src="{html.escape(src)}" alt="{html.escape(alt)}"/></p>')

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]],
              bad: set[tuple[int, int]] = frozenset()) -> None:
        """A table; ``bad`` marks cells (row, column) to show as failures."""
        def md_cell(v: Any) -> str:
            return str(v).replace("|", "\\|").replace("\n", " ")

        self.md.append("| " + " | ".join(md_cell(h) for h in headers) + " |")
        self.md.append("|" + "|".join(" --- " for _ in headers) + "|")
        self.md += ["| " + " | ".join(md_cell(v) for v in row) + " |" for row in rows]
        self.md.append("")
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
        body = []
        for i, row in enumerate(rows):
            cells = "".join(
                ('<td class="bad">' if (i, j) in bad else "<td>") + f"{html.escape(str(v))}</td>"
                for j, v in enumerate(row)
            )
            body.append(f"<tr>{cells}</tr>")
        self.html.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")

    def write(self, folder: Path, stem: str = "index") -> list[Path]:
        """Write ``stem.md`` and ``stem.html`` into ``folder``."""
        md, page = folder / f"{stem}.md", folder / f"{stem}.html"
        md.write_text("\n".join(self.md).rstrip() + "\n", encoding="utf-8")
        page.write_text(
            "<!DOCTYPE html>\n"
            '<html xmlns="http://www.w3.org/1999/xhtml" lang="en">\n'
            f'<head><meta charset="utf-8"/><title>{html.escape(self.title)}</title>'
            f"<style>{_CSS}</style></head>\n<body>\n" + "\n".join(self.html) + "\n</body>\n</html>\n",
            encoding="utf-8",
        )
        return [md, page]


# --------------------------------------------------------------------------- formatting


def _num(value: Any) -> float | None:
    if value is None or value is pd.NA:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def fmt_ms(value: Any) -> str:
    """Seconds as milliseconds, or ``-``."""
    f = _num(value)
    return "-" if f is None else f"{f * 1e3:.2f}"


def fmt_bytes(value: Any) -> str:
    """Bytes with a binary unit, or ``-``."""
    f = _num(value)
    return "-" if f is None else format_bytes(f)


def fmt_error(value: Any) -> str:
    """A gradient error in two significant digits (``3.1e-07``), or ``-``."""
    v = _num(value)
    return "-" if v is None else f"{v:.1e}"


def fmt_ratio(value: Any) -> str:
    """A ratio with three decimals, or ``-``."""
    f = _num(value)
    return "-" if f is None else f"{f:.3f}"


def _slug(text: str) -> str:
    from harness.results import file_stem

    return file_stem(text, limit=200)  # plot names add up to 35 bytes around it


@dataclass(frozen=True)
class Group:
    """The rows of one model at one batch and input size."""

    model: str
    batch_size: int
    input_size: str
    rows: pd.DataFrame

    @property
    def title(self) -> str:
        """``torchvision:resnet18, batch 32, 3x224x224``."""
        return f"{self.model}, batch {self.batch_size}, {self.input_size}"

    @property
    def key(self) -> str:
        """A file-name stem."""
        return _slug(f"{self.model}-b{self.batch_size}-{self.input_size}")


def model_groups(frame: pd.DataFrame) -> list[Group]:
    """Rows split by (model, batch, input size), in order of appearance."""
    out = []
    for (model, batch, size), rows in frame.groupby(["model", "batch_size", "input_size"], sort=False):
        out.append(Group(model, int(batch), size, rows))
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


def _planner_order(rows: pd.DataFrame) -> list[str]:
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


# --------------------------------------------------------------------------- one cell per strategy and budget

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


@dataclass(frozen=True)
class Cell:
    """One strategy at one budget on one executor: its repeats summarised.

    ``time_s`` is the column's common quantity (the iteration time); ``spread_s`` is half the
    interquartile range of a measured run's timed iterations, or half the range of the kept
    repeats; ``over_allocators`` names the allocator models of the suite whose arena for the
    schedule's trace exceeds the budget (empty when all fit; ``arena_note`` gives the amounts);
    ``grad_error`` is the largest gradient error of its torch rows (NaN without a gradient check);
    ``sub_batches``, how many parts the schedule splits the batch into (1: it does not).
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


def summarise(rows: pd.DataFrame, statistic: str = "trimmed-mean") -> dict[tuple[str, str], Cell]:
    """(planner label, budget label) -> Cell, for the rows of one model group on one executor."""
    out: dict[tuple[str, str], Cell] = {}
    for (planner, budget), cell in rows.groupby(["planner_label", "budget_label"], sort=False):
        planned = plan_rows(cell)
        failed = planned[planned["status"] != "ok"]
        names = tuple(dict.fromkeys(over_budget_rows(cell)["allocator"]))
        if not failed.empty:
            out[planner, budget] = Cell(str(failed["status"].iloc[0]), repeats=len(planned), failed=len(failed))
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
        out[planner, budget] = Cell(
            "ok", time_s, spread,
            time_s / float(budget_lb.iloc[0]) if len(budget_lb) and budget_lb.iloc[0] > 0 else math.nan,
            time_s / float(ideal.iloc[0]) if len(ideal) and ideal.iloc[0] > 0 else math.nan,
            repeats=len(planned), over_allocators=names, grad_error=float(grads.max()) if len(grads) else math.nan,
            sub_batches=int(parts.max()) if len(parts) else 1,
        )
    return out


def fastest(cells: dict[tuple[str, str], Cell], budget: str, rel: float = 1e-9) -> set[str]:
    """The planner labels with the smallest iteration time at ``budget`` (ties within ``rel``); empty
    when nothing ran. A strategy that trained a different network (``Cell.trained_differently``) is not
    a contender."""
    ran = {p: c.time_s for (p, b), c in cells.items() if b == budget and c.ranked}
    if not ran:
        return set()
    best = min(ran.values())
    return {p for p, t in ran.items() if t <= best * (1 + rel)}


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

    @property
    def title(self) -> str:
        """``torchvision:resnet18, batch 32, 3x224x224, simulate executor``."""
        return f"{self.group.title}, {self.executor} executor"


FASTEST = "★"
ARENA_FLAG = "†"
FIT_HEADER = f"fastest with its arena in the budget ({ARENA_FLAG} winners)"  # strategy_table's last column
GRAD_FLAG = "‡"
SPLIT_MARK = "÷"  # ÷N: the schedule splits the batch into N sub-batches
# grad_error above which a strategy did not train the same network: another convolution algorithm's or
# TF32's rounding stays orders of magnitude below it, a lost or doubled gradient contribution far above
GRAD_TOLERANCE = 0.05


def _budget_headers(rows: pd.DataFrame, budgets: list[str], with_lb: bool = False) -> list[str]:
    headers = []
    for label in budgets:
        at = rows[rows["budget_label"] == label]
        size = at["budget_bytes"].dropna()
        parts = [fmt_bytes(size.iloc[0])] if len(size) else []
        lb = at["budget_lower_bound_s"].dropna()
        if with_lb and len(lb):
            parts.append(f"LB {fmt_ms(lb.iloc[0])} ms")
        headers.append(f"{label} ({'; '.join(parts)})" if parts else label)
    return headers


def _marks(cell: Cell) -> str:
    """The marks after a strategy's time or name: ÷N sub-batches, † arena over the budget, ‡ trained differently."""
    return ((f" {SPLIT_MARK}{cell.sub_batches}" if cell.sub_batches > 1 else "")
            + (f" {ARENA_FLAG}" if cell.over_allocators else "")
            + (f" {GRAD_FLAG}" if cell.trained_differently else ""))


def _failure(cell: Cell) -> str:
    mark = STATUS_MARK.get(cell.status, cell.status)
    return f"{mark} ({cell.failed}/{cell.repeats})" if cell.repeats > 1 else mark


def grid(table: ExecutorTable, text: Callable[[str, str, Cell], str]) -> tuple[list[list[str]], set[tuple[int, int]]]:
    """Strategy x budget lines: ``text`` of each cell that ran, the status of each that did not."""
    lines, bad = [], set()
    for i, planner in enumerate(_planner_order(table.rows)):
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
    iteration (``ideal_s``, the same for the whole table), then the marks of ``_marks``.
    """
    budgets, measured = budget_order(table.rows), is_measured(table.rows)
    winners = {b: fastest(table.cells, b) for b in budgets}

    def text(planner: str, budget: str, cell: Cell) -> str:
        out = f"{cell.time_s * 1e3:.2f}"
        if measured and not math.isnan(cell.spread_s):
            out += f" ±{cell.spread_s * 1e3:.2f}"
        out += f" ({cell.slowdown:.2f}x)"
        if planner in winners[budget]:
            out = f"{FASTEST} {out}"
        return out + _marks(cell)

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
    slowdown over the ideal iteration, the fastest of the others and how many times faster the
    winner is (its time over the winner's), and the winner's saved data
    of one iteration kept on the device, offloaded and recomputed. Names carry ``_marks``. When a
    winner's arena exceeds the budget (†), a last column names the fastest whose arena fits in every
    allocator model of the suite, with its time over the winner's. A budget where nothing ran says
    so (and is marked).
    """
    planners = _planner_order(table.rows)
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
            line += [others[0][1] + _marks(table.cells[others[0][1], budget]), _lead(others[0][0], time_s)]
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


CHAIN_BUDGETS = (
    "Budgets on this page are bytes of the chain model (weights, saved data, gradients and workspaces as the "
    "profile counts them), not what a CUDA process reserves: its context, the libraries' workspaces and the "
    "allocator's fragmentation come on top (budget_model: device plans within a device's bytes instead; "
    "docs/cli.md, \"What a budget means\").")
DEVICE_BUDGETS = (
    "Budgets on this page are what the training process may reserve on the device (budget_model: device): "
    "each planner planned within what is left of it once the runtime's bytes and the allocator's "
    "fragmentation are set aside.")

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
        for planner in _planner_order(at):
            mine = at[at["planner_label"] == planner]
            for budget in budget_order(mine):
                lines.append(([executor] if several else []) + [planner, budget] +
                             _arena_cells(mine[mine["budget_label"] == budget], allocators))
    headers = (["executor"] if several else []) + ["strategy", "budget", "max-live", *allocators]
    return headers, lines, PLACEMENT_TABLE + (PLACEMENT_MARKS if len(allocators) > 1 else "")


def _arena_cells(trace: pd.DataFrame, allocators: list[str]) -> list[str]:
    """The trace's max-live, then each allocator's arena for it (ratio to max-live), the smallest
    marked when there are several allocators."""
    live = _num(trace["max_live_bytes"].max())
    arenas = {a: _num(trace.loc[trace["allocator"] == a, "arena_bytes"].min()) for a in allocators}
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
            share = f"{c.overhead_share:.2f} over {c.share_budgets} budgets ({c.recompute_planner} vs hybrid)"
        if c.memory_reduction is None:
            reduction = f"no budget within {OVERHEAD_LIMIT:.1f}x the ideal time"
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


# --------------------------------------------------------------------------- plots


def _figure(width: float = 8.5, height: float = 4.2):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.add_subplot(1, 1, 1)


_MARKERS = "os^vDPX*h<>p"
_DASHES = ("-", "--", "-.", ":")


def _styles(planners: Sequence[str]) -> dict[str, dict[str, Any]]:
    """A colour, marker and line style per strategy, distinct for up to 20 of them.

    Colours are hex strings: a bare RGB tuple given to ``bar`` with three bars is read as three
    colours. Markers shrink from the first strategy to the last, so that two strategies with
    the same values (greedy and capacity often are) both stay visible.
    """
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    colours = colormaps["tab20"].colors
    n = max(1, len(planners))
    return {p: {"color": to_hex(colours[(2 * k) % 20 + (k // 10) % 2]), "marker": _MARKERS[k % len(_MARKERS)],
                "linestyle": _DASHES[k % len(_DASHES)], "markersize": 11 - 6 * k / n, "zorder": 2 + k}
            for k, p in enumerate(planners)}


def _wrap(title: str, width: int = 64) -> str:
    """A title in lines that fit the plot beside its legend (a long one was cut at the figure's left edge)."""
    import textwrap

    return "\n".join(textwrap.wrap(title, width, break_on_hyphens=False)) or title


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, format=path.suffix.lstrip("."))
    return path


def _plot_per_planner(ax, table: ExecutorTable, value: Callable[[Cell], float]) -> None:
    """One line per strategy: ``value`` of its cells that ran against the memory limit in GiB."""
    budgets = table.rows.groupby("budget_label", sort=False)["budget_bytes"].median()
    for planner, style in _styles(_planner_order(table.rows)).items():
        points = sorted((float(budgets[b]) / 2**30, value(c)) for (p, b), c in table.cells.items()
                        if p == planner and c.ok)
        if points:
            ax.plot(*zip(*points), label=planner, **style)


def plot_ratio(table: ExecutorTable, path: Path) -> Path:
    """Iteration time over the budget's lower bound against the memory limit (papers/004 Figure 5)."""
    fig, ax = _figure()
    _plot_per_planner(ax, table, lambda c: c.ratio_to_budget_lb)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("memory limit (GiB)")
    ax.set_ylabel("iteration time / LB of the budget")
    ax.set_title(_wrap(f"{table.title}: time / LB (cf. papers/004 Fig. 5)"), fontsize=10)
    _legend(ax)
    return _save(fig, path)


def plot_throughput(table: ExecutorTable, path: Path) -> Path:
    """Samples per second against the memory limit (papers/004 Figures 13-19), with the ideal."""
    fig, ax = _figure()
    batch = table.group.batch_size
    _plot_per_planner(ax, table, lambda c: batch / c.time_s)
    ideal = table.rows["ideal_s"].dropna()
    if len(ideal):
        ax.axhline(batch / ideal.iloc[0], color="grey", lw=0.8, ls="--", label="ideal (no offloading)")
    ax.set_xlabel("memory limit (GiB)")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title(_wrap(f"{table.title}: throughput (cf. papers/004 Figs. 13-19)"), fontsize=10)
    _legend(ax)
    return _save(fig, path)


def plot_time(table: ExecutorTable, path: Path) -> Path:
    """Iteration time per budget, bars per strategy; failed cases marked x (papers/000 Figure 8)."""
    return _save(time_figure(table), path)


def time_figure(table: ExecutorTable):
    """The figure of ``plot_time``: one bar colour per strategy."""
    fig, ax = _figure()
    rows, cells = table.rows, table.cells
    budgets, planners = budget_order(rows), _planner_order(rows)
    styles = _styles(planners)
    width = 0.8 / max(1, len(planners))
    for k, planner in enumerate(planners):
        xs, ys, fails = [], [], []
        for j, label in enumerate(budgets):
            cell = cells.get((planner, label))
            x = j - 0.4 + width * (k + 0.5)
            if cell is not None and cell.ok:
                xs.append(x)
                ys.append(cell.time_s * 1e3)
            elif cell is not None:
                fails.append(x)
        colour = styles[planner]["color"]
        if not xs:  # nothing ran: an invisible bar still gives the legend this strategy's colour
            xs, ys = [0], [0]
        ax.bar(xs, ys, width=width, label=planner, color=colour)
        if fails:
            ax.plot(fails, [0] * len(fails), "x", color=colour)
    ideal = rows["ideal_s"].dropna()
    if len(ideal):
        ax.axhline(ideal.iloc[0] * 1e3, color="grey", lw=0.8, ls="--", label="ideal")
    ax.set_xticks(range(len(budgets)))
    ax.set_xticklabels(budgets, fontsize=8)
    ax.set_xlabel("memory budget (x marks a case that did not run)")
    ax.set_ylabel("iteration time (ms)")
    ax.set_title(_wrap(f"{table.title}: time per budget (cf. papers/000 Fig. 8)"), fontsize=10)
    _legend(ax)
    return fig


def plot_timeline(timeline: dict[str, Any], path: Path) -> Path:
    """Compute and copy streams of one case as bars over time."""
    events = timeline["events"]
    streams = list(dict.fromkeys(e[1] for e in events))
    fig, ax = _figure(9.0, 1.2 + 0.7 * len(streams))
    colours = {"F": "tab:blue", "B": "tab:orange", "offload": "tab:green", "prefetch": "tab:red"}
    for y, stream in enumerate(streams):
        for label, _stream, start, end in (e for e in events if e[1] == stream):
            kind = label.split()[0] if " " in label else label[:1]
            ax.broken_barh([(start * 1e3, max(end - start, 0) * 1e3)], (y - 0.35, 0.7),
                           facecolors=colours.get(kind, "tab:grey"), edgecolor="white", linewidth=0.3)
    ax.invert_yaxis()  # compute on top
    ax.set_yticks(range(len(streams)))
    ax.set_yticklabels(streams)
    ax.set_xlabel("time (ms)")
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=k) for k, c in colours.items()]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title(_wrap(f"timeline: {timeline.get('case_id', '')}", 90), fontsize=9)
    return _save(fig, path)


def pick_timeline(rows: pd.DataFrame) -> pd.Series | None:
    """The case whose timeline to show: one that moves data, nearest the middle of the budgets."""
    rows = plan_rows(rows)
    have = rows[(rows["status"] == "ok") & (rows["timeline"] != "")]
    if have.empty:
        return None
    moving = have[have["moved_bytes"].fillna(0) > 0]
    pool = moving if not moving.empty else have
    distance = (pool["budget_fraction"].fillna(0.5) - 0.5).abs()
    return pool.loc[distance.sort_values(kind="stable").index[0]]


# --------------------------------------------------------------------------- pages


def _commit(git: dict[str, Any]) -> str:
    commit = (git.get("commit") or "unknown")[:12]
    if git.get("dirty"):
        return f"{commit} plus uncommitted changes"
    return commit


def profilers_of(frame: pd.DataFrame, meta: Mapping[str, Any]) -> str:
    """The profilers of a run's rows, in words: every one when there are several, else the suite's."""
    profilers = [p for p in dict.fromkeys(frame["profiler"]) if p]
    return " and ".join(profilers) if len(profilers) > 1 else meta.get("profiler") or "".join(profilers) or "?"


def _meta_lines(meta: dict[str, Any], built: dict[str, Any], frame: pd.DataFrame, mixed: bool) -> list[str]:
    """The run's start, status, profilers, commits and packages (``mixed``: its rows came from sessions at
    different code, ``sessions_line``)."""
    env = meta.get("environment", {})
    profiler = profilers_of(frame, meta)
    pkgs = env.get("packages", {})
    sessions = meta.get("sessions", [])
    started = sessions[0].get("started", "") if sessions else ""
    versions = ", ".join(f"{k} {v}" for k, v in pkgs.items() if v)
    return [
        f"Run {meta.get('run_id', '?')} started {started}; status {meta.get('status', '?')}; "
        f"profiler {profiler} on {meta.get('device', '?')}; "
        f"{'the latest session' if mixed else 'rows'} computed at commit "
        f"{_commit(env.get('git', {}))}; this page built from commit {_commit(built)}.",
        f"Python {env.get('python', '?')}; {versions}.",
    ]


def plugins_line(meta: Mapping[str, Any], frame: pd.DataFrame) -> str | None:
    """Which plugin, at which version, brought each planner, executor and allocator of the rows
    (``meta.json``'s ``environment.plugins``, written by the run's latest session): a third party's
    strategy is compared with the bundled ones, and the reader sees whose code ran. An allocator's
    custom ``label:`` is traced to its name through the suite's entries. None without that record."""
    brought = {(e.get("kind"), e.get("name")): f"{e.get('plugin') or '?'} {e.get('version') or '?'}"
               for e in meta.get("environment", {}).get("plugins", []) or []}
    if not brought:
        return None
    labelled = {e["label"]: e.get("name") for e in meta.get("spec", {}).get("allocators", []) or []
                if isinstance(e, dict) and e.get("label")}
    parts = []
    for kind in ("planner", "executor", "allocator"):
        described = []
        for shown in (n for n in dict.fromkeys(frame[kind].fillna("")) if n) if kind in frame else ():
            name = labelled.get(shown, shown) if kind == "allocator" else shown
            name = name.split("[")[0]  # a label with options: name[key=value]
            described.append(f"{shown} ({brought[(kind, name)]})" if (kind, name) in brought else shown)
        if described:
            parts.append(f"{kind}s " + ", ".join(described))
    return ("Plugins (distribution and version): " + "; ".join(parts) + ".") if parts else None


def _version_change(then: str, now: str) -> str:
    """``membudget-x 0.1 (now 0.2)`` for one distribution, else both in full."""
    plugin = then.rpartition(" ")[0] + " "
    return f"{then} (now {now.removeprefix(plugin)})"


def sessions_line(meta: Mapping[str, Any], frame: pd.DataFrame) -> str | None:
    """Which code computed which rows, when a run was resumed at another commit or with other plugin
    versions (each session of ``meta.json`` records its own; a row belongs to the last session that
    started, to the second, before it finished). None when every row came from the same code, or the
    sessions do not say (runs written before sessions recorded their code)."""
    sessions = sorted((s for s in meta.get("sessions", []) or [] if "git" in s and s.get("started")),
                      key=lambda s: s["started"])
    if len(sessions) < 2 or "finished_at" not in frame:
        return None
    latest = sessions[-1].get("plugin_versions", {})
    code = []  # each session's code, in words: its commit and the plugin versions that differ from the latest
    for session in sessions:
        changed = sorted({_version_change(v, latest[k]) for k, v in session.get("plugin_versions", {}).items()
                          if k in latest and latest[k] != v})
        code.append(_commit(session["git"]) + (" with " + ", ".join(changed) if changed else ""))
    starts = pd.to_datetime(pd.Series([s["started"] for s in sessions]), utc=True)
    finished = pd.to_datetime(frame["finished_at"], utc=True, errors="coerce").dropna()
    session_of = pd.Series(starts.searchsorted(finished, side="right") - 1).clip(lower=0)
    rows: dict[str, list] = {}  # code -> [its rows, the days its sessions started], in session order
    for index, n in session_of.value_counts().sort_index().items():
        entry = rows.setdefault(code[index], [0, []])
        entry[0] += n
        day = sessions[index]["started"][:10]
        if day not in entry[1]:
            entry[1].append(day)
    if len(rows) < 2:
        return None
    parts = [f"{n} at commit {words} (started {', '.join(days)})" for words, (n, days) in rows.items()]
    return ("Rows from sessions at different code: " + "; ".join(parts) + ". The Plugins line names the latest "
            "session's versions.")


def labels_line(frame: pd.DataFrame) -> str | None:
    """What the strategies named by a suite's own ``label:`` run: the planner and its options (a label
    ``name[key=value]`` says it already); None when the rows have no such label."""
    said = []
    seen = frame[["planner_label", "planner", "planner_options"]].fillna("").drop_duplicates("planner_label")
    for label, planner, options in seen.itertuples(index=False):
        if not label or label == planner or label.startswith(f"{planner}["):
            continue
        try:
            given = json.loads(options) if options else {}
        except ValueError:
            given = {}
        words = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in given.items())
        said.append(f"{label} is {planner}" + (f" with {words}" if words else ""))
    return ("Labels: " + "; ".join(said) + ".") if said else None


def what_ran(frame: pd.DataFrame, meta: dict[str, Any]) -> str:
    """The page's first line: simulated or measured, by which executors, on which profiles."""
    devices = [d for d in dict.fromkeys(frame["device"]) if d]
    profiler = profilers_of(frame, meta)
    device = meta.get("device") or " and ".join(devices) or "?"
    gpu = meta.get("environment", {}).get("cuda_device")
    kinds = {e: kind_of(frame[frame["executor"] == e]) for e in executors(frame)}
    measured = [e for e, k in kinds.items() if k == "measured"]
    simulated = [e for e, k in kinds.items() if k == "simulated"]
    unfinished = [e for e, k in kinds.items() if k == NOTHING_FINISHED]
    none_ran = (f" The {', '.join(unfinished)} executor finished no case (its rows say why)." if unfinished else "")
    if not measured:
        if not simulated:
            return f"Nothing finished: no case of this run has an iteration time.{none_ran}"
        subject = "every iteration time" if unfinished else "every row"
        return (f"Simulations: {subject} is the {', '.join(simulated)} executor's event simulation of one training "
                f"iteration on {profiler} profiles of {device}; no GPU ran them.{none_ran}")
    where = f"on {gpu}" if gpu else "on a CPU (the run found no CUDA device)"  # never an analytic spec's name
    text = f"Measured: the {', '.join(measured)} executor's rows were timed {where}, on {profiler} profiles"
    if simulated:
        text += (f"; the {', '.join(simulated)} executor's rows are the simulator's predictions on the same "
                 "profiles. Each table and plot below names its executor")
    return text + "." + none_ran


HOW_TO_READ = (
    "How to read the tables: each budget column ranks the strategies by iteration time (ms), the quantity "
    "common to the column; {fastest} marks the fastest at that budget. (N.NNx) is the time over the ideal "
    "iteration (ideal_s: the profile's forward and backward compute time with no memory limit and nothing "
    "waited for, the same for the whole table; not a measured run){spread}. The second table divides the time by "
    "the budget's lower bound (papers/004 Prop. 3 at that budget over every choice of algorithms; the same "
    "bound for every strategy in the column, its value in the header); schedules that recompute or split "
    "the batch are not bound by it and can go below 1. The bound each schedule is judged against on its own "
    "(its algorithms, passes, recomputation) is the 'own LB' column of the list of every case."
)
SPREAD = (
    "; ±S is half the interquartile range of a measured run's timed iterations (half the range of the kept "
    "repeats when the suite repeats, summarised by its statistic: {statistic})"
)
SPLIT_NOTE = (
    "{mark}N: the schedule splits the batch into N sub-batches, running every forward and backward pass N "
    "times on a part of it (vDNN+ and moDNN do); it can run below the minimum memory of the whole batch. A model "
    "with batch normalisation then normalises over the smaller parts, which is not quite the same training; "
    "the gradient check compares the same sub-batches and does not show it."
)
BUDGET_WORDS = {
    "f": "fN budgets are the fraction N of the span from the minimum memory (of the whole batch) to the "
         "keep-all peak",
    "p": "pN budgets are the fraction N of the keep-all peak",
}


def has_spread(frame: pd.DataFrame) -> bool:
    """Whether a run's cells can carry ±S: timed iterations (a measured run) or repeated cases."""
    return bool(frame["time_iqr_s"].notna().any() or frame["repeat"].nunique() > 1)


def budget_words(frame: pd.DataFrame) -> str:
    """What the budget labels of ``frame`` mean, for the kinds it has (fN, pN); '' for bytes only."""
    kinds = {str(label)[:1] for label in frame["budget_label"] if re.fullmatch(r"[fp][0-9.]+", str(label))}
    words = [BUDGET_WORDS[k] for k in ("f", "p") if k in kinds]
    return "; ".join(words) + "." if words else ""


STRATEGY_TABLE = (
    "One line per budget: the fastest strategy by iteration time (strategies with the same time are all named, "
    "'(tie)', the first listed being the one the line describes), its time and its time over the ideal iteration; "
    "the fastest of the others and the lead (its time over the winner's: 1.500x means the winner is 1.5 times "
    "faster); "
    "and what the winner does with one iteration's saved data (the bytes the "
    "forward passes keep for the backward): kept on the device, offloaded to the host, recomputed before the "
    "backward (they sum to the same total for every strategy that does not split the batch; one that does "
    "counts every sub-batch's). Names carry the marks of the time table."
)
FIT_COLUMN = (
    " The last column, where a winner's arena exceeds the budget ({flag}), names the fastest strategy at that "
    "budget whose arena fits in every allocator model of the suite, with its time over the winner's; '-' where "
    "the winner's fits, 'none' where no strategy's does."
)

CLAIMS = (
    "{paper} report that offloading removes about a third of recomputation's overhead, and that the two "
    "together cut activation memory 4-6x at under 20% overhead. Share: the mean over budgets where both ran "
    "(and recomputation costs anything) of (T_recompute - T_hybrid) / (T_recompute - T_ideal), T_recompute from "
    "the recompute planner, else torch-checkpoint; held within 1/3 +- 0.1. Reduction: activation memory (the "
    "budget less the resident weights) of the keep-all peak over that of the smallest budget of the suite at "
    "which the combined strategy (hybrid; without it, the fastest strategy that ran, named) runs within 1.2x "
    "the ideal time; held at 4x or more, not checked where no strategy ran at a budget small enough to show "
    "4x. A grid's budget: the reduction is at least this (harness/claims.py)."
)


def arena_note(table: ExecutorTable, device_budget: bool) -> str | None:
    """The note on a time table's ``ARENA_FLAG`` cells (None when there are none): how many, in which
    allocator models, and the largest amount that exceeded the budget, which is what the runner compared
    (``harness.device_memory.arena_fits``): the arena, or under a device budget the arena plus the
    runtime bytes."""
    from harness.device_memory import arena_reservation

    over = [c for c in table.cells.values() if c.over_allocators]
    if not over:
        return None
    count, names = len(over), ", ".join(dict.fromkeys(a for c in over for a in c.over_allocators))
    rows = over_budget_rows(table.rows)
    largest = fmt_bytes(int(arena_reservation(rows["arena_bytes"], rows["runtime_bytes"].fillna(0),
                                              device_budget).max()))
    capped = ("; an allocator model that gives cached memory back at a cap, as PyTorch's caching allocator "
              "does, counts only when it cannot serve the trace capped at the budget either, its arena being an "
              "uncapped process's")
    if not device_budget:
        return (f"{ARENA_FLAG} {count} of these schedules' memory traces need a larger arena than the budget in "
                f"the {names} allocator model (largest: {largest}{capped}): the plan fits the chain model's budget, "
                "but a real allocator placing it so would likely run out of memory.")
    return (f"{ARENA_FLAG} {count} of these schedules' memory traces, placed by the {names} allocator model, need "
            f"more than the device budget: the arena plus the runtime bytes the chain model does not see, what "
            f"the process would reserve (largest: {largest}{capped}). A real allocator placing them so would "
            "likely run out of memory.")


def grad_note(table: ExecutorTable) -> str | None:
    """What the gradient check says about a time table's strategies (None when its rows have none):
    the largest error, and the ``GRAD_FLAG`` cells that trained a different network."""
    checked = [(c.grad_error, p, b) for (p, b), c in table.cells.items() if c.ok and not math.isnan(c.grad_error)]
    if not checked:
        return None
    error, planner, budget = max(checked)
    text = (f"Gradient check (grad_error: each run's gradients against the unmodified model's on the same batch): "
            f"the largest of the {len(checked)} that ran is {error:.1e} ({planner} at {budget}).")
    flagged = [c for c in table.cells.values() if c.trained_differently]
    if flagged:
        text += (f" {GRAD_FLAG} {len(flagged)} differ by more than {GRAD_TOLERANCE:.0%}: they did not train the "
                 "same network and are not ranked.")
    return text


def fill_common_columns(frame: pd.DataFrame, run_path: Path) -> pd.DataFrame:
    """Rows written before the common columns existed get them, from the run's own profiles.

    ``budget_lower_bound_s`` is ``harness.bounds.lower_bound`` of the profile the run stored
    at the row's budget, ``ratio_to_budget_lb``
    and ``slowdown`` follow from the row's makespan; rows that have them are left alone.
    """
    missing = frame["budget_lower_bound_s"].isna() & frame["budget_bytes"].notna()
    if not missing.any():
        return frame
    from harness.bounds import lower_bound

    profiles = RunProfiles(run_path)
    frame = frame.copy()
    for index in frame.index[missing]:
        row = frame.loc[index]
        profile = profiles.of(row)
        if profile is not None:  # executors take no options in suites: one copy engine, as the run had
            frame.loc[index, "budget_lower_bound_s"] = lower_bound(profile, int(row["budget_bytes"]))
    ok = frame["makespan_s"].notna()
    frame.loc[ok & frame["ratio_to_budget_lb"].isna(), "ratio_to_budget_lb"] = \
        frame["makespan_s"] / frame["budget_lower_bound_s"]
    frame.loc[ok & frame["slowdown"].isna(), "slowdown"] = frame["makespan_s"] / frame["ideal_s"]
    return frame


def _layout_notes(frame: pd.DataFrame) -> list[str]:
    """What a page cannot show about its rows, said rather than left as empty cells: no allocator model
    checked the simulated traces (no † either way), rows older than the gradient check or the saved-data
    columns."""
    notes = []
    simulated = [e for e in executors(frame) if kind_of(frame[frame["executor"] == e]) == "simulated"]
    if simulated and (frame["allocator"] == "").all():
        notes.append(f"The suite lists no allocator model, so no schedule's memory trace was placed: no "
                     f"{ARENA_FLAG} says whether a real allocator would fit it in the budget (see the pages of "
                     "suites with allocators).")
    torch_rows = frame[(frame["executor"] == "torch") & (frame["status"] == "ok")]
    if len(torch_rows) and torch_rows["grad_error"].isna().all():
        notes.append("These torch rows have no gradient check (grad err is empty): the suite turned it off, or they "
                     "were written before it existed.")
    if frame["makespan_s"].notna().any() and not does_what(frame):  # rows that finished, without the columns
        notes.append("These rows were written before the saved-data columns (kept_bytes, offloaded_bytes, "
                     "recomputed_bytes) existed, so the page has no 'fastest strategy per budget' table; the "
                     "time tables rank them the same way.")
    return notes


def statistic_of(meta: Mapping[str, Any]) -> str:
    """How a run's suite summarises its repeats (``statistic``; ``meta.json``'s spec)."""
    return meta.get("spec", {}).get("statistic", "trimmed-mean")


def device_budget_of(meta: Mapping[str, Any]) -> bool:
    """Whether a run's budgets are device bytes (``budget_model: device``; ``meta.json``'s spec)."""
    return meta.get("spec", {}).get("budget_model") == "device"


def publish_run(run: RunFolder, out: Path, meta: Mapping[str, Any], frame: pd.DataFrame, notes: str = "") -> list[Path]:
    """Write the pages and plots of one run (its ``meta.json`` and rows, as ``_checked_run`` read them, and
    its ``notes.md``) into ``out``; return the files written."""
    from harness.environment import git_state

    out.mkdir(parents=True, exist_ok=True)
    frame = fill_common_columns(frame, run.path)
    suite = _suite_name(run, meta, frame)
    statistic = statistic_of(meta)
    device_budget = device_budget_of(meta)
    written: list[Path] = []
    doc = Doc(f"membudget results: {suite}")
    doc.para(what_ran(frame, meta))
    about = meta.get("spec", {}).get("description", "")
    if about:
        doc.para(f"Suite {suite}: {about}.")
    if notes:
        doc.heading("Notes on this run", 3)
        doc.markdown(notes)
        doc.heading("The run", 3)
    if not meta:
        doc.para(f"{run.path.name} has no meta.json (a folder not written by membudget run): the suite and device "
                 "named here are its rows'; the run's sessions and environment are unknown.", small=True)
    sessions = sessions_line(meta, frame)
    for line in _meta_lines(meta, git_state(), frame, sessions is not None) if meta else []:
        doc.para(line, small=True)
    for line in (plugins_line(meta, frame), sessions, labels_line(frame)):
        if line:
            doc.para(line, small=True)
    counts = frame["status"].value_counts().to_dict()
    doc.para(f"{len(frame)} cases: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + ". "
             + HOW_TO_READ.format(fastest=FASTEST, spread=SPREAD.format(statistic=statistic) if has_spread(frame)
                                  else "") + " " + budget_words(frame))
    doc.para(CHAIN_BUDGETS if not device_budget else DEVICE_BUDGETS, small=True)
    for note in _layout_notes(frame):
        doc.para(note, small=True)
    for note in meta.get("skipped_plugins", []):
        doc.para(f"Note: {note}", small=True)
    if (meta.get("spec") or {}).get("validate") is False:
        doc.para(UNVALIDATED)
    tables: list[ExecutorTable] = []
    for group in model_groups(frame):
        doc.heading(group.title)
        plan = plan_rows(group.rows)
        first = plan.iloc[0]
        doc.para(f"ideal iteration {fmt_ms(first['ideal_s'])} ms; minimum memory "
                 f"{fmt_bytes(first['min_memory_bytes'])}; keep-all peak {fmt_bytes(first['peak_memory_bytes'])}.",
                 small=True)
        for executor in executors(group.rows):
            table = ExecutorTable.of(group, executor, statistic)
            tables.append(table)
            kind = kind_of(table.rows)
            doc.heading(f"{executor} executor ({kind}): iteration time, ms ({FASTEST} fastest per budget)", 3)
            doc.table(*time_table(table))
            split = any(c.ok and c.sub_batches > 1 for c in table.cells.values())
            for note in (arena_note(table, device_budget), grad_note(table),
                         SPLIT_NOTE.format(mark=SPLIT_MARK) if split else None):
                if note:
                    doc.para(note, small=True)
            if does_what(table.rows):
                doc.heading(f"{executor} executor ({kind}): the fastest strategy per budget, and what it does", 3)
                headers, lines, bad = strategy_table(table)
                doc.table(headers, lines, bad)
                doc.para(STRATEGY_TABLE + (FIT_COLUMN.format(flag=ARENA_FLAG) if headers[-1] == FIT_HEADER else ""),
                         small=True)
            doc.heading(f"{executor} executor ({kind}): iteration time / the budget's lower bound", 3)
            doc.table(*bound_table(table))
            if (table.rows["status"] == "ok").any():
                slug = _slug(executor)
                for name, plot in (("ratio", plot_ratio), ("throughput", plot_throughput), ("time", plot_time)):
                    file = f"{name}-{group.key}-{slug}.png"
                    written.append(plot(table, out / file))
                    doc.image(file, f"{name} for {group.title}, {executor} executor")
        chosen = pick_timeline(group.rows)
        if chosen is not None and (run.path / chosen["timeline"]).exists():
            timeline = json.loads((run.path / chosen["timeline"]).read_text())
            name = f"timeline-{group.key}.png"
            written.append(plot_timeline(timeline, out / name))
            doc.para(f"Timeline of {chosen['case_id']} ({chosen['executor']} executor; budget "
                     f"{fmt_bytes(chosen['budget_bytes'])}, makespan {fmt_ms(chosen['makespan_s'])} ms).")
            doc.image(name, f"timeline of {chosen['case_id']}")
        placement = placement_table(group.rows)
        if placement is not None:
            headers, lines, note = placement
            doc.heading(f"Placement: the arena each allocator needs for the same trace ({group.title})", 3)
            doc.table(headers, lines)
            doc.para(note, small=True)
    claims = claims_table(tables)
    if claims is not None:
        from harness.claims import PAPER

        doc.heading("Recomputation and offloading: the paper's claims on these profiles")
        doc.para(CLAIMS.format(paper=PAPER))
        doc.table(*claims)
    doc.heading("Every case")
    cols = ["case_id", "status", "time ms", "x ideal", "budget LB ms", "x budget LB", "own LB ms", "x own LB",
            "peak", "moved", "arena", "grad err", "plan ms", "message"]
    rows, bad = [], set()
    for i, (_, r) in enumerate(ordered(frame).iterrows()):
        rows.append([r["case_id"], r["status"], fmt_ms(r["makespan_s"]), fmt_ratio(r["slowdown"]),
                     fmt_ms(r["budget_lower_bound_s"]), fmt_ratio(r["ratio_to_budget_lb"]),
                     fmt_ms(r["lower_bound_s"]), fmt_ratio(r["ratio_to_lb"]), fmt_bytes(r["peak_bytes"]),
                     fmt_bytes(r["moved_bytes"]), fmt_bytes(r["arena_bytes"]), fmt_error(r["grad_error"]),
                     fmt_ms(r["plan_time_s"]),
                     r["message"]])
        if r["status"] != "ok":
            bad.add((i, 1))
    doc.table(cols, rows, bad)
    table_file = f"{_slug(suite)}.csv"  # not rows.csv: a published folder is not a run folder
    write_frame_csv(frame, out / table_file)  # with the common columns filled in
    doc.link_para("Every column of every case: ", table_file, table_file,
                  " (the columns are documented in membudget's docs/results.md).", small=True)
    written.append(out / table_file)
    written += doc.write(out)
    return written


def publish(results: Iterable[str | Path], out_dir: str | Path) -> list[Path]:
    """Publish the runs found in ``results`` into ``out_dir``; return every file written."""
    out = Path(out_dir)
    runs = list({run.path.resolve(): run for run in find_runs(results)}.values())  # a run given twice: once
    # a folder that is not one run's rows is an error before anything is written
    loaded = [(run, *_checked_run(run)) for run in runs]
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    links = []
    used: set[str] = set()
    for run, meta, rows in loaded:
        name = _suite_name(run, meta, rows)
        folder = name if name not in used else f"{name}-{run.run_id}"
        used.add(folder)
        notes = read_notes(run.path)
        written += publish_run(run, out / folder, meta, rows, notes)
        kind = kind_of(rows)
        about = meta.get("spec", {}).get("description", "")
        noted = "; read the notes on its page" if notes else ""
        links.append((f"{name} ({kind}, run {run.run_id}{noted}){': ' + about if about else ''}",
                      f"{folder}/index.html"))
    index = Doc("membudget results")
    index.para("Published by membudget publish; one page per suite. A measured page's times were taken on the "
               "device its first line names; a simulated page's are the event simulator's, on measured or analytic "
               "profiles.")
    index.link_list(links)
    written += index.write(out)
    md_index = out / "index.md"
    md_index.write_text(md_index.read_text().replace("/index.html)", "/index.md)"))
    return written


def _suite_name(run: RunFolder, meta: Mapping[str, Any], frame: pd.DataFrame) -> str:
    """The suite a run's page is named after: meta.json's, else its rows' (one suite), else the folder's."""
    return meta.get("suite") or (str(frame["suite"].iloc[0]) if len(frame) else "") or run.suite


def _checked_run(run: RunFolder) -> tuple[dict[str, Any], pd.DataFrame]:
    """A run's ``meta.json`` and rows, read once; refuse, naming the folder, what would make a page or a
    comparison mislead: not a results table, no rows, rows of several suites (or of another suite than
    ``meta.json``'s), a case with two rows (a page would count it twice)."""
    check_results_table(run.path)
    meta = read_meta(run.path)
    rows = load_rows(run.path)
    suites = sorted(set(rows["suite"]))
    if not suites:
        raise ResultsError(f"{run.path}: rows.csv has no rows yet: nothing to publish or compare")
    if len(suites) > 1 or suites[0] != meta.get("suite", suites[0]):
        whose = f", and meta.json is suite {meta['suite']}'s" if "suite" in meta else ""
        raise ResultsError(f"{run.path}: rows.csv holds rows of the suites {', '.join(suites)}{whose}: a run "
                           "folder holds one suite's rows")
    twice = rows["case_id"][rows["case_id"].duplicated()]
    if not twice.empty:
        raise ResultsError(f"{run.path / ROWS_CSV}: the case {twice.iloc[0]!r} has more than one row; "
                           "a run has one row per case")
    return meta, rows


UNVALIDATED = ("Note: this run did not validate its schedules (the suite says validate: false): their structure was "
               "checked, not their run against the chain model's rules (what each operation holds, when each copy "
               "is back), so a row may read ok, even fastest, or infeasible where the validator would have found the "
               "planner's error. Its rows' valid column is empty.")


# --------------------------------------------------------------------------- compare

COMPARED = ("makespan_s", "ratio_to_lb", "peak_bytes", "moved_bytes", "arena_bytes")


def _close(a: Any, b: Any, rtol: float) -> bool:
    fa, fb = _num(a), _num(b)
    if fa is None or fb is None:
        return fa is None and fb is None
    return math.isclose(fa, fb, rel_tol=rtol, abs_tol=1e-12)


GATED = ("makespan_s", "peak_bytes", "moved_bytes")  # what --tolerance judges


def _beyond(a: Any, b: Any, tolerance: float) -> bool:
    """True when ``b`` differs from ``a`` by more than ``tolerance`` (relative), or only one is known."""
    fa, fb = _num(a), _num(b)
    if fa is None or fb is None:
        return (fa is None) != (fb is None)
    return abs(fb - fa) > tolerance * abs(fa) + 1e-12


def _one_run(path: str | Path) -> RunFolder:
    """The one run a compare argument names; a results root of several suites is refused."""
    runs = find_runs([path])
    if len(runs) > 1:
        raise ResultsError(f"{path}: holds the runs of {len(runs)} suites ({', '.join(r.suite for r in runs)}); "
                           "compare a suite folder or a run folder")
    return runs[0]


def _rows_by_case(run: RunFolder) -> pd.DataFrame:
    return _checked_run(run)[1].set_index("case_id")


def compare(a: str | Path, b: str | Path, rtol: float = 1e-6, tolerance: float | None = None) -> dict[str, Any]:
    """Per-case differences of two runs (matched by case id): status, times, memory.

    A case is ``changed`` when its status or any of ``COMPARED`` differs by more than
    ``rtol``. It is ``beyond_tolerance`` when its status changed, or its makespan, peak or
    moved bytes changed by more than ``tolerance`` (relative, either way; default
    ``rtol``); a case in one run only is beyond any tolerance. ``beyond_tolerance`` lists
    those case ids (``membudget compare`` exits 1 when it is not empty).
    """
    tolerance = rtol if tolerance is None else tolerance
    run_a, run_b = _one_run(a), _one_run(b)
    fa, fb = _rows_by_case(run_a), _rows_by_case(run_b)
    common = [c for c in fa.index if c in fb.index]
    cases, same, status_changed, beyond = [], 0, 0, []
    for case_id in common:
        ra, rb = fa.loc[case_id], fb.loc[case_id]
        entry: dict[str, Any] = {"case_id": case_id, "status_a": ra["status"], "status_b": rb["status"]}
        changed = ra["status"] != rb["status"]
        status_changed += changed
        for col in (*COMPARED, "plan_time_s"):
            entry[f"{col}_a"], entry[f"{col}_b"] = _num(ra[col]), _num(rb[col])
            if col in COMPARED and not _close(ra[col], rb[col], rtol):
                changed = True
        ma, mb = _num(ra["makespan_s"]), _num(rb["makespan_s"])
        entry["makespan_change"] = (mb / ma - 1) if ma and mb is not None else None
        entry["changed"] = bool(changed)
        entry["beyond_tolerance"] = bool(ra["status"] != rb["status"]
                                         or any(_beyond(ra[col], rb[col], tolerance) for col in GATED))
        same += not changed
        beyond += [case_id] if entry["beyond_tolerance"] else []
        cases.append(entry)
    only_in_a = [c for c in fa.index if c not in fb.index]
    only_in_b = [c for c in fb.index if c not in fa.index]
    return {
        "a": str(run_a.path), "b": str(run_b.path),
        "summary": {"common": len(common), "same": same, "changed": len(common) - same,
                    "status_changed": int(status_changed)},
        "cases": cases,
        "only_in_a": only_in_a,
        "only_in_b": only_in_b,
        "tolerance": tolerance,
        "beyond_tolerance": beyond + only_in_a + only_in_b,
    }


def compare_table(result: dict[str, Any], show_all: bool = False):
    """A rich table of a comparison (changed cases only unless ``show_all``)."""
    from rich.table import Table

    table = Table("case", "status A", "status B", "makespan A ms", "makespan B ms", "change", "peak A", "peak B",
                  "moved A", "moved B", box=None, show_edge=False)
    for c in result["cases"]:
        if not (show_all or c["changed"]):
            continue
        change = "-" if c["makespan_change"] is None else f"{c['makespan_change'] * 100:+.2f}%"
        table.add_row(c["case_id"], c["status_a"], c["status_b"], fmt_ms(c["makespan_s_a"]), fmt_ms(c["makespan_s_b"]),
                      change, fmt_bytes(c["peak_bytes_a"]), fmt_bytes(c["peak_bytes_b"]),
                      fmt_bytes(c["moved_bytes_a"]), fmt_bytes(c["moved_bytes_b"]))
    for case_id in result["only_in_a"]:
        table.add_row(case_id, "(only in A)", "", "", "", "", "", "", "", "")
    for case_id in result["only_in_b"]:
        table.add_row(case_id, "", "(only in B)", "", "", "", "", "", "", "")
    return table
