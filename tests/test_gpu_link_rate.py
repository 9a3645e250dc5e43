"""benchmarks/gpu/link_rate.py: the host-link rate a measured row behaved as if it had, found by
re-planning the case and bisecting the simulator's link rate (docs/gpu.md). Checked on a run whose
"measured" times are the simulator's at a known slower link: the script must give that rate back."""

from __future__ import annotations

import math

import pytest

from tests.test_suite_support import gpu_script, rewrite_rows, run_yaml

from harness.case import plan_case
from harness.model import Profile, load
from harness.plugins import registry

link_rate = gpu_script("link_rate")

SLOWER = 0.8  # the "device's" link against the profile's


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A simulated run relabelled as measured, each time the simulator's at SLOWER x the profile's link."""
    run = run_yaml(tmp_path_factory.mktemp("link-rate"), """
        name: link-rate
        profiler: analytic
        device: V100-PCIe
        models: [{model: torchvision:resnet18, batch_sizes: [32], input_size: [3, 224, 224]}]
        budgets: {fractions: [0.0, 0.5]}
        planners: [keep-all, vdnn-all, {name: dynprog, slots: 100}]
        executors: [simulate]
    """)
    profile = load(Profile, next((run / "profiles").iterdir()))

    def measured(row: dict) -> None:
        if row["status"] != "ok":
            return
        options = link_rate.row_options(row)
        schedule = plan_case(registry().planner(row["planner"]), profile, int(row["budget_bytes"]), options).schedule
        row.update(executor="torch", predicted_s=row["makespan_s"],
                   makespan_s=repr(link_rate.time_at(schedule, profile, SLOWER * profile.d2h_bandwidth)))
        if row["planner"] == "vdnn-all":  # as if PyTorch's hooks had copied more than the schedule moves
            row["moved_bytes"] = str(int(1.5 * float(row["moved_bytes"])))

    rewrite_rows(run, measured)
    return run


def test_the_implied_rate_of_every_row_that_moved_data_is_the_link_it_ran_on(run_dir):
    table = link_rate.rows_with_rates(run_dir)
    assert set(table.planner) == {"vdnn-all", "dynprog"}  # keep-all moves nothing: not a row
    profile_rate = table["profile GB/s"].iloc[0]
    assert profile_rate == pytest.approx(12.2)  # papers/004's V100 link
    copy_bound = table[(table["measured ms"] > table["predicted ms"] * 1.001) & (table.planner == "dynprog")]
    assert len(copy_bound) == 2  # at both budgets
    assert copy_bound["implied GB/s"].to_numpy() == pytest.approx(SLOWER * profile_rate, rel=1e-3)
    hooks = table[table.planner == "vdnn-all"]  # moved other bytes than its schedule: not the link's rate
    assert len(hooks) == 1 and hooks["implied GB/s"].isna().all()
    assert hooks["moved GB"].iloc[0] == pytest.approx(1.5 * hooks["schedule moves GB"].iloc[0], rel=1e-6)


def test_a_gap_the_link_cannot_explain_gives_no_rate():
    from harness.protocols import Workload

    profile = registry().profiler("analytic").profile(Workload("torchvision:resnet18", 32, (3, 224, 224), "V100-PCIe"))
    from harness.bounds import min_memory, peak_memory

    schedule = registry().planner("vdnn-all").plan(profile, (min_memory(profile) + peak_memory(profile)) // 2)
    compute = sum(s.fwd_time + s.bwd_time for s in profile.stages)
    assert link_rate.implied_rate(schedule, profile, 0.5 * compute) is None  # faster than any link allows
    for rate in (3e9, 30e9):  # a slower link than the profile's (12.2 GB/s), and a faster one
        found = link_rate.implied_rate(schedule, profile, link_rate.time_at(schedule, profile, rate))
        assert found == pytest.approx(rate, rel=1e-3)


def test_a_faster_link_is_found_below_the_rate_where_the_schedule_stops_being_valid():
    """The reviewer's case: near the minimum memory, dynprog's schedule is valid from the profile's
    link up to some rate below twice it; a row measured at a rate in that span must be solved."""
    from harness.bounds import min_memory, peak_memory
    from harness.protocols import Workload

    profile = registry().profiler("analytic").profile(Workload("torchvision:resnet18", 32, (3, 224, 224), "V100-PCIe"))
    budget = min_memory(profile) + (peak_memory(profile) - min_memory(profile)) // 20
    schedule = plan_case(registry().planner("dynprog"), profile, budget, {"slots": 100}).schedule
    base = profile.d2h_bandwidth
    valid = [f for f in (1.1, 1.3, 1.5, 2.0, 3.0) if not math.isinf(link_rate.time_at(schedule, profile, f * base))]
    assert 1.1 in valid  # the span this test is about
    for factor in valid:
        found = link_rate.implied_rate(schedule, profile, link_rate.time_at(schedule, profile, factor * base))
        assert found == pytest.approx(factor * base, rel=2e-3)


def test_a_device_budget_row_is_planned_again_at_the_chain_budget_its_run_settled_on(tmp_path, monkeypatch):
    """Under a device budget the scripts plan a row again at its ``planning_budget_bytes``, not
    through the device budget model's search: a change of that model since the run (as on
    2026-11-30, its trace simulated as the device runs it) must not plan the row otherwise."""
    import harness.device_memory

    run = run_yaml(tmp_path, """
        name: device-replan
        profiler: analytic
        device: V100-PCIe
        models: [{model: torchvision:resnet18, batch_sizes: [32], input_size: [3, 224, 224]}]
        budget_model: device
        budgets: {fractions: [0.25, 0.75]}
        planners: [vdnn-all, greedy, {name: dynprog, slots: 100}]
        executors: [simulate]
    """)
    from harness.results import load_rows

    profile = load(Profile, next((run / "profiles").iterdir()))
    rows = load_rows(run)
    ok = rows[rows.status == "ok"]
    assert len(ok) >= 4

    def moved(*args, **kwargs):
        raise AssertionError("planned through the device budget model again")

    monkeypatch.setattr(harness.device_memory, "plan_for_device", moved)
    for _, row in ok.iterrows():
        schedule = link_rate.planned_schedule(row, profile, True)
        assert schedule.fingerprint() == row.schedule_fingerprint, row.case_id
        assert schedule.device_budget_bytes == int(row.budget_bytes)
