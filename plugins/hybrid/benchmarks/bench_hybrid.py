"""HYBRID planning time: the whole planner (its table, DYNPROG's and the recomputation planner's
plans, the simulations that pick the fastest) on a 150-stage CNN-like chain at S = 500.

Target (issue #17): under 2 s after compilation. Run with ``tox -e bench`` or
``pytest plugins/hybrid/benchmarks/bench_hybrid.py -o python_files=bench_*.py``; the states
and the source of the plan kept are stored in ``extra_info``. No timed assert.
"""

from __future__ import annotations

import pytest

from harness.testing import budget_at, cnn_like_chain  # the same chain and budget as DYNPROG's benchmark

from membudget_dynprog._kernels import warm_up as warm_dynprog
from membudget_hybrid import discretise_hybrid, plan_hybrid, solve_hybrid
from membudget_hybrid._kernels import warm_up


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """Compile both kernels once, before any timing."""
    warm_up()
    warm_dynprog()


def test_plan_150_stages_500_slots(benchmark) -> None:
    """The headline case: ``plan_hybrid`` as the planner runs it."""
    profile = cnn_like_chain(150)
    budget = budget_at(profile, 0.4)
    plan = benchmark.pedantic(plan_hybrid, args=(profile, budget), kwargs={"slots": 500}, rounds=5, iterations=1)
    benchmark.extra_info.update(states=plan.states, source=plan.source, makespan=plan.makespan, rivals=plan.rivals)


def test_table_150_stages_500_slots(benchmark) -> None:
    """The table alone (one DP run, the default beam)."""
    profile = cnn_like_chain(150)
    table = discretise_hybrid(profile, budget_at(profile, 0.4), 500)
    found, states = benchmark.pedantic(solve_hybrid, args=(table, 4), kwargs={"beam": 2000}, rounds=5,
                                       iterations=1)
    benchmark.extra_info["states"] = states
