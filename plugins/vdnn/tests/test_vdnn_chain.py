"""VDNN for unannotated chains (papers/004 section 6.1): its candidate sets and its choice."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.model import Profile, Stage
from harness.schedules import best_ordered_schedule
from harness.simulate.executor import simulate
from harness.testing import budgets, chains
from membudget_vdnn import VdnnChain, candidate_sets

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


def test_candidates_are_threshold_sets_and_every_other_one() -> None:
    """Ratios u_F / |x_i| of 4, 1, 3, 2 (and a stage with nothing saved): thresholds 4, 3, 2, 1."""
    def stage(i: int, fwd: float, saved: int) -> Stage:
        return Stage(f"s{i}", "other", fwd, fwd, saved, saved, saved)

    profile = Profile("toy", 1, (1,), "toy", 10**9, 1e6, 1e6, 0, 1,
                      (stage(0, 4.0, 1), stage(1, 1.0, 1), stage(2, 0.0, 0), stage(3, 6.0, 2), stage(4, 2.0, 1)))
    assert candidate_sets(profile) == [
        (),
        (0,),                      # ratio >= 4 (every other one: the same)
        (0, 3),                    # >= 3 (every other one: (0,), seen)
        (0, 3, 4), (0, 4),         # >= 2, and every other one of them
        (0, 1, 3, 4),              # >= 1 (every other one: (0, 3), seen)
    ]


@SETTINGS
@given(profile=chains())
def test_every_candidate_is_a_threshold_set_or_half_of_one(profile: Profile) -> None:
    ratio = {i: s.fwd_time / s.saved_bytes for i, s in enumerate(profile.stages) if s.saved_bytes > 0}
    expected = {()}
    for t in set(ratio.values()):
        full = tuple(i for i in sorted(ratio) if ratio[i] >= t)
        expected |= {full, full[::2]}
    sets = candidate_sets(profile)
    assert set(sets) == expected and len(sets) == len(expected)
    assert tuple(sorted(ratio)) in sets, "the lowest threshold offloads every stage with data"


@SETTINGS
@given(profile=chains(max_stages=8), data=st.data())
def test_vdnn_chain_keeps_the_fastest_candidate(profile: Profile, data) -> None:
    """VDNN outputs the best schedule out of all the candidates (papers/004 section 6.1)."""
    budget = data.draw(st.sampled_from(budgets(profile, 4)))
    schedule = VdnnChain().plan(profile, budget)
    best = simulate(schedule, profile).makespan
    assert schedule.offloaded_stages in candidate_sets(profile)
    assert all(t.wait_op is None for t in schedule.transfers), "no-wait"
    for offload in candidate_sets(profile):
        other = best_ordered_schedule(profile, budget, offload, planner="probe")
        if other is not None:
            assert best <= simulate(other, profile).makespan * (1 + 1e-12)
