"""The committed pages under results/site answer the harness's question truthfully (issue #14).

These read what ``tox -e publish`` wrote and the repository commits, so a page that marks
the wrong winner, hides its executor or was built from uncommitted code fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SITE = Path(__file__).resolve().parent.parent / "results" / "site"
PAGES = sorted(SITE.glob("*/index.md"))
TIME = re.compile(r"^(★ )?([0-9]+\.[0-9]+)")


def _time_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(heading, header, rows) of each 'iteration time, ms' table of a Markdown page."""
    lines = text.splitlines()
    out = []
    for k, line in enumerate(lines):
        if line.startswith("### ") and "iteration time, ms" in line:
            end = next((n for n, row in enumerate(lines[k + 2:]) if not row.startswith("|")), len(lines))
            table = lines[k + 2: k + 2 + end]
            cells = [[c.strip() for c in row.strip("|").split(" | ")] for row in table]
            out.append((line, cells[0], cells[2:]))
    return out


def test_every_suite_is_published():
    assert {p.parent.name for p in PAGES} >= {"quick", "beaumont-fig5", "vdnnpp-gtx970", "modnn-k40", "gpu-smoke"}


@pytest.mark.parametrize("page", PAGES, ids=[p.parent.name for p in PAGES])
def test_the_row_marked_fastest_has_the_smallest_time_of_its_column(page):
    tables = _time_tables(page.read_text())
    assert tables, f"{page}: no iteration-time table"
    for heading, header, rows in tables:
        for j in range(1, len(header)):
            times = {}
            for row in rows:
                match = TIME.match(row[j])
                if match:
                    times[row[0]] = (float(match.group(2)), bool(match.group(1)))
            if not times:
                continue
            best = min(t for t, _ in times.values())
            marked = {p for p, (_, star) in times.items() if star}
            assert marked, f"{page.parent.name}: {heading}: {header[j]}: nothing marked fastest"
            for planner in marked:
                assert times[planner][0] == best, f"{page.parent.name}: {heading}: {header[j]}: {planner}"


@pytest.mark.parametrize("page", PAGES, ids=[p.parent.name for p in PAGES])
def test_each_page_says_what_ran_and_names_a_committed_build(page):
    lines = page.read_text().splitlines()
    assert lines[2].startswith(("Simulations: ", "Measured: "))
    built = re.search(r"this page built from commit ([0-9a-f]{12})( plus uncommitted changes)?\.", page.read_text())
    assert built and not built.group(2), f"{page}: built from uncommitted code"
    for heading in (line for line in lines if "iteration time" in line and line.startswith("###")):
        assert " executor (" in heading
