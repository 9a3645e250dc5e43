"""``harness.testing``: the conformance kit judges refusals by type and ``needed_bytes``.

The kit must be able to fail: a planner that refuses without ``needed_bytes``, or with a
figure not above the budget, is caught whatever its message says.
"""

from __future__ import annotations

import pytest

from harness.bounds import min_memory
from harness.errors import InfeasibleBudget, PlanContractError
from harness.model import Profile, Stage
from harness.planners.keep_all import KeepAll
from harness.schedules import check_budget, keep_all_schedule
from harness.testing import PlannerConformance, check_refusal


def test_a_refusal_with_needed_bytes_above_the_budget_passes() -> None:
    check_refusal(InfeasibleBudget("too small", needed_bytes=101), 100)


@pytest.mark.parametrize("needed", [None, 100, 99, 100.5, True])
def test_a_refusal_without_an_int_above_the_budget_fails(needed) -> None:
    with pytest.raises(AssertionError):
        check_refusal(InfeasibleBudget("infeasible: needs at least 100 bytes", needed_bytes=needed), 100)


def test_a_refusal_must_say_why() -> None:
    with pytest.raises(AssertionError, match="must say why"):
        check_refusal(InfeasibleBudget("", needed_bytes=200), 100)


class Wordy:
    """Refuses below the minimum with the old wording but no ``needed_bytes``."""

    name = "wordy"
    description = "refuses with a message only"

    def plan(self, profile, budget_bytes, **options):
        need = min_memory(profile)
        if budget_bytes < need:
            raise InfeasibleBudget(f"infeasible: wordy needs at least {need} bytes")
        return keep_all_schedule(profile, budget_bytes, self.name)


class TestKeepAllPassesTheKit(PlannerConformance):
    """keep-all refuses everything below the peak, each time with the peak as ``needed_bytes``."""

    planner = KeepAll()


def test_the_kit_fails_a_planner_whose_refusal_lacks_needed_bytes() -> None:
    class TestWordy(PlannerConformance):
        planner = Wordy()

    with pytest.raises(AssertionError, match="without needed_bytes"):
        TestWordy().test_budget_below_minimum_is_refused()


def test_check_budget_reports_the_minimum_as_needed_bytes() -> None:
    stages = tuple(Stage(f"s{i}", "conv", 1e-3, 2e-3, 400, 400, 400) for i in range(4))
    profile = Profile("toy", 2, (1,), "synthetic", 10**9, 1e9, 1e9, 100, 100, stages)
    need = min_memory(profile)
    with pytest.raises(InfeasibleBudget) as caught:
        check_budget(profile, need - 1, "probe")
    assert caught.value.needed_bytes == need
    check_budget(profile, need, "probe")  # at the minimum: no refusal


class Overclaiming:
    """Plans within the budget but says its schedule is for ten times more (the budget the executors enforce)."""

    name = "overclaiming"
    description = "claims a larger budget than it was given"

    def plan(self, profile, budget_bytes, **options):
        if budget_bytes < min_memory(profile):
            raise InfeasibleBudget("infeasible: below the minimum", needed_bytes=min_memory(profile))
        return keep_all_schedule(profile, 10 * budget_bytes + 10, self.name)


class AsDict(Wordy):
    """Returns the schedule as a dict."""

    name = "as-dict"

    def plan(self, profile, budget_bytes, **options):
        from harness.model import to_dict

        return to_dict(keep_all_schedule(profile, budget_bytes, self.name))


@pytest.mark.parametrize("planner, why", [(Overclaiming(), "above the"), (AsDict(), "not a Schedule")])
def test_the_kit_fails_a_schedule_the_runner_would_refuse(planner, why) -> None:
    """The kit checks the contract the runner checks (``checked_schedule``), with the runner's words,
    so that a planner passing the kit never errors on every case of a suite."""
    class TestIt(PlannerConformance):
        pass

    TestIt.planner = planner
    with pytest.raises(PlanContractError, match=why):
        TestIt().test_peak_budget_reproduces_keep_all()
