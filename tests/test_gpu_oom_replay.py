"""benchmarks/gpu/oom_replay.py: the measured oom rows of a GPU run replayed on the simulator, under
the schedule's own budget and with its prefetches let in up to the device budget (docs/gpu.md).
Checked on a simulated run relabelled as measured, where greedy's oom row is known to be the second:
its prefetches, all issued at the backward's start, hold more when nothing makes them wait."""

from __future__ import annotations


import pytest

from tests.test_suite_support import gpu_script, rewrite_rows, run_yaml

oom_replay = gpu_script("oom_replay")

ALLOCATED = 3 * 2**30  # what the "device" had allocated at the failure


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A simulated run under a device budget, its greedy row at f0.5 relabelled as a measured oom."""
    run = run_yaml(tmp_path_factory.mktemp("oom-replay"), """
        name: oom-replay
        profiler: analytic
        device: V100-PCIe
        budget_model: device
        models: [{model: torchvision:resnet18, batch_sizes: [32], input_size: [3, 224, 224]}]
        budgets: {fractions: [0.5, 0.75]}
        planners: [keep-all, greedy]
        executors: [simulate]
    """)
    relabelled = []

    def measured_oom(row: dict) -> None:
        if row["planner"] == "greedy" and row["budget_label"] == "f0.5":
            assert row["status"] == "ok"
            row.update(executor="torch", status="oom", peak_bytes=str(ALLOCATED))
            relabelled.append(row["case_id"])

    rewrite_rows(run, measured_oom)
    assert len(relabelled) == 1
    return run


def test_each_measured_oom_row_is_replayed_waiting_and_let_in(run_dir, capsys):
    table = oom_replay.replay(run_dir)
    assert list(table.planner) == ["greedy"] and list(table.budget) == ["f0.5"]  # the oom row alone
    row = table.iloc[0]
    assert row["chain budget"] < row["device budget"]  # the device budget model kept a margin
    assert row["peak waiting"] <= row["chain budget"]  # the simulator's rule: prefetches wait
    assert row["chain budget"] < row["peak let in"] <= row["device budget"] - row["runtime"]  # into the margin
    assert row["allocated at oom"] == pytest.approx(ALLOCATED / 2**30)
    assert oom_replay.main([str(run_dir)]) == 0
    assert "greedy" in capsys.readouterr().out
