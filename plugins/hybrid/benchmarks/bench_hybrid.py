"""HYBRID planning time: the whole planner (its table, DYNPROG's and the recomputation planner's
plans, the simulations that pick the fastest) on a 150-stage CNN-like chain at S = 500.

Target (issue #17): under 2 s after compilation. Run with ``tox -e bench`` or
``pytest plugins/hybrid/benchmarks/bench_hybrid.py -o python_files=bench_*.py``; the states
and the source of the plan kept are stored in ``extra_info``. No timed assert.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "dynprog" / "benchmarks"))
from bench_dynprog import cnn_like_chain, mid_budget  # noqa: E402  (the same chain as DYNPROG's benchmark)

from membudget_dynprog._kernels import warm_up as warm_dynprog  # noqa: E402
from membudget_hybrid import discretise_hybrid, plan_hybrid, solve_hybrid  # noqa: E402
from membudget_hybrid._kernels import warm_up  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """Compile both kernels once, before any timing."""
    warm_up()
    warm_dynprog()


def test_plan_150_stages_500_slots(benchmark) -> None:
    """The headline case: ``plan_hybrid`` as the planner runs it."""
    profile = cnn_like_chain(150)
    budget = mid_budget(profile)
    plan = benchmark.pedantic(plan_hybrid, args=(profile, budget), kwargs={"slots": 500}, rounds=5, iterations=1)
    benchmark.extra_info.update(states=plan.states, source=plan.source, makespan=plan.makespan, rivals=plan.rivals)


def test_table_150_stages_500_slots(benchmark) -> None:
    """The table alone (one DP run, the default beam)."""
    profile = cnn_like_chain(150)
    table = discretise_hybrid(profile, mid_budget(profile), 500)
    found, states = benchmark.pedantic(solve_hybrid, args=(table, 4), kwargs={"beam": 2000}, rounds=5,
                                       iterations=1)
    benchmark.extra_info["states"] = states
