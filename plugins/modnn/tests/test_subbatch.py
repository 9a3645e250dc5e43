"""Sub-batch size selection: M_min (papers/000 eq. 2) and the iteration of eq. (3)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bounds import min_memory
from harness.errors import InfeasibleBudget
from harness.model import Algorithm, Profile, Stage
from harness.testing import chains
from membudget_modnn.subbatch import (
    baseline_algorithm, fastest_algorithm, m_min, max_task_bytes, select_sub_batch, task_bytes,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


def _chain(batch: int = 8) -> Profile:
    """Three stages; the middle one has a fast algorithm with a big workspace (eq. 3's remark)."""
    fast = Algorithm("fast", 1e-3, 2e-3, 4000, 4000)
    slow = Algorithm("implicit", 3e-3, 6e-3, 0, 0)
    stages = (
        Stage("c0", "conv", 1e-3, 2e-3, 800, 800, 0),
        Stage("c1", "conv", 1e-3, 2e-3, 1600, 1600, 1600, 4000, 4000, algorithms=(slow, fast)),
        Stage("fc", "linear", 1e-4, 2e-4, 400, 400, 400),
    )
    return Profile("toy", batch, (1,), "synthetic", 10**9, 1e9, 1e9, 1000, 80, stages)


def test_m_min_is_eq_2_by_hand() -> None:
    """eq. (2): S_W + the largest task at sub-batch 1 with the baseline (no-workspace) algorithm.

    At batch 1 the sizes are an eighth: c0 holds 100 + 200 (F), c1's backward holds
    200 (saved) + 50 (y_2) + 200 (y_1) = 450, its forward 200 + 50; so M_min = 1000 + 450.
    """
    profile = _chain()
    assert m_min(profile) == 1000 + 450
    assert baseline_algorithm(profile, 1) == 0  # implicit GEMM, no workspace
    assert fastest_algorithm(profile, 1) == -1  # the default: as fast as "fast", listed first


def test_m_min_is_below_the_unsplit_minimum() -> None:
    profile = _chain()
    assert m_min(profile) < min_memory(profile, memory_optimal=True)


@pytest.mark.parametrize("budget", [1449, 0])
def test_below_m_min_is_refused_with_the_number(budget: int) -> None:
    with pytest.raises(InfeasibleBudget, match="needs at least 1450 bytes") as info:
        select_sub_batch(_chain(), budget)
    assert info.value.needed_bytes == 1450


def test_eq_3_leaves_room_for_the_fastest_algorithm() -> None:
    """eq. (3) sizes the sub-batch so that the heaviest task fits with its fastest algorithm's workspace."""
    profile = _chain()
    room = 1000 + max_task_bytes(profile.at_batch(4), fastest=True)
    sb = select_sub_batch(profile, room)
    assert sb.sub_batch == 4 and sb.sub_batches == 2
    assert max_task_bytes(sb.profile, fastest=True) <= room - profile.weight_bytes
    # one byte less and 4 no longer fits: the next size down that splits 8 evenly-ish
    assert select_sub_batch(profile, room - 1).sub_batch < 4


@SETTINGS
@given(profile=chains(max_stages=8), batch=st.sampled_from([1, 3, 8, 32]), where=st.floats(0, 1))
def test_selected_sub_batch_fits_and_is_the_largest(profile: Profile, batch: int, where: float) -> None:
    """For linearly scaled profiles: the chosen sub-batch fits (baseline algorithms), the next larger
    split does not fit eq. (3)'s fastest-algorithm test, and the passes cover the batch."""
    profile = replace(profile, batch_size=batch)
    lo, hi = m_min(profile), profile.weight_bytes + max_task_bytes(profile, fastest=True) + 1
    budget = int(lo + (hi - lo) * where)
    sb = select_sub_batch(profile, budget)
    room = budget - profile.weight_bytes
    assert sb.sub_batches * sb.sub_batch >= batch > (sb.sub_batches - 1) * sb.sub_batch
    assert max_task_bytes(sb.profile, fastest=False) <= room
    if sb.sub_batches > 1:
        bigger = math.ceil(batch / (sb.sub_batches - 1))
        assert max_task_bytes(profile.at_batch(bigger), fastest=True) > room
    assert sb.iterations[0] == batch


def test_iteration_reprofiles_at_each_candidate() -> None:
    """With a measured variant whose workspace does not scale, eq. (3) re-reads the profile each round.

    Room 3,800 bytes. Batch 8 needs 7,600 (c1's backward with its 4,000-byte workspace):
    b = 4. The measured batch-4 profile has a 1,000-byte workspace, not 2,000: 2,800
    bytes, so b = 5; batch 5 (interpolated between the measured 4 and 8: workspace 1,750)
    needs 4,000, so b = 4 again: a cycle, which ends at its smallest size.
    """
    base = _chain()
    v4 = base.at_batch(4)
    fast4 = Algorithm("fast", 0.5e-3, 1e-3, 1000, 1000)
    s1 = replace(v4.stages[1], fwd_workspace=1000, bwd_workspace=1000,
                 algorithms=(v4.stages[1].algorithms[0], fast4))
    v4 = replace(v4, stages=(v4.stages[0], s1, v4.stages[2]), measured=True, notes={})
    profile = replace(base, variants=(v4,))
    assert task_bytes(profile.at_batch(4), 1, fast4)[1] == 800 + 200 + 800 + 1000
    sb = select_sub_batch(profile, 1000 + 3800)
    assert sb.iterations == (8, 4, 5)
    assert sb.sub_batch == 4 and sb.profile == v4
