"""vDNN_dyn's profiling passes (papers/001 section 3.4), scripted and on AlexNet-shaped chains."""

from __future__ import annotations

import pytest

from harness.bounds import peak_memory
from harness.errors import InfeasibleBudget
from harness.model import Schedule, training_ops
from harness.simulate.executor import simulate
from harness.validate import validate
from membudget_vdnn import DynamicVdnn, algorithm_choice, downgrade_path, dynamic_plan, memory_optimal, shapes
from membudget_vdnn.schedule import Attempt, synchronous
from membudget_vdnn.policy import offload_set, performance_optimal

PROFILE = shapes.alexnet(128)
CONVS = [i for i, s in enumerate(PROFILE.stages) if s.algorithms]
FASTEST = algorithm_choice(PROFILE, "performance")
SMALLEST = algorithm_choice(PROFILE, "memory")


class Script:
    """A fake trial: records every (policy, algorithms, label) and passes those ``accept`` likes."""

    def __init__(self, accept):
        self.accept = accept
        self.calls: list[tuple[str, tuple[int, ...], str]] = []

    def __call__(self, policy, algorithms, label) -> Attempt:
        self.calls.append((policy, algorithms, label))
        ok = self.accept(policy, algorithms)
        schedule = Schedule(label, 0, training_ops(PROFILE.n_stages), algorithms=algorithms,
                            options={"offload": policy}) if ok else None
        return Attempt(schedule, 123)

    @property
    def labels(self) -> list[str]:
        out: list[str] = []
        for _, _, label in self.calls:
            if not out or out[-1] != label:
                out.append(label)
        return out


def test_pass_1_decides_trainability() -> None:
    script = Script(lambda policy, algorithms: False)
    attempt, trainable = dynamic_plan(PROFILE, script)
    assert not trainable and attempt.needed == 123
    assert script.labels == ["all(m)"], "nothing is tried once vDNN_all with memory-optimal algorithms fails"


def test_pass_2_prefers_no_offloading_with_the_fastest_algorithms() -> None:
    script = Script(lambda policy, algorithms: True)
    attempt, trainable = dynamic_plan(PROFILE, script)
    assert trainable
    assert script.labels == ["all(m)", "base(p)"]
    assert attempt.schedule.options["offload"] == "none" and attempt.schedule.algorithms == FASTEST


@pytest.mark.parametrize("fits, adopted", [("conv", "conv(p)"), ("all", "all(p)")])
def test_pass_2_then_offloads_conv_then_all_with_the_fastest_algorithms(fits: str, adopted: str) -> None:
    script = Script(lambda policy, algorithms: policy == fits or algorithms == SMALLEST)
    attempt, _ = dynamic_plan(PROFILE, script)
    assert script.labels == ["all(m)", "base(p)", "conv(p)", "all(p)"][: 3 if fits == "conv" else 4]
    assert attempt.schedule.options["offload"] == fits
    assert attempt.schedule.algorithms == FASTEST


def test_pass_3_downgrades_layer_by_layer_in_order() -> None:
    """The greedy pass: walking the layers, each keeps the fastest algorithm that still fits.

    The scripted memory fits vDNN_conv as long as at most two CONV layers use a faster
    algorithm than the memory-optimal one: the first two CONV layers get their fastest
    algorithms, the others their memory-optimal ones.
    """
    def accept(policy, algorithms):
        chosen = algorithms or (-1,) * PROFILE.n_stages
        upgraded = sum(chosen[i] != memory_optimal(PROFILE.stages[i]) for i in CONVS)
        return policy == "conv" and upgraded <= 2 or algorithms == SMALLEST

    script = Script(accept)
    attempt, _ = dynamic_plan(PROFILE, script)
    assert script.labels == ["all(m)", "base(p)", "conv(p)", "all(p)", "conv(greedy)"]
    chosen = attempt.schedule.algorithms
    assert [chosen[i] for i in CONVS[:2]] == [performance_optimal(PROFILE.stages[i]) for i in CONVS[:2]]
    assert [chosen[i] for i in CONVS[2:]] == [memory_optimal(PROFILE.stages[i]) for i in CONVS[2:]]


def test_when_only_all_m_fits_the_greedy_passes_end_at_memory_optimal_algorithms() -> None:
    """Pass 3 tries vDNN_conv then vDNN_all; each layer steps down to implicit GEMM when nothing faster fits."""
    script = Script(lambda policy, algorithms: algorithms == SMALLEST and policy == "all")
    attempt, trainable = dynamic_plan(PROFILE, script)
    assert trainable
    assert script.labels == ["all(m)", "base(p)", "conv(p)", "all(p)", "conv(greedy)", "all(greedy)"]
    # the conv pass gave up at the first CONV layer: not even implicit GEMM fits there
    conv_trials = [c for c in script.calls if c[2] == "conv(greedy)"]
    assert len(conv_trials) == len(downgrade_path(PROFILE.stages[CONVS[0]]))
    assert attempt.schedule.options["offload"] == "all" and attempt.schedule.algorithms == SMALLEST


def _peak(policy: str, algorithms: tuple[int, ...]) -> int:
    return synchronous(PROFILE, 10**15, offload_set(PROFILE, policy), algorithms, planner="probe").needed


def test_dynamic_vdnn_on_an_alexnet_shaped_chain_walks_down_the_passes() -> None:
    """Each budget gets the first configuration of the passes that fits (simulated trials)."""
    planner = DynamicVdnn(name="vdnn-dyn", description="test")
    cases = [
        (peak_memory(PROFILE), "base(p)"),
        (_peak("conv", FASTEST), "conv(p)"),
        (_peak("all", FASTEST), "all(p)"),
        (_peak("all", SMALLEST), None),  # only the greedy downgrade or all(m) fit here
    ]
    for budget, expected in cases:
        schedule = planner.plan(PROFILE, budget)
        assert not validate(schedule, PROFILE, budget)
        run = simulate(schedule, PROFILE)
        assert run.feasible and run.peak_bytes <= budget
        if expected:
            assert schedule.options["pass"] == expected, (budget, schedule.options)
        else:
            assert schedule.options["pass"] in ("conv(greedy)", "all(greedy)", "conv(m)", "all(m)")
    with pytest.raises(InfeasibleBudget, match="needs at least") as caught:
        planner.plan(PROFILE, _peak("all", SMALLEST) - 1)
    assert caught.value.needed_bytes == _peak("all", SMALLEST)


def test_the_greedy_pass_is_faster_than_memory_optimal_algorithms_everywhere() -> None:
    """Between the all(m) and all(p) peaks, the greedy downgrade keeps some fast algorithms."""
    low, high = _peak("all", SMALLEST), _peak("all", FASTEST)
    assert low < high
    budget = (low + high) // 2
    schedule = DynamicVdnn(name="vdnn-dyn", description="test").plan(PROFILE, budget)
    slow = synchronous(PROFILE, budget, offload_set(PROFILE, "all"), SMALLEST, planner="probe").schedule
    assert simulate(schedule, PROFILE).makespan < simulate(slow, PROFILE).makespan
