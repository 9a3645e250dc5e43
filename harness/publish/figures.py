"""The plots of a published page (PNG, matplotlib's Agg backend), per model and executor: iteration
time over the budget's lower bound against the memory limit (papers/004 Figure 5), throughput against
memory (papers/004 Figures 13-19), iteration time per budget (papers/000 Figure 8), and a timeline of
compute and copies for one case."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from harness.publish.cells import Cell, ExecutorTable, budget_order, plan_rows, planner_order


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
    for planner, style in _styles(planner_order(table.rows)).items():
        points = sorted((float(budgets[b]) / 2**30, value(c)) for (p, b), c in table.cells.items()
                        if p == planner and c.ok)
        if points:
            ax.plot(*zip(*points), label=planner, **style)


def _plot_against_memory(table: ExecutorTable, path: Path, value: Callable[[Cell], float], ylabel: str,
                         title: str, reference: float, reference_label: str | None = None) -> Path:
    """One line per strategy of ``value`` against the memory limit, a dashed grey line at ``reference``."""
    fig, ax = _figure()
    _plot_per_planner(ax, table, value)
    if not math.isnan(reference):
        ax.axhline(reference, color="grey", lw=0.8, ls="--", label=reference_label)
    ax.set_xlabel("memory limit (GiB)")
    ax.set_ylabel(ylabel)
    ax.set_title(_wrap(f"{table.title}: {title}"), fontsize=10)
    _legend(ax)
    return _save(fig, path)


def plot_ratio(table: ExecutorTable, path: Path) -> Path:
    """Iteration time over the budget's lower bound against the memory limit (papers/004 Figure 5)."""
    return _plot_against_memory(table, path, lambda c: c.ratio_to_budget_lb, "iteration time / LB of the budget",
                                "time / LB (cf. papers/004 Fig. 5)", 1.0)


def plot_throughput(table: ExecutorTable, path: Path) -> Path:
    """Samples per second against the memory limit (papers/004 Figures 13-19), with the ideal."""
    batch = table.group.batch_size
    ideal = table.rows["ideal_s"].dropna()
    return _plot_against_memory(table, path, lambda c: batch / c.time_s, "throughput (samples/s)",
                                "throughput (cf. papers/004 Figs. 13-19)",
                                batch / ideal.iloc[0] if len(ideal) else float("nan"), "ideal (no offloading)")


def plot_time(table: ExecutorTable, path: Path) -> Path:
    """Iteration time per budget, bars per strategy; failed cases marked x (papers/000 Figure 8)."""
    return _save(time_figure(table), path)


def time_figure(table: ExecutorTable):
    """The figure of ``plot_time``: one bar colour per strategy."""
    fig, ax = _figure()
    rows, cells = table.rows, table.cells
    budgets, planners = budget_order(rows), planner_order(rows)
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
