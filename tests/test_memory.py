"""The memory rules written once (``harness.memory``): the blocks, the needs, and their users agree."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bounds import op_needs as bound_needs
from harness.bounds import peak_memory
from harness.memory import (movable_bytes, recompute_peak, schedule_blocks, schedule_needs, segment_needs,
                            stage_memory)
from harness.model import Algorithm, Profile, Stage, training_ops, Schedule
from harness.schedules import recompute_ops
from harness.simulate.executor import simulate
from harness.simulate.lowering import lower
from harness.validate import validate
from harness.testing import chains

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(profile=chains())
def test_the_needs_of_the_blocks_are_the_closed_forms(profile: Profile) -> None:
    """What is live during each operation, less what may be away, is F_i's and B_i's need."""
    schedule = Schedule("keep-all", 0, training_ops(profile.n_stages))
    needs = schedule_needs(schedule, [profile])
    for k, op in enumerate(schedule.ops):
        m = stage_memory(profile, op.stage)
        assert needs[k] == (m.forward_need if op.kind == "F" else m.backward_need), op.label
    assert sorted(n for _, n in bound_needs(profile)) == sorted(profile.weight_bytes + n for n in needs)


@SETTINGS
@given(profile=chains())
def test_lowering_is_the_blocks(profile: Profile) -> None:
    """Every byte an operation allocates is freed: by an operation or with its saved tensor."""
    schedule = Schedule("keep-all", 0, training_ops(profile.n_stages))
    low = lower(schedule, profile)
    assert low.op_alloc.sum() == low.op_free.sum() + low.t_size.sum()
    assert list(low.t_size) == [s.saved_bytes for s in profile.stages]
    blocks = schedule_blocks(schedule, [profile])
    assert sum(b.size for b in blocks if not b.born_at_end) == low.op_alloc.sum()


@SETTINGS
@given(profile=chains(), recompute=st.booleans())
def test_the_memory_in_use_with_everything_resident_is_the_simulators(profile: Profile, recompute: bool) -> None:
    """``Lowered.resident_in_use``, the memory as each operation starts when no transfer runs, is the
    simulator's: its largest is the peak of the schedule simulated without a budget (keep-all, or
    segments of two stages recomputed), and it never falls below the weights."""
    n = profile.n_stages
    ops = recompute_ops(n, [(a, min(a + 2, n)) for a in range(0, n, 2)]) if recompute else training_ops(n)
    schedule = Schedule("probe", 0, ops)
    in_use = lower(schedule, profile).resident_in_use()
    assert len(in_use) == len(ops) and in_use.min() >= profile.weight_bytes
    assert in_use.max() == simulate(schedule, profile, budget=float("inf")).peak_bytes


def test_forward_need_is_papers_004_eq_1() -> None:
    """F_i: max(x_i, saved_i) + x_{i+1} + workspace; B_i: saved_i + h_i + y_{i+1} + y_i + workspace."""
    stages = (Stage("a", "conv", 1.0, 1.0, 100, 150, 10, fwd_workspace=7, bwd_workspace=9, output_saved_bytes=20),
              Stage("b", "act", 1.0, 1.0, 40, 30, 5))
    profile = Profile("toy", 1, (1,), "synthetic", 10**9, 1e9, 1e9, 1000, 60, stages)
    a, b = stage_memory(profile, 0), stage_memory(profile, 1)
    assert (a.forward_need, a.backward_need) == (150 + 40 + 7, 150 + 20 + 5 + 10 + 9)
    assert (b.forward_need, b.backward_need) == (40 + 60, 30 + 0 + 2 * 60 + 5)
    assert (b.kept, b.extra, b.drop) == (30, 0, 10)
    # keep-all peaks at B_1: weights, saved_0, saved_1 (x_1 less its 10-byte drop), output, its gradient, y_1
    run = simulate(Schedule("keep-all", 0, training_ops(2)), profile, budget=10**9)
    assert run.peak_bytes == 1000 + 150 + 30 + 60 + 60 + 5


def test_lowerings_of_one_profile_share_the_operation_arrays_safely() -> None:
    """The per-operation arrays are cached by operations, algorithms and the profile's identity:
    another profile gets its own, and a caller that writes into its copy changes nothing else."""
    small, large = uniform_profile(100), uniform_profile(200)
    schedule = Schedule("keep-all", 0, training_ops(3))
    first = lower(schedule, small)
    first.op_alloc[:] = -1
    again = lower(schedule, small)
    assert (again.op_alloc >= 0).all() and again.op_alloc.sum() == lower(schedule, replace(small)).op_alloc.sum()
    assert lower(schedule, large).op_alloc.sum() == 2 * again.op_alloc.sum()


def test_a_sub_batched_schedule_is_lowered_once_per_profile() -> None:
    """Its passes are new profiles at every call, yet the arrays are the profile's: one cache entry."""
    from harness.simulate.lowering import _OPS_CACHE

    base = uniform_profile(100)
    profile = replace(base, batch_size=4, variants=(replace(base, batch_size=2),))
    schedule = Schedule("split", 0, training_ops(3, 2), sub_batches=2)
    _OPS_CACHE.clear()  # a full cache evicts one entry per miss and keeps its length
    lower(schedule, profile)
    entries = len(_OPS_CACHE)
    for _ in range(3):
        lower(schedule, profile)
    assert len(_OPS_CACHE) == entries


