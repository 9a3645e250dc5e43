"""papers/001 section 6.1: the sequence a11 ... d4 against the exact answer, first-fit and best-fit.

The paper claims that no placement of this sequence fits in the pool P it fills just
before every free, even knowing the sequence ahead. CP-SAT settles it: infeasible in P;
the optimum is 13/12 P. The CNMEM-like first-fit pool needs 14/12 P (it grows once by
a 2/12 P request); best-fit, planning ahead, reaches the optimum 13/12 P.
"""

from __future__ import annotations

import pytest

from harness.allocators.first_fit import Cnmem, FirstFit
from harness.allocators.validate import violations
from harness.testing_allocators import paper001_sequence
from membudget_bestfit import BestFit

MiB = 1 << 20
POOL = 12 * MiB


@pytest.fixture(scope="module")
def exact_answer():
    pytest.importorskip("ortools")
    from harness.allocators.exact import solve_exact

    blocks = paper001_sequence(POOL)
    return solve_exact(blocks, pool_bytes=POOL), solve_exact(blocks)


def test_exact_solver_settles_the_claim(exact_answer):
    in_pool, unbounded = exact_answer
    assert in_pool.status == "infeasible"  # the paper is right: nothing fits in P
    assert unbounded.optimal and unbounded.arena_bytes == 13 * MiB


def test_first_fit_pool_against_the_answer(exact_answer):
    _, unbounded = exact_answer
    blocks = paper001_sequence(POOL)
    for alloc in (FirstFit(pool_bytes=POOL), Cnmem(pool_bytes=POOL)):
        p = alloc.place(blocks)
        assert not violations(blocks, p)
        assert p.arena_bytes == 14 * MiB > unbounded.arena_bytes  # out of the pool, 1/12 P above the optimum


def test_bestfit_against_the_answer(exact_answer):
    _, unbounded = exact_answer
    blocks = paper001_sequence(POOL)
    p = BestFit().place(blocks)
    assert not violations(blocks, p)
    assert p.arena_bytes == unbounded.arena_bytes == 13 * MiB  # optimal, and (necessarily) above P


@pytest.mark.parametrize("pool", [12, 24 * MiB, 120 * MiB])
def test_the_answer_does_not_depend_on_the_scale(pool):
    pytest.importorskip("ortools")
    from harness.allocators.exact import solve_exact

    blocks = paper001_sequence(pool)
    assert solve_exact(blocks, pool_bytes=pool).status == "infeasible"
    assert solve_exact(blocks).arena_bytes == BestFit().place(blocks).arena_bytes == pool * 13 // 12
