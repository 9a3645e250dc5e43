"""What a schedule does with its saved data (``harness.memory.saved_data``) and the row columns it fills."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from harness.bounds import peak_memory
from harness.case import saved_data_fields
from harness.memory import saved_data
from harness.model import Profile, Schedule, Stage, Transfer, training_ops
from harness.planners.keep_all import KeepAll
from harness.planners.torch_peers import TorchSaveOnCpu, checkpoint_schedule, save_on_cpu_schedule
from harness.schedules import recompute_ops
from harness.simulate.lowering import pass_profiles
from harness.testing import chains

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


def _chain(n: int = 4) -> Profile:
    # input 100, saved 150 (50 beyond the input), gradient 100 bytes per stage
    stages = tuple(Stage(f"s{i}", "conv", 1e-3, 2e-3, 100, 150, 100) for i in range(n))
    return Profile("toy", 8, (1,), "toy", 10**9, 1e9, 1e9, 1000, 100, stages)


def _of(schedule: Schedule, profile: Profile):
    return saved_data(schedule, pass_profiles(profile, schedule))


def test_keep_all_keeps_everything():
    profile = _chain()
    data = _of(KeepAll().plan(profile, peak_memory(profile)), profile)
    assert (data.kept, data.offloaded, data.recomputed, data.recompute_s) == (600, 0, 0, 0.0)


def test_checkpointing_recomputes_and_offloads_nothing():
    """Segment [0, 2) and [2, 4) are checkpointed by every=2 but the last one: stage 0 is the
    checkpoint (its input kept, its extra recomputed), stage 1 saves nothing (all recomputed)."""
    profile = _chain()
    data = _of(checkpoint_schedule(profile, 10**9, 2), profile)
    assert data.offloaded == 0
    assert data.recomputed == 50 + 150
    assert data.kept == 100 + 150 + 150
    assert data.recompute_s == pytest.approx(2e-3)


def test_offloading_everything():
    profile = _chain()
    data = _of(save_on_cpu_schedule(profile, 10**9), profile)
    assert (data.kept, data.offloaded, data.recomputed) == (0, 600, 0)


def test_a_partial_offload_counts_its_bytes_and_a_combined_schedule_counts_each_part_once():
    profile = _chain()
    ops = recompute_ops(4, [(0, 2)])
    f2, b2 = ops.index(next(o for o in ops if o.kind == "F" and o.stage == 2)), \
        ops.index(next(o for o in ops if o.kind == "B" and o.stage == 2))
    transfers = (Transfer(2, "offload", f2, "end", nbytes=60), Transfer(2, "prefetch", b2 - 1, "start", b2, nbytes=60))
    data = _of(Schedule("mixed", 10**9, ops, transfers), profile)
    assert (data.kept, data.offloaded, data.recomputed) == (100 + 90 + 150, 60, 50 + 150)


def test_sub_batches_count_every_pass():
    profile = _chain()
    variant = replace(profile, batch_size=4, stages=tuple(replace(s, saved_bytes=75, input_bytes=50)
                                                          for s in profile.stages))
    profile = replace(profile, variants=(variant,))
    data = _of(Schedule("split", 10**9, training_ops(4, 2), sub_batches=2), profile)
    assert (data.kept, data.total) == (600, 600)


@SETTINGS
@given(profile=chains())
def test_each_strategy_puts_its_saved_data_where_it_says(profile: Profile):
    """Keep-all keeps every saved byte; save_on_cpu offloads what its transfers move and keeps the
    rest; checkpointing recomputes, per segment, all of the inner stages' saved data and what the
    first stage saves beyond its checkpointed input, and offloads nothing (the profile's figures)."""
    total = sum(s.saved_bytes for s in profile.stages)
    n = profile.n_stages
    keep = _of(Schedule("keep-all", 0, training_ops(n)), profile)
    assert (keep.kept, keep.offloaded, keep.recomputed) == (total, 0, 0)
    cpu = save_on_cpu_schedule(profile, 0)
    moved = {tr.stage for tr in cpu.transfers if tr.direction == "offload"}
    data = _of(cpu, profile)
    assert data.recomputed == 0 and data.offloaded == sum(profile.stages[i].saved_bytes for i in moved)
    for every in (1, 2):
        schedule = checkpoint_schedule(profile, 0, every)
        kinds = {op.stage: op.kind for op in schedule.ops if op.is_forward}
        again = sum(s.saved_bytes if kinds[i] == "Fn" else max(0, s.saved_bytes - s.input_bytes) if kinds[i] == "Fc"
                    else 0 for i, s in enumerate(profile.stages))
        data = _of(schedule, profile)
        assert (data.offloaded, data.recomputed) == (0, again), schedule.notes


def test_the_row_columns():
    profile = _chain()
    fields = saved_data_fields(TorchSaveOnCpu().plan(profile, 10**9), profile)
    assert fields == dict(kept_bytes=0, offloaded_bytes=600, recomputed_bytes=0, recompute_s=0.0, weight_bytes=1000)


def test_an_offloading_planner_offloads():
    from harness.bounds import min_memory
    from harness.plugins import registry

    profile = _chain(6)
    schedule = registry().planner("greedy").plan(profile, min_memory(profile))
    data = _of(schedule, profile)
    # each transfer moves what it says, or all the stage saves (150 bytes) when it says nothing
    moved = sum(150 if t.nbytes is None else t.nbytes for t in schedule.transfers if t.direction == "offload")
    assert {t.stage for t in schedule.transfers if t.direction == "offload"} and moved < 900
    assert (data.kept, data.offloaded, data.recomputed) == (900 - moved, moved, 0)


def test_rows_written_before_the_columns_load_without_them(tmp_path):
    """An older rows.csv (no kept_bytes...) loads, its new columns empty, and a resumed run rewrites its header."""
    from harness.results import COLUMNS, RowWriter, format_row, load_rows

    old = [c for c in COLUMNS if c not in ("kept_bytes", "offloaded_bytes", "recomputed_bytes", "recompute_s",
                                           "weight_bytes")]
    row = {"suite": "s", "case_id": "a", "model": "m", "status": "ok", "makespan_s": 0.5}
    (tmp_path / "rows.csv").write_text(",".join(old) + "\n" + ",".join(str(row.get(c, "")) for c in old) + "\n")
    frame = load_rows(tmp_path)
    assert frame["makespan_s"].iloc[0] == 0.5 and frame["kept_bytes"].isna().all()
    RowWriter(tmp_path / "rows.csv").append([{**row, "case_id": "b", "kept_bytes": 7}])
    frame = load_rows(tmp_path)
    assert list(frame["case_id"]) == ["a", "b"] and frame["kept_bytes"].iloc[1] == 7
    assert format_row(row).count(",") == len(COLUMNS) - 1


def test_every_row_of_a_run_says_what_its_schedule_does(tmp_path):
    from harness.runner import run_suite
    from harness.suite import load_suite
    from tests import test_suite_support as support

    support.install()
    out = run_suite(load_suite(support.write_suite(tmp_path)), tmp_path / "results", run_id="r", progress=False)
    ok = out.rows[out.rows["status"] == "ok"]
    assert len(ok) and ok["kept_bytes"].notna().all() and ok["weight_bytes"].notna().all()
    assert set(ok["planner"]) == {"keep-all", "prefix"} and (ok["offloaded_stages"] > 0).any()
    for row in ok.itertuples():  # keep-all offloads nothing, prefix the first offloaded_stages stages, all they save
        saved = [s.saved_bytes for s in support.chain(row.model, row.batch_size).stages]
        k = 0 if row.planner == "keep-all" else row.offloaded_stages
        assert (row.kept_bytes, row.offloaded_bytes, row.recomputed_bytes) == (sum(saved[k:]), sum(saved[:k]), 0), row