def test_the_candidates_of_a_planner_share_their_operations_and_one_lowering() -> None:
    """Ordered schedules of one chain share one operations tuple, and lowering them flattens it
    once (the cache is keyed by its identity); an equal tuple that is another object is lowered
    to the same arrays."""
    from harness.schedules import ordered_schedule
    from harness.simulate.lowering import _OPS_CACHE

    profile = uniform_profile(100)
    candidates = [ordered_schedule(profile, 10**9, offload, planner="t", prefetch_window=w)
                  for offload in ({0}, {1}, {0, 1}) for w in (None, 1)]
    assert all(c.ops is candidates[0].ops for c in candidates)
    from harness.schedules import keep_all_schedule, recompute_ops

    assert keep_all_schedule(profile, 10**9).ops is candidates[0].ops  # every planner's, not only ordered ones
    assert recompute_ops(3, [(0, 2)]) is recompute_ops(3, ((0, 2),))
    _OPS_CACHE.clear()  # a full cache evicts one entry per miss and keeps its length
    lower(candidates[0], profile)
    entries = len(_OPS_CACHE)
    for c in candidates:
        lower(c, profile)
    assert len(_OPS_CACHE) == entries
    copy = replace(candidates[3], ops=tuple(replace(op) for op in candidates[3].ops))
    assert copy.ops == candidates[3].ops and copy.ops is not candidates[3].ops
    a, b = lower(candidates[3], profile), lower(copy, profile)
    for field_ in ("op_dur", "op_alloc", "op_free", "op_tensor", "t_size", "tr_bytes", "tr_wait_op"):
        assert (getattr(a, field_) == getattr(b, field_)).all(), field_


def uniform_profile(size: int) -> Profile:
    """Three stages of ``size`` bytes each, no weights."""
    stage = Stage("s", "conv", 1.0, 2.0, size, size, size)
    return Profile("uniform", 1, (1,), "synthetic", 10**9, 1e9, 1e9, 0, size, (stage,) * 3)


def _random_segments(n: int, draw) -> list[tuple[int, int]]:
    """Pieces left to right: a saving stage, or a checkpointed segment [a, b)."""
    segments, i = [], 0
    while i < n:
        if draw(st.booleans()):
            i += 1
        else:
            b = draw(st.integers(i + 1, n))
            segments.append((i, b))
            i = b
    return segments


@SETTINGS
@given(profile=chains(max_stages=16), data=st.data())
def test_the_peak_of_checkpointed_segments_is_the_simulators(profile: Profile, data) -> None:
    """``recompute_peak`` (``saving_need``, ``segment_needs`` above the prefix ``movable_bytes``)
    is the simulator's peak of ``recompute_ops`` with no transfers, byte for byte."""
    segments = _random_segments(profile.n_stages, data.draw)
    schedule = Schedule("segments", 0, recompute_ops(profile.n_stages, segments))
    run = simulate(schedule, profile, budget=float("inf"))
    assert run.peak_bytes - profile.weight_bytes == recompute_peak(profile, segments), segments


def test_segment_needs_by_hand() -> None:
    """Four 100-byte stages. The segment [0, 2) peaks at 300 above nothing (R1: y2, x0, x1, x2; B1:
    x0, x1, y2, y1); the whole chain as one segment at 700 (B3: x0, x1, x2, x3, the output, y3 and
    the output gradient). With [0, 2), the 600 of tests/test_recompute.py's worked example is at
    B3, a saving stage: x0 (the checkpoint), x2, x3, the output, y3, the output gradient."""
    stage = Stage("s", "conv", 1.0, 2.0, 100, 100, 100)
    profile = Profile("uniform", 4, (1,), "synthetic", 10**9, 1e9, 1e9, 0, 100, (stage,) * 4)
    mem = [stage_memory(profile, i) for i in range(4)]
    assert list(segment_needs(mem)[0, 1:]) == [300, 400, 500, 700]
    assert movable_bytes(mem[0], "Fc") == 100 and movable_bytes(mem[1], "Fn") == 0
    assert recompute_peak(profile, [(0, 2)]) == 600


