"""``harness.schedules``: the ordered no-wait schedule and its prefetch issue points.

Prefetching during the last forward operations (``prefetch_lead``) is the case papers/004
section 5.2.2 prices with eq. (10): once every offload is done, the copy engine may bring
data back before the backward pass starts if memory allows.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bounds import peak_memory
from harness.model import Profile, Stage
from harness.schedules import (
    best_ordered_schedule, checked_schedule, keep_all_schedule, offload_set_refusal, ordered_schedule,
    unconstrained_peak,
)
from harness.simulate.executor import simulate
from harness.testing import budgets, chains, check_refusal
from harness.validate import check_structure, validate

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


def eq10_chain() -> Profile:
    """Three stages at 100 B/s: F_1's 200-byte workspace forces x_0 out; once F_1 is done there
    is room for x_0 again, and F_2 runs 10 s while B_2 and B_1 take 0.1 s each."""

    def stage(name, fwd, bwd, size, ws=0):
        return Stage(name, "conv", fwd, bwd, size, size, 0, fwd_workspace=ws)

    return Profile("eq10", 1, (1,), "synthetic", 10**6, 100.0, 100.0, 0, 0,
                   (stage("big", 0.1, 0.1, 100), stage("wide", 1.0, 0.1, 10, ws=200), stage("long", 10.0, 0.1, 10)))


def _prefetch_issue_ops(schedule):
    return [schedule.ops[t.issue_op] for t in schedule.transfers if t.direction == "prefetch"]


def test_without_a_lead_no_prefetch_is_issued_in_the_forward_pass() -> None:
    profile = eq10_chain()
    schedule = ordered_schedule(profile, 230, {0}, planner="t")
    (op,) = _prefetch_issue_ops(schedule)
    assert op.kind == "B"
    run = simulate(schedule, profile)
    assert run.feasible
    prefetch = next(e for e in run.timeline if e.label == "prefetch 0")
    b2 = next(e for e in run.timeline if e.label == "B2")
    assert prefetch.start >= b2.start
    assert abs(run.makespan - 13.1) < 1e-9  # B0 waits 0.8 s for x_0


def test_a_lead_prefetches_during_the_last_forwards_and_saves_the_wait() -> None:
    """The prefetch of x_0 runs during F_2 (it cannot during F_1: the workspace fills memory),
    so the backward pass never waits: compute 11.4 s + the 0.9 s F_1 waits for the offload."""
    profile = eq10_chain()
    schedule = ordered_schedule(profile, 230, {0}, planner="t", prefetch_lead=3)
    (op,) = _prefetch_issue_ops(schedule)
    assert (op.kind, op.stage) == ("F", 1)  # F_{L-3} = F_0 is before x_0 exists: F_1
    assert validate(schedule, profile) == []
    run = simulate(schedule, profile)
    prefetch = next(e for e in run.timeline if e.label == "prefetch 0")
    f1, f2 = (next(e for e in run.timeline if e.label == k) for k in ("F1", "F2"))
    assert f1.end <= prefetch.start < f2.end
    assert abs(run.makespan - 12.3) < 1e-9
    best = best_ordered_schedule(profile, 230, {0}, planner="t", prefetch_during_forward=True)
    assert abs(simulate(best, profile).makespan - 12.3) < 1e-9
    plain = best_ordered_schedule(profile, 230, {0}, planner="t")
    assert abs(simulate(plain, profile).makespan - 13.1) < 1e-9


@SETTINGS
@given(profile=chains(max_stages=8), data=st.data())
def test_lead_schedules_are_valid_and_the_search_never_loses(profile: Profile, data) -> None:
    """Any lead gives a structurally valid schedule, which ``validate`` accepts whenever it runs;
    searching the leads too is never slower than the windows alone (they are still candidates)."""
    n = profile.n_stages
    offload = set(data.draw(st.lists(st.integers(0, n - 1), unique=True)))
    budget = data.draw(st.sampled_from(budgets(profile)))
    lead = data.draw(st.integers(1, n))
    window = data.draw(st.one_of(st.none(), st.integers(1, n)))
    schedule = ordered_schedule(profile, budget, offload, planner="t", prefetch_window=window, prefetch_lead=lead)
    assert check_structure(schedule, profile) == []
    if simulate(schedule, profile, with_trace=False).feasible:
        assert validate(schedule, profile) == []
    plain = best_ordered_schedule(profile, budget, offload, planner="t")
    led = best_ordered_schedule(profile, budget, offload, planner="t", prefetch_during_forward=True)
    if plain is not None:
        assert led is not None
        assert (simulate(led, profile, with_trace=False).makespan
                <= simulate(plain, profile, with_trace=False).makespan * (1 + 1e-12))


@SETTINGS
@given(profile=chains(max_stages=8), where=st.floats(0.0, 1.0))
def test_unconstrained_peak_is_a_budget_the_schedule_runs_in(profile: Profile, where: float) -> None:
    """``unconstrained_peak``: the peak with no budget, so the schedule runs under exactly that budget."""
    offload = [i for i, s in enumerate(profile.stages) if s.saved_bytes][: max(1, int(where * profile.n_stages))]
    schedule = ordered_schedule(profile, 0, offload, planner="t", prefetch_window=1)
    need = unconstrained_peak(schedule, profile)
    assert need == simulate(schedule, profile, budget=float("inf"), with_trace=False).peak_bytes
    assert simulate(schedule, profile, budget=need, with_trace=False).feasible


@SETTINGS
@given(profile=chains(max_stages=8, with_algorithms=False), where=st.floats(0.0, 1.0), data=st.data())
def test_an_offload_set_refusal_reports_what_the_set_needs(profile: Profile, where: float, data) -> None:
    """When no prefetch order fits, ``needed_bytes`` is the just-in-time schedule's peak: above the
    budget whenever that schedule does not run in it, and a budget in which it does. The set offloads
    some stages whole (None) and others in part, as GREEDY's fractional set does."""
    budget = int(peak_memory(profile) * where)  # below min_memory too, where the schedule cannot run
    amounts = {i: data.draw(st.one_of(st.none(), st.integers(1, s.saved_bytes)))
               for i, s in enumerate(profile.stages) if s.saved_bytes and data.draw(st.booleans())}
    exc = offload_set_refusal(profile, budget, amounts, "t")
    just_in_time = ordered_schedule(profile, exc.needed_bytes, amounts, planner="t", prefetch_window=1)
    assert simulate(just_in_time, profile, with_trace=False).feasible
    if not simulate(ordered_schedule(profile, budget, amounts, planner="t", prefetch_window=1), profile,
                    with_trace=False).feasible:
        check_refusal(exc, budget, "t")


def test_a_planners_own_cap_below_the_budget_is_kept_and_one_above_it_refused():
    """checked_schedule: vDNN++ caps memory at vDNN's peak (papers/001 section 4.1), below the budget it
    was given; pinning the cap to the budget let its simulated peak grow with the budget (the quick
    suite's vdnnpp rows: 597.60 MiB became 611-681 MiB). A cap above the budget is the planner's error."""
    class Planner:
        name = "capped"

    profile = eq10_chain()
    peak = peak_memory(profile)
    assert checked_schedule(Planner(), keep_all_schedule(profile, peak), 2 * peak).budget_bytes == peak
    with pytest.raises(TypeError, match="planner capped returned a schedule for .* bytes, above the"):
        checked_schedule(Planner(), keep_all_schedule(profile, peak + 1), peak)
