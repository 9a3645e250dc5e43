"""``membudget publish`` and ``membudget compare``: the tables and plots people read.

``publish(results, out)`` writes, for each run (the latest of each suite given):

- ``<out>/<suite>/index.md`` and ``index.html`` (well-formed XHTML): per model, the
  iteration-time table (strategy x budget), the fastest strategy per budget and what it does,
  the time over the budget's lower bound, the plots, the placement table when the suite has
  allocators, the paper's claims, and every case with its status and message;
- the plots (PNG), per model and executor: time over the budget's lower bound against the
  memory limit (papers/004 Figure 5), throughput against memory (papers/004 Figures 13-19),
  iteration time against the budget (papers/000 Figure 8), and a timeline of compute and
  copies for one case (from the run's ``timelines/``);
- ``<out>/index.md`` and ``index.html`` linking the suites, those published into ``<out>`` before
  included (``<out>/suites.json`` keeps the list).

``compare(a, b)`` lines up the rows of two runs by case id and reports what changed.

The modules, each reading only those above it:

- ``formats``: how a number is written;
- ``document``: ``Doc``, a page written as Markdown and XHTML at once;
- ``cells``: the rows grouped by model, and ``summarise`` (one ``Cell`` per strategy and budget);
- ``tables``: the tables built from the cells, and their marks;
- ``figures``: the plots;
- ``runs``: a run folder's meta.json and rows, read once and checked;
- ``sentences``: what a page says in words;
- ``page``: ``publish`` and ``publish_run``, which put them together;
- ``comparison``: ``compare`` and ``compare_table``.
"""

from harness.publish.cells import (GRAD_TOLERANCE, Cell, ExecutorTable, Group, budget_order, central, executors,
                                   fastest, kind_of, model_groups, summarise)
from harness.publish.comparison import compare, compare_table
from harness.publish.document import Doc
from harness.publish.figures import time_figure
from harness.publish.formats import fmt_bytes, fmt_ms
from harness.publish.page import fill_common_columns, publish, publish_run, site_suites
from harness.publish.runs import device_budget_of, statistic_of
from harness.publish.sentences import UNVALIDATED
from harness.publish.tables import (ARENA_FLAG, FASTEST, GRAD_FLAG, SPLIT_MARK, claims_table, grid,
                                    strategy_table, time_table)

__all__ = [
    "ARENA_FLAG", "FASTEST", "GRAD_FLAG", "GRAD_TOLERANCE", "SPLIT_MARK", "UNVALIDATED", "Cell", "Doc",
    "ExecutorTable", "Group", "budget_order", "central", "claims_table", "compare", "compare_table",
    "device_budget_of", "executors", "fastest", "fill_common_columns", "fmt_bytes", "fmt_ms", "grid", "kind_of",
    "model_groups", "publish", "publish_run", "site_suites", "statistic_of", "strategy_table", "summarise",
    "time_figure", "time_table",
]