@SETTINGS
@given(profile=chains(with_algorithms=False))
def test_segment_needs_are_what_the_blocks_hold(profile: Profile) -> None:
    """A recomputed segment's forward and backward needs (``segment_phase_needs``) are the most the
    blocks hold during its operations when every other stage's saved tensor is away (the
    segment's recomputed data is not: it cannot be offloaded)."""
    from harness.memory import pass_ops, segment_phase_needs
    from harness.schedules import recompute_ops

    n = profile.n_stages
    mem = [stage_memory(profile, i) for i in range(n)]
    forward, backward = segment_phase_needs(mem)
    for a in range(n):
        for b in range(a + 1, n + 1):
            schedule = Schedule("t", 0, recompute_ops(n, [(a, b)]))
            ops = pass_ops(schedule, n)[0]
            live = [0] * len(schedule.ops)
            for bl in schedule_blocks(schedule, [profile]):
                stage = bl.tensor % n if bl.tensor >= 0 else -1
                for k in range(bl.born + 1 if bl.born_at_end else bl.born, bl.dies + 1):
                    away = bl.tensor >= 0 and not a <= stage < b and ops.producer(stage) < k < bl.dies
                    live[k] += 0 if away else bl.size
            fwd = max(live[ops.forward[i]] for i in range(a, b))
            bwd = max(live[k] for i in range(a, b) for k in (ops.recompute[i], ops.backward[i]))
            assert (forward[a, b], backward[a, b]) == (fwd, bwd), (a, b)


# --------------------------------------------------------------------------- an offloaded checkpoint


def checkpoint_offload_schedule(budget: int = 400) -> tuple[Profile, Schedule]:
    """uniform_profile(100) with [0, 2) recomputed and stage 0's checkpoint x_0 offloaded (100 B/s)."""
    from harness.schedules import ordered_schedule

    profile = replace(uniform_profile(100), d2h_bandwidth=100.0, h2d_bandwidth=100.0)
    schedule = ordered_schedule(profile, budget, {0}, planner="t", recompute=[(0, 2)])
    return profile, schedule


def test_an_fc_stages_checkpoint_is_its_movable_tensor_by_hand() -> None:
    """Fc0 Fn1 F2 B2 R0 R1 B1 B0: x_0 (100 B) carries stage 0's tensor id, produced by Fc0 and
    read again by R0, so it may be away from F1 to B2; the recreated extra (0 B here) is not moved."""
    from harness.memory import pass_ops, saved_data

    profile, schedule = checkpoint_offload_schedule()
    assert [op.label for op in schedule.ops] == ["Fc0", "Fn1", "F2", "B2", "R0", "R1", "B1", "B0"]
    blocks = {b.name: b for b in schedule_blocks(schedule, [profile])}
    x0 = blocks["x0.checkpoint"]
    assert (x0.size, x0.born, x0.dies, x0.tensor) == (100, 0, 7, 0)
    assert blocks["saved0.extra"].tensor == -1
    ops = pass_ops(schedule, 3)[0]
    assert (ops.producer(0), ops.reader(0)) == (0, 4)
    # live per operation by hand: 200 300 300 500 300 400 400 300; x_0 may be away at ops 1-3
    assert schedule_needs(schedule, [profile]) == [200, 200, 200, 400, 300, 400, 400, 300]
    # saved data: stage 0's kept x_0 is offloaded, stage 1 recomputed, stage 2 kept
    data = saved_data(schedule, [profile])
    assert (data.kept, data.offloaded, data.recomputed) == (100, 100, 100) and data.total == 300
    plain = saved_data(replace(schedule, transfers=()), [profile])
    assert (plain.kept, plain.offloaded, plain.recomputed) == (200, 0, 100)
    low = lower(schedule, profile)
    assert list(low.tr_bytes) == [100, 100] and list(low.tr_wait_op) == [-1, 4]
    assert low.t_size[0] == 100 and low.op_tensor[0] == 0 and low.op_tensor[4] == -1


def test_a_chosen_algorithm_s_workspace_is_what_the_simulator_allocates() -> None:
    """A schedule that picks an algorithm with MORE workspace than the default runs with that workspace:
    the memory rules (stage_memory) read the schedule's algorithm, so the simulated peak is the default's
    plus the difference, the validator accepts the run there, and one byte less does not fit."""
    hungry = Algorithm("fast", 0.5, 0.5, 5000, 7000)
    stage = Stage("c", "conv", 1.0, 1.0, 100, 100, 100, fwd_workspace=10, bwd_workspace=20, algorithms=(hungry,))
    profile = Profile("t", 1, (1,), "x", 10**9, 1e6, 1e6, 0, 100, (stage, stage))
    assert stage_memory(profile, 0, 0).bwd_workspace == hungry.bwd_workspace
    assert stage_memory(profile, 0, hungry).fwd_workspace == hungry.fwd_workspace
    default_peak = peak_memory(profile)
    schedule = Schedule("fast", 10**9, training_ops(2), algorithms=(0, 0))
    run = simulate(schedule, profile)
    assert run.feasible and run.peak_bytes > default_peak
    assert validate(schedule, profile, run.peak_bytes) == []
    assert validate(schedule, profile, run.peak_bytes - 1)
    assert not simulate(schedule, profile, budget=default_peak).feasible
