"""vDNN's choices and schedules against papers/001 section 3: offload sets, Figure 6, per-layer sync, algorithms."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bounds import peak_memory
from harness.errors import InfeasibleBudget
from harness.model import Profile, Stage
from harness.simulate.executor import simulate
from harness.testing import chains, stages
from harness.validate import validate
from membudget_vdnn import (
    StaticVdnn, algorithm_choice, downgrade_path, memory_optimal, offload_set, performance_optimal, prefetch_plan,
    unconstrained_peak, vdnn_schedule,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


def chain(kinds: str, *, fwd: float = 1e-3, saved: int = 1000, bandwidth: float = 1e6,
          times: dict[int, float] | None = None) -> Profile:
    """A chain with one stage per letter (c conv, a act, p pool, l linear); ``times`` overrides forward times."""
    kind = {"c": "conv", "a": "act", "p": "pool", "l": "linear"}
    times = times or {}
    stages_ = tuple(
        Stage(f"{kind[k]}{i}", kind[k], times.get(i, fwd), 2 * times.get(i, fwd), saved, saved, saved)
        for i, k in enumerate(kinds)
    )
    return Profile("toy", 1, (1,), "toy", 10**9, bandwidth, bandwidth, 0, saved, stages_)


@st.composite
def chains_with_offload(draw, **kwargs) -> tuple[Profile, tuple[int, ...]]:
    profile = draw(chains(**kwargs))
    candidates = [i for i, s in enumerate(profile.stages) if s.saved_bytes > 0]
    chosen = draw(st.sets(st.sampled_from(candidates))) if candidates else set()
    return profile, tuple(sorted(chosen))


def test_offload_sets_are_every_layer_or_every_conv_layer_with_data() -> None:
    """papers/001 section 3.4, Static vDNN: vDNN_all offloads all Xs, vDNN_conv only CONV layers'."""
    profile = chain("capcal")
    assert offload_set(profile, "all") == (0, 1, 2, 3, 4, 5)
    assert offload_set(profile, "conv") == (0, 3)
    assert offload_set(profile, "none") == ()
    empty = Profile("toy", 1, (1,), "toy", 10**9, 1e6, 1e6, 0, 0,
                    (Stage("c", "conv", 1e-3, 1e-3, 0, 0, 0), Stage("c1", "conv", 1e-3, 1e-3, 10, 10, 10)))
    assert offload_set(empty, "all") == (1,), "a stage with nothing saved has nothing to offload"
    with pytest.raises(ValueError, match="unknown offload policy"):
        offload_set(profile, "half")


def test_figure_6_searches_back_only_to_the_previous_conv_layer() -> None:
    """papers/001 Figure 6 on CONV-ACT-POOL-CONV-ACT-CONV-ACT with vDNN_conv.

    The backward start (layer 7) finds conv5 past act6; B6 stops at conv5 (already
    prefetched); B5 finds conv3 past act4; B4 stops at conv3; B3 walks past pool2 and act1
    to conv0.
    """
    profile = chain("capcaca")
    assert prefetch_plan(profile, offload_set(profile, "conv")) == [(5, 7), (3, 5), (0, 3)]
    # vDNN_all: every layer prefetches the one just below it
    assert prefetch_plan(profile, offload_set(profile, "all")) == [(i, i + 1) for i in reversed(range(7))]


@SETTINGS
@given(case=chains_with_offload())
def test_prefetch_plan_follows_figure_6(case) -> None:
    """Every offloaded layer is prefetched once, by a later layer, at most one per layer (Figure 6)."""
    profile, offloaded = case
    plan = prefetch_plan(profile, offloaded)
    issuer = {stage: layer for stage, layer in plan}
    assert sorted(issuer) == list(offloaded), "every offloaded layer is prefetched exactly once"
    assert len({layer for _, layer in plan}) == len(plan), "one prefetch per layer"
    for stage, layer in plan:
        assert stage < layer <= profile.n_stages
        between = range(stage + 1, layer)
        assert not any(profile.stages[j].kind == "conv" for j in between), "the search stops at a CONV layer"
        # a closer offloaded layer was prefetched earlier in the backward pass, by a later layer
        assert all(issuer[j] > layer for j in between if j in issuer)


@SETTINGS
@given(case=chains_with_offload())
def test_sync_makes_the_next_layer_wait_for_every_transfer(case) -> None:
    """papers/001 section 3.3: the operation after each transfer's issuing layer waits for it; vDNN++ has no waits."""
    profile, offloaded = case
    sync = vdnn_schedule(profile, 10**12, offloaded, sync=True)
    free = vdnn_schedule(profile, 10**12, offloaded, sync=False)
    assert [t.wait_op for t in sync.transfers] == [t.issue_op + 1 for t in sync.transfers]
    assert all(t.wait_op is None for t in free.transfers)
    strip = [(t.stage, t.direction, t.issue_op, t.issue_at) for t in sync.transfers]
    assert strip == [(t.stage, t.direction, t.issue_op, t.issue_at) for t in free.transfers]
    assert sync.offloaded_stages == offloaded
    for schedule in (sync, free):
        assert not validate(schedule, profile, 10**12)


