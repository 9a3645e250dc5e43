"""``publish(results, out)``: a page per run (Markdown and XHTML, with its plots and CSV) and an index."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from harness.publish.cells import ExecutorTable, executors, kind_of, model_groups, ordered, plan_rows
from harness.publish.document import Doc
from harness.publish.figures import pick_timeline, plot_ratio, plot_throughput, plot_time, plot_timeline
from harness.publish.formats import below_the_weights, fmt_bytes, fmt_error, fmt_ms, fmt_ratio, slug
from harness.publish.runs import checked_run, device_budget_of, statistic_of, suite_name
from harness.publish.sentences import (CHAIN_BUDGETS, CLAIMS, DEVICE_BUDGETS, FIT_COLUMN, HOW_TO_READ, SPLIT_NOTE,
                                       SPREAD, STRATEGY_TABLE, UNVALIDATED, above_device_note, arena_note,
                                       arena_summary, budget_words, close_call_note, grad_note, has_spread,
                                       labels_line, layout_notes, meta_lines, more_memory_note, oom_note,
                                       plugins_line, same_schedule_note, sessions_line, what_ran)
from harness.publish.tables import (ARENA_FLAG, FASTEST, FIT_HEADER, SPLIT_MARK, bound_table, claims_table,
                                    does_what, placement_table, strategy_table, time_table)
from harness.results import ResultsError, RunFolder, RunProfiles, find_runs, read_notes, write_frame_csv


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


def leaner_minimum(profile, row: Mapping[str, Any]) -> str:
    """Where the profile's algorithm alternatives go below the row's ``min_memory_bytes`` (the default
    algorithms') by enough to show on a page, what they reach; else ''."""
    if profile is None or pd.isna(row["min_memory_bytes"]):
        return ""
    from harness.bounds import min_memory

    leanest = min_memory(profile, memory_optimal=True)
    if fmt_bytes(leanest) == fmt_bytes(int(row["min_memory_bytes"])):
        return ""
    return f" at the default algorithms ({fmt_bytes(leanest)} with the leanest)"


def publish_run(run: RunFolder, out: Path, meta: Mapping[str, Any], frame: pd.DataFrame, notes: str = "") -> list[Path]:
    """Write the pages and plots of one run (its ``meta.json`` and rows, as ``checked_run`` read them, and
    its ``notes.md``) into ``out``; return the files written."""
    from harness.environment import git_state

    out.mkdir(parents=True, exist_ok=True)
    frame = fill_common_columns(frame, run.path)
    suite = suite_name(run, meta, frame)
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
    for line in meta_lines(meta, git_state(), frame, sessions is not None) if meta else []:
        doc.para(line, small=True)
    for line in (plugins_line(meta, frame), sessions, labels_line(frame)):
        if line:
            doc.para(line, small=True)
    counts = frame["status"].value_counts().to_dict()
    doc.para(f"{len(frame)} cases: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + ". "
             + HOW_TO_READ.format(fastest=FASTEST, spread=SPREAD.format(statistic=statistic) if has_spread(frame)
                                  else "") + " " + budget_words(frame))
    profiles = RunProfiles(run.path)
    groups = model_groups(frame, profiles)
    tables = [ExecutorTable.of(group, executor, statistic) for group in groups for executor in executors(group.rows)]
    summary = arena_summary(tables)
    if summary:
        doc.para(summary)
    doc.para(CHAIN_BUDGETS if not device_budget else DEVICE_BUDGETS, small=True)
    for note in layout_notes(frame):
        doc.para(note, small=True)
    for note in meta.get("skipped_plugins", []):
        doc.para(f"Note: {note}", small=True)
    if (meta.get("spec") or {}).get("validate") is False:
        doc.para(UNVALIDATED)
    by_group = {(t.group.key, t.executor): t for t in tables}
    for group in groups:
        doc.heading(group.title)
        plan = plan_rows(group.rows)
        first = plan.iloc[0]
        doc.para(f"ideal iteration {fmt_ms(first['ideal_s'])} ms; minimum memory "
                 f"{fmt_bytes(first['min_memory_bytes'])}{leaner_minimum(profiles.of(first), first)}; keep-all peak "
                 f"{fmt_bytes(first['peak_memory_bytes'])}.", small=True)
        above = above_device_note(plan, profiles.of(first))
        if above:
            doc.para(above)
        for executor in executors(group.rows):
            table = by_group[group.key, executor]
            kind = kind_of(table.rows)
            doc.heading(f"{executor} executor ({kind}): iteration time, ms ({FASTEST} fastest per budget)", 3)
            doc.table(*time_table(table))
            split = any(c.ok and c.sub_batches > 1 for c in table.cells.values())
            for note in (arena_note(table, device_budget), grad_note(table),
                         SPLIT_NOTE.format(mark=SPLIT_MARK) if split else None, more_memory_note(table),
                         oom_note(table), close_call_note(table), same_schedule_note(table)):
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
                executor_key = slug(executor)
                for name, plot in (("ratio", plot_ratio), ("throughput", plot_throughput), ("time", plot_time)):
                    file = f"{name}-{group.key}-{executor_key}.png"
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
        below = below_the_weights(r["budget_bytes"], r["weight_bytes"])  # no schedule runs: no bound to show
        rows.append([r["case_id"], r["status"], fmt_ms(r["makespan_s"]), fmt_ratio(r["slowdown"]),
                     "-" if below else fmt_ms(r["budget_lower_bound_s"]),
                     fmt_ratio(r["ratio_to_budget_lb"]),
                     fmt_ms(r["lower_bound_s"]), fmt_ratio(r["ratio_to_lb"]), fmt_bytes(r["peak_bytes"]),
                     fmt_bytes(r["moved_bytes"]), fmt_bytes(r["arena_bytes"]), fmt_error(r["grad_error"]),
                     fmt_ms(r["plan_time_s"]),
                     r["message"]])
        if r["status"] != "ok":
            bad.add((i, 1))
    doc.table(cols, rows, bad)
    table_file = f"{slug(suite)}.csv"  # not rows.csv: a published folder is not a run folder
    write_frame_csv(frame, out / table_file)  # with the common columns filled in
    doc.link_para("Every column of every case: ", table_file, table_file,
                  " (the columns are documented in membudget's docs/results.md).", small=True)
    written.append(out / table_file)
    written += doc.write(out)
    return written


SITE_INDEX = "suites.json"  # the index's links, so that a later publish into the same folder keeps them
SITE_INDEX_FORMAT = 1


def site_suites(out_dir: str | Path) -> dict[str, str]:
    """The suites an earlier ``publish`` listed in ``out_dir``'s index: page folder -> link text.

    A folder whose page is gone is left out. An index file that is not one of ours is an error
    (before anything is written), so that nothing it listed is dropped silently.
    """
    path = Path(out_dir) / SITE_INDEX
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        if data["format"] != SITE_INDEX_FORMAT:
            raise ValueError(f"format {data['format']!r}")
        entries = {str(e["folder"]): str(e["text"]) for e in data["suites"]}
    except (ValueError, TypeError, KeyError) as exc:
        raise ResultsError(f"{path}: not a membudget site index (format {SITE_INDEX_FORMAT}); "
                           f"remove it or publish into another folder") from exc
    return {folder: text for folder, text in entries.items() if (Path(out_dir) / folder / "index.html").is_file()}


def publish(results: Iterable[str | Path], out_dir: str | Path) -> list[Path]:
    """Publish the runs found in ``results`` into ``out_dir``; return every file written.

    The index lists these runs and every suite an earlier ``publish`` put into ``out_dir``
    (a suite published again takes its old place in the list).
    """
    out = Path(out_dir)
    runs = list({run.path.resolve(): run for run in find_runs(results)}.values())  # a run given twice: once
    # a folder that is not one run's rows is an error before anything is written
    loaded = [(run, *checked_run(run)) for run in runs]
    links = site_suites(out)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    used: set[str] = set()
    for run, meta, rows in loaded:
        name = suite_name(run, meta, rows)
        folder = name if name not in used else f"{name}-{run.run_id}"
        used.add(folder)
        notes = read_notes(run.path)
        written += publish_run(run, out / folder, meta, rows, notes)
        kind = kind_of(rows)
        about = meta.get("spec", {}).get("description", "")
        noted = "; read the notes on its page" if notes else ""
        links[folder] = f"{name} ({kind}, run {run.run_id}{noted}){': ' + about if about else ''}"
    index = Doc("membudget results")
    index.para("Published by membudget publish; one page per suite. A measured page's times were taken on the "
               "device its first line names; a simulated page's are the event simulator's, on measured or analytic "
               "profiles.")
    index.link_list([(text, f"{folder}/index.html") for folder, text in links.items()])
    written += index.write(out)
    md_index = out / "index.md"
    md_index.write_text(md_index.read_text().replace("/index.html)", "/index.md)"))
    site_index = out / SITE_INDEX
    site_index.write_text(json.dumps({"format": SITE_INDEX_FORMAT,
                                      "suites": [{"folder": f, "text": t} for f, t in links.items()]}, indent=1) + "\n")
    return [*written, site_index]
