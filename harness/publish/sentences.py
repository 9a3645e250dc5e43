"""What a published page says in sentences: what ran, on which code and plugins, how to read its
tables, what its budgets count, and the notes under each table."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping

import pandas as pd

from harness.publish.cells import (GRAD_TOLERANCE, MORE_MEMORY_SLACK, NOTHING_FINISHED, ExecutorTable, budget_order,
                                   executors, kind_of, over_budget_rows)
from harness.publish.formats import fmt_bytes
from harness.publish.tables import ARENA_FLAG, FASTEST, GRAD_FLAG, MORE_MEMORY_MARK, does_what


def _commit(git: dict[str, Any]) -> str:
    commit = (git.get("commit") or "unknown")[:12]
    if git.get("dirty"):
        return f"{commit} plus uncommitted changes"
    return commit


def profilers_of(frame: pd.DataFrame, meta: Mapping[str, Any]) -> str:
    """The profilers of a run's rows, in words: every one when there are several, else the suite's."""
    profilers = [p for p in dict.fromkeys(frame["profiler"]) if p]
    return " and ".join(profilers) if len(profilers) > 1 else meta.get("profiler") or "".join(profilers) or "?"


def meta_lines(meta: dict[str, Any], built: dict[str, Any], frame: pd.DataFrame, mixed: bool) -> list[str]:
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
    device = meta.get("device_name") or meta.get("device") or " and ".join(devices) or "?"
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
    "How to read the tables: each budget column compares the strategies (listed in the suite's order) by "
    "iteration time (ms), the quantity common to the column; {fastest} marks the fastest at that budget. (N.NNx) is the time over the ideal "
    "iteration (ideal_s: the profile's forward and backward compute time with no memory limit and nothing "
    "waited for, the same for the whole table; not a measured run){spread}. The table headed 'iteration time / the budget's "
    "lower bound' divides the time by the budget's lower bound (papers/004 Prop. 3 at that budget over every choice of algorithms; the same "
    "bound for every strategy in the column, its value in the header); schedules that recompute or split "
    "the batch are not bound by it and can go below 1. The bound each schedule is judged against on its own "
    "(its algorithms, passes, recomputation) is the 'own LB' column of the list of every case: it says how "
    "close a schedule came to what it chose to do, and differs between rows, so never pick a strategy by it."
)
SPREAD = (
    "; ±S is half the interquartile range of a measured run's timed iterations (half the range of the kept "
    "repeats when the suite repeats, summarised by its statistic: {statistic})"
)
SPLIT_NOTE = (
    "{mark}N: the schedule splits the batch into N sub-batches, running every forward and backward pass N "
    "times on a part of it (vDNN+ and moDNN do); it can run below the minimum memory of the whole batch. A model "
    "with batch normalisation then normalises over the smaller parts, which is not quite the same training; "
    "the gradient check compares the same sub-batches and does not show it. A simulated {mark}N time is a best "
    "case: the sub-batch's times come from the profile at that batch, measured where the profile holds it, "
    "else scaled linearly from the whole batch (Profile.at_batch; always so for an analytic profile), while a "
    "real GPU runs a small batch less efficiently."
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


CHAIN_BUDGETS = (
    "Budgets on this page are bytes of the chain model (weights, saved data, gradients and workspaces as the "
    "profile counts them), not what a CUDA process reserves: its context, the libraries' workspaces and the "
    "allocator's fragmentation come on top (budget_model: device plans within a device's bytes instead; "
    "docs/cli.md, \"What a budget means\").")
DEVICE_BUDGETS = (
    "Budgets on this page are what the training process may reserve on the device (budget_model: device): "
    "each planner planned within what is left of it once the runtime's bytes and the allocator's "
    "fragmentation are set aside.")
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
    "together cut activation memory 4-6x at under 20% overhead. Share: over the budgets where both ran "
    "(and recomputation costs anything: its schedule recomputes, and takes longer than T_ideal), the sum of T_recompute - T_hybrid over the sum of T_recompute - T_ideal "
    "(the overhead removed over the overhead, in total), T_recompute from the recompute planner, else torch-checkpoint; held within 1/3 +- 0.1. Reduction: activation memory (the "
    "budget less the resident weights) of the keep-all peak over that of the smallest budget of the suite at "
    "which the combined strategy (hybrid; without it, the fastest strategy that ran, named) runs within 1.2x "
    "the ideal time; held at 4x or more, not checked where no strategy ran at a budget small enough to show "
    "4x. A grid's budget: the reduction is at least this (harness/claims.py)."
)
UNVALIDATED = ("Note: this run did not validate its schedules (the suite says validate: false): their structure was "
               "checked, not their run against the chain model's rules (what each operation holds, when each copy "
               "is back), so a row may read ok, even fastest, or infeasible where the validator would have found the "
               "planner's error. Its rows' valid column is empty.")


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


def arena_summary(tables: list[ExecutorTable]) -> str | None:
    """The page's one line on the allocator check, so that a reader sees before any table whether its
    winners are the chain model's answer only: how many of the schedules that ran need a larger arena
    than their budget, and at how many budgets none fits; that nothing was checked where a simulated
    table placed no trace (the suite lists no allocator model); None otherwise (measured tables only)."""
    listed = [t for t in tables if (t.rows["allocator"] != "").any()]
    # a measuring executor records no memory trace: its rows name the allocator but hold no placement
    checked = [t for t in listed if kind_of(t.rows) != "measured"]
    unplaced = (" The measured runs are not in it: an executor that runs the model records no memory trace to "
                "place." if len(checked) < len(listed) else "")
    if not checked:
        if not listed and any(kind_of(t.rows) == "simulated" for t in tables):
            return (f"Allocator check: none. The suite lists no allocator model, so no schedule's memory trace "
                    f"was placed: no {ARENA_FLAG} says whether a real allocator would fit it in the budget (see "
                    "the pages of suites with allocators).")
        return None
    names = ", ".join(dict.fromkeys(a for t in checked for a in t.rows["allocator"] if a))
    ran = [c for t in checked for c in t.cells.values() if c.ranked]
    over = [c for c in ran if c.over_allocators]
    columns = [[c for (_, b), c in t.cells.items() if b == budget and c.ranked]
               for t in checked for budget in budget_order(t.rows)]
    columns = [c for c in columns if c]
    none_fit = sum(all(c.over_allocators for c in column) for column in columns)
    if not over:
        return (f"Allocator check ({names}): every schedule that ran places its memory trace within its budget."
                + unplaced)
    return (f"Allocator check ({names}): {len(over)} of the {len(ran)} schedules that ran need a larger arena "
            f"than their budget ({ARENA_FLAG}), and at {none_fit} of {len(columns)} budgets none fits. Where a "
            f"winner is marked {ARENA_FLAG}, its time is the chain model's answer: a real allocator would likely "
            "need more memory than the budget (the last column of each 'fastest strategy' table names the "
            "fastest that fits)." + unplaced)


def more_memory_note(table: ExecutorTable) -> str | None:
    """The note on a time table's ``MORE_MEMORY_MARK`` cells (None when there are none): how many, and
    the largest such step with where it was."""
    slower = table.slower_with_more_memory
    if not slower:
        return None
    steps = [(table.cells[(p, b)].time_s / table.cells[(p, smaller)].time_s, p, b, smaller)
             for (p, b), smaller in slower.items()]
    ratio, planner, budget, smaller = max(steps)
    measured = ("beyond the spreads, and, where the simulator timed both plans, in its times too; "
                if kind_of(table.rows) == "measured" else "")
    return (f"{MORE_MEMORY_MARK}: slower by more than {MORE_MEMORY_SLACK:.0%} than the same strategy at a smaller "
            f"budget of this table ({measured}{len(steps)} cell{'s' if len(steps) > 1 else ''}; the largest step, "
            f"{planner} at {budget}, is {ratio:.2f}x "
            f"its time at {smaller}). The plan made for the smaller budget fits the larger one too: the planner "
            "did not find it, so its time at the smaller budget is a bound on what it should take here.")


def oom_note(table: ExecutorTable) -> str | None:
    """The note on a time table whose budgets had strategies run out of memory (None when none did): at
    each such budget, which, and that its star is then the fastest of those that trained, not of all. An
    ``oom`` row is a strategy the harness planned within the budget that the executor could not run in it;
    how fast it would have been is unknown, so the table names no winner over it."""
    budgets = budget_order(table.rows)
    out_of_memory: dict[tuple[str, ...], list[str]] = {}
    for budget in budgets:
        names = tuple(p for (p, b), c in table.cells.items() if b == budget and c.status == "oom")
        if names:
            out_of_memory.setdefault(names, []).append(budget)
    if not out_of_memory:
        return None
    parts = [f"at {' and '.join(at)}, {len(names)} ({', '.join(names)})" for names, at in out_of_memory.items()]
    return ("Ran out of memory (oom) although planned within the budget: " + "; ".join(parts) + ". How fast "
            f"those would have run is unknown, so the {FASTEST} of such a budget is the fastest of the strategies that "
            "trained, not a winner over these.")


def close_call_note(table: ExecutorTable) -> str | None:
    """The note on a time table's budgets where the fastest and the runner-up are apart by less than their
    spreads (``ExecutorTable.close_calls``; None when there are none): the timings do not tell them apart."""
    calls = table.close_calls
    if not calls:
        return None
    parts = []
    for budget, (winner, runner_up) in calls.items():
        first, second = table.cells[winner, budget], table.cells[runner_up, budget]
        parts.append(f"at {budget}, {winner} {first.time_s * 1e3:.2f} ±{first.spread_s * 1e3:.2f} ms against "
                     f"{runner_up} {second.time_s * 1e3:.2f} ±{second.spread_s * 1e3:.2f} ms")
    return (f"Within the spreads: {'; '.join(parts)}. The runner-up's time less its spread is not above the "
            f"{FASTEST}'s plus its own, so these timings do not tell the two apart (more repeats, the suite's "
            "repeats:, on a quieter machine, may).")


def same_schedule_note(table: ExecutorTable) -> str | None:
    """The note on a time table's budgets where strategies ran one and the same schedule and were timed
    apart (``ExecutorTable.same_schedules``; None when there are none): the difference is noise."""
    parts = []
    for budget, groups in table.same_schedules.items():
        for planners in groups:
            times = [table.cells[p, budget].time_s * 1e3 for p in planners]
            names = ", ".join(planners[:-1]) + f" and {planners[-1]}"
            parts.append(f"at {budget}, {names} ({min(times):.2f} to {max(times):.2f} ms)")
    if not parts:
        return None
    return (f"One schedule, timed apart: {'; '.join(parts)} ran the same schedule (one fingerprint: the same "
            f"operations, copies, algorithms, sub-batches, copy layout and chain budget), so their times differ by measurement noise alone "
            f"and no {FASTEST} or lead among them is a result (more repeats, the suite's repeats:, on a quieter "
            "machine, bring them together).")


def grad_note(table: ExecutorTable) -> str | None:
    """What the gradient check says about a time table's strategies (None when its rows have none):
    the largest error, and the ``GRAD_FLAG`` cells that trained a different network."""
    checked = [(c.grad_error, p, b) for (p, b), c in table.cells.items() if c.ok and not math.isnan(c.grad_error)]
    if not checked:
        return None
    error, planner, budget = max(checked)
    # where every run's error is the same (0: bit-identical gradients), naming one run reads as singling it out
    where = "every one" if all(e == error for e, _, _ in checked) else f"{planner} at {budget}"
    text = (f"Gradient check (grad_error: each run's gradients against the unmodified model's on the same batch): "
            f"the largest of the {len(checked)} that ran is {error:.1e} ({where}).")
    flagged = [c for c in table.cells.values() if c.trained_differently]
    if flagged:
        text += (f" {GRAD_FLAG} {len(flagged)} differ by more than {GRAD_TOLERANCE:.0%}: they did not train the "
                 "same network and are not ranked.")
    return text


def layout_notes(frame: pd.DataFrame) -> list[str]:
    """What a page cannot show about its rows, said rather than left as empty cells: rows older than the
    gradient check or the saved-data columns (no allocator model: ``arena_summary``)."""
    notes = []
    torch_rows = frame[(frame["executor"] == "torch") & (frame["status"] == "ok")]
    if len(torch_rows) and torch_rows["grad_error"].isna().all():
        notes.append("These torch rows have no gradient check (grad err is empty): the suite turned it off, or they "
                     "were written before it existed.")
    if frame["makespan_s"].notna().any() and not does_what(frame):  # rows that finished, without the columns
        notes.append("These rows were written before the saved-data columns (kept_bytes, offloaded_bytes, "
                     "recomputed_bytes) existed, so the page has no 'fastest strategy per budget' table; the "
                     "time tables rank them the same way.")
    return notes


def above_device_note(rows: pd.DataFrame, profile: Any) -> str | None:
    """The budgets of one model's rows above the memory of its profile's device (``membudget plan`` warns
    of one): no card of that device can train at them, whatever the page ranks there."""
    memory = getattr(profile, "device_memory", 0) or 0
    if memory <= 0:
        return None
    above = rows[pd.to_numeric(rows["budget_bytes"], errors="coerce") > memory]
    if above.empty:
        return None
    budgets = ", ".join(f"{label} ({fmt_bytes(size)})" for label, size in
                        above.groupby("budget_label", sort=False)["budget_bytes"].first().items())
    return (f"Budgets above the memory of the profile's device, {profile.device} ({fmt_bytes(memory)}): {budgets}; "
            "no such card can train at them.")