def test_sync_charges_the_stall_of_a_fast_pooling_layer() -> None:
    """papers/001 section 4.1: a POOL layer computes much faster than its input transfers, so vDNN stalls.

    conv-pool-conv, 1 KB saved per layer at 1 MB/s (1 ms per copy), the pool taking 0.01 ms:
    F2 may only start once the pool's input is on the host, 1 ms after F1 started.
    """
    profile = chain("cpc", times={1: 1e-5})
    schedule = vdnn_schedule(profile, 10**12, offload_set(profile, "all"), sync=True)
    run = simulate(schedule, profile)
    events = {e.label: e for e in run.timeline}
    assert events["F2"].start >= events["offload 1"].end - 1e-12
    assert events["offload 1"].end - events["offload 1"].start == pytest.approx(1e-3)
    assert events["F2"].start - events["F1"].end >= 1e-3 - 1e-5 - 1e-12, "the stall is charged"
    for event in run.timeline:
        if event.label.startswith("prefetch"):
            stage = int(event.label.split()[1])
            assert events[f"B{stage}"].start >= event.end - 1e-12


@SETTINGS
@given(stage=stages())
def test_memory_and_performance_optimal_algorithms(stage: Stage) -> None:
    """papers/001 section 3.4: memory-optimal = least workspace, performance-optimal = fastest."""
    options = [(-1, stage.algorithm(-1)), *enumerate(stage.algorithms)]
    m = stage.algorithm(memory_optimal(stage))
    p = stage.algorithm(performance_optimal(stage))
    assert all(max(m.fwd_workspace, m.bwd_workspace) <= max(a.fwd_workspace, a.bwd_workspace) for _, a in options)
    assert all(p.fwd_time + p.bwd_time <= a.fwd_time + a.bwd_time for _, a in options)
    path = [stage.algorithm(i) for i in downgrade_path(stage)]
    assert downgrade_path(stage)[0] == performance_optimal(stage)
    assert downgrade_path(stage)[-1] == memory_optimal(stage)
    for faster, slower in zip(path, path[1:]):
        assert faster.fwd_time + faster.bwd_time <= slower.fwd_time + slower.bwd_time
        assert max(slower.fwd_workspace, slower.bwd_workspace) <= max(faster.fwd_workspace, faster.bwd_workspace)


@SETTINGS
@given(profile=chains(), mode=st.sampled_from(["default", "memory", "performance"]))
def test_algorithm_choice_is_a_valid_schedule_field(profile: Profile, mode: str) -> None:
    algorithms = algorithm_choice(profile, mode)
    assert algorithms == () or len(algorithms) == profile.n_stages
    schedule = vdnn_schedule(profile, 10**12, offload_set(profile, "all"), algorithms=algorithms)
    assert not validate(schedule, profile, 10**12)


def test_static_planner_needs_its_own_peak_and_says_so() -> None:
    """vDNN allocates from a pool the size of the device: it fits iff its unconstrained peak does."""
    profile = chain("capcaca", saved=10_000)
    planner = StaticVdnn("all", name="vdnn-all", description="test")
    need = unconstrained_peak(vdnn_schedule(profile, 0, offload_set(profile, "all")), profile)
    assert need < peak_memory(profile)
    schedule = planner.plan(profile, need, always=True)
    assert schedule.offloaded_stages == offload_set(profile, "all")
    assert simulate(schedule, profile).peak_bytes == need
    with pytest.raises(InfeasibleBudget, match="needs at least") as caught:
        planner.plan(profile, need - 1)
    assert caught.value.needed_bytes == need
    # a budget the whole iteration fits gets the plain iteration unless the policy is forced
    assert planner.plan(profile, peak_memory(profile)).transfers == ()
    assert planner.plan(profile, peak_memory(profile), always=True).offloaded_stages == offload_set(profile, "all")


def test_a_refusal_never_asks_for_more_than_the_budget_it_runs_at() -> None:
    """With performance-optimal algorithms of large workspace (PyTorch's native CPU convolution),
    vDNN_all's offloading configuration can need more than the plain iteration's peak, where the planner
    runs keep-all: the refusal's needed_bytes is then the peak, and planning at it succeeds (a QA run
    was refused at 50% with 163536 B needed, then ran at its 89808 B peak)."""
    import dataclasses

    from harness.model import Algorithm

    base = chain("cacacl", saved=10_000)
    fast = Algorithm("fast", 0.5e-3, 1e-3, fwd_workspace=200_000, bwd_workspace=200_000)
    profile = dataclasses.replace(base, stages=tuple(
        dataclasses.replace(s, algorithms=(fast,)) if s.kind == "conv" else s for s in base.stages))
    planner = StaticVdnn("all", name="vdnn-all", description="test")
    peak = peak_memory(profile)
    with pytest.raises(InfeasibleBudget) as caught:
        planner.plan(profile, peak - 1)
    assert caught.value.needed_bytes == peak and "or the keep-all peak" in str(caught.value)
    assert planner.plan(profile, caught.value.needed_bytes).transfers == ()
    with pytest.raises(InfeasibleBudget) as forced:  # always=True never runs keep-all: its own need
        planner.plan(profile, peak, always=True)
    assert forced.value.needed_bytes > peak
