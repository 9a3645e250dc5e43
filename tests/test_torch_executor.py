"""The torch executor computes the gradients of the unmodified model, whatever the schedule.

For every installed planner and three torchvision models on the CPU (host memory
standing in for device memory), the schedule planned for a tight budget is executed
stage by stage with its offloads, prefetches, sub-batches, algorithms or recomputed
segments, and every parameter gradient must equal the one PyTorch computes for the
plain model (``torch.testing.assert_close``).
"""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from harness.bounds import min_memory, peak_memory  # noqa: E402
from harness.errors import InfeasibleBudget  # noqa: E402
from harness.executors._torch_chain import TorchChain  # noqa: E402
from harness.executors.torch_executor import TorchExecutor  # noqa: E402
from harness.model import Algorithm, Profile, Schedule  # noqa: E402
from harness.plugins import registry  # noqa: E402
from harness.schedules import ordered_schedule  # noqa: E402

MODELS = ("torchvision:resnet18", "torchvision:mobilenet_v2", "torchvision:densenet121")
PLANNERS = registry().names("planner")
# conv-only offloading cannot go below ResNet-18's peak: its one conv stage is the stem (the others
# are blocks), so the peak is all these planners take there (on the other two models they offload)
PEAK_ONLY = {("torchvision:resnet18", "vdnn-conv"), ("torchvision:resnet18", "vdnnpp-conv")}


from harness.executors.grad_check import reference_gradients  # noqa: E402
from tests.torch_cases import one_thread, setup  # noqa: E402,F401 (one_thread: an autouse fixture)


@functools.cache
def cached_reference(model: str, sub_batches: int) -> dict[str, torch.Tensor]:
    return reference_gradients(setup(model)[0], sub_batches)


def assert_gradients_equal(chain: TorchChain, expected: dict[str, torch.Tensor], scaled_tol: float | None = None) -> None:
    """Every parameter gradient of ``chain.model`` equals ``expected`` (assert_close's float32 defaults).

    ``scaled_tol``: compare within that fraction of each gradient's largest magnitude
    instead (for results of a different convolution algorithm, whose rounding differs).
    """
    got = {n: p.grad for n, p in chain.model.named_parameters() if p.grad is not None}
    assert set(got) == set(expected), f"gradients missing for {sorted(set(expected) - set(got))[:5]}"
    for name, grad in expected.items():
        tolerance = {} if scaled_tol is None else {"rtol": 0.0, "atol": scaled_tol * float(grad.abs().max())}
        torch.testing.assert_close(got[name], grad, msg=lambda m, name=name: f"{name}: {m}", **tolerance)


def plan_tight(profile: Profile, planner: str) -> Schedule:
    """The planner's schedule at the first budget it takes of a third and two thirds of the way from the
    minimum to the peak, and a byte below the peak (a schedule that changes something), else at the peak."""
    lo, hi = min_memory(profile), peak_memory(profile)
    reasons = []
    for budget in (lo + (hi - lo) // 3, lo + 2 * (hi - lo) // 3, hi - 1, hi):
        try:
            return registry().planner(planner).plan(profile, budget)
        except InfeasibleBudget as exc:
            reasons.append(str(exc))
    pytest.skip(f"{planner} plans for no budget: {' / '.join(reasons)}")


def changes_something(schedule: Schedule) -> bool:
    """The schedule moves, recomputes, splits the batch or takes another algorithm: not the plain iteration."""
    return bool(schedule.transfers or any(op.kind == "R" for op in schedule.ops) or schedule.sub_batches > 1
                or any(a >= 0 for a in schedule.algorithms))  # -1: the stage's default algorithm


def test_the_chain_shares_the_model_parameters():
    chain, _ = setup(MODELS[0])
    assert {id(p) for p in chain.graph.gm.parameters()} <= {id(p) for p in chain.model.parameters()}


@pytest.mark.parametrize("planner", PLANNERS)
@pytest.mark.parametrize("model", MODELS)
def test_every_planner_gives_the_plain_gradients(model: str, planner: str):
    chain, profile = setup(model)
    schedule = plan_tight(profile, planner)
    if (model, planner) in PEAK_ONLY:  # said, and checked, rather than a gradient check that says nothing of them
        assert not changes_something(schedule) and schedule.budget_bytes == peak_memory(profile)
    elif planner != "keep-all":  # else the gradient check would say nothing of the planner (a test audit)
        assert changes_something(schedule), f"{planner} planned the plain iteration below the peak"
    expected = cached_reference(model, schedule.sub_batches)
    run = TorchExecutor(warmup=0, iterations=1).execute(schedule, profile, chain)
    assert run.status == "ok", run.message
    if schedule.transfers:
        assert run.moved_bytes > 0, "a schedule with transfers moved nothing"
    assert_gradients_equal(chain, expected)


def test_the_tight_budget_makes_planners_move_data():
    """The budget of the test above really forces offloading (else it would prove little)."""
    _, profile = setup(MODELS[0])
    moving = [name for name in ("greedy", "torch-save-on-cpu") if plan_tight(profile, name).transfers]
    assert moving == ["greedy", "torch-save-on-cpu"]
    assert any(op.kind == "R" for op in plan_tight(profile, "torch-checkpoint").ops)


def test_sub_batches_accumulate_the_gradients():
    chain, profile = setup(MODELS[0])
    half = {i: s.saved_bytes // 2 for i, s in enumerate(profile.at_batch(1).stages) if i % 3 == 0}
    schedule = ordered_schedule(profile, 10**12, half, planner="probe", sub_batches=2, prefetch_window=1)
    accumulated, full = cached_reference(MODELS[0], 2), cached_reference(MODELS[0], 1)
    executor = TorchExecutor(warmup=0, iterations=1, record=True)
    run = executor.execute(schedule, profile, chain)
    assert run.status == "ok", run.message
    assert {sb for sb, _ in executor.last_record.group_bytes} == {0, 1}
    assert_gradients_equal(chain, accumulated)
    with pytest.raises(AssertionError):  # accumulation over two halves is not the full-batch gradient (BN)
        assert_gradients_equal(chain, full)


@pytest.mark.parametrize("sub_batches", [1, 2])
def test_offloading_and_recomputing_together_give_the_plain_gradients(sub_batches: int):
    """Two checkpointed segments (Fc, Fn, R) and offloaded stages after them, in one schedule."""
    from harness.validate import validate

    chain, profile = setup(MODELS[0])
    n = profile.n_stages
    segments = [(0, 2), (2, n // 2)]
    offload = {i for i in range(n // 2, n - 1) if profile.stages[i].saved_bytes > 0}
    schedule = ordered_schedule(profile, 10**12, offload, planner="both", recompute=segments,
                                sub_batches=sub_batches, prefetch_window=1)
    assert schedule.offloaded_stages and schedule.recomputed_stages == tuple(range(n // 2))
    assert not validate(schedule, profile)
    expected = cached_reference(MODELS[0], sub_batches)  # before the run: it leaves the model's gradients empty
    run = TorchExecutor(warmup=0, iterations=1).execute(schedule, profile, chain)
    assert run.status == "ok", run.message
    assert run.moved_bytes > 0
    assert_gradients_equal(chain, expected)


@pytest.mark.parametrize("sub_batches", [1, 2])
def test_offloaded_checkpoints_give_the_plain_gradients(sub_batches: int):
    """The checkpoints x_0 and x_2 of two recomputed segments go to the host after Fc_i and come
    back before R_i (a real copy through the store, host memory standing in for the device), and
    the gradients are the unmodified model's."""
    from harness.executors._torch_copies import CpuCopies
    from harness.executors._torch_store import SavedStore
    from harness.validate import validate

    chain, profile = setup(MODELS[0])
    n = profile.n_stages
    segments = [(0, 2), (2, n // 2)]
    offload = {0, 2} | {i for i in range(n // 2, n - 1) if profile.stages[i].saved_bytes > 0}
    schedule = ordered_schedule(profile, 10**12, offload, planner="both", recompute=segments,
                                sub_batches=sub_batches, prefetch_window=1)
    assert {0, 2} <= set(schedule.offloaded_stages) and not validate(schedule, profile)
    expected = cached_reference(MODELS[0], sub_batches)
    kept: list[tuple[int, int]] = []
    copies: list[tuple[str, int]] = []
    keep, offload, prefetch = SavedStore.keep, CpuCopies.offload, CpuCopies.prefetch

    def spy_keep(self, sub_batch, stage, t):
        kept.append((sub_batch, stage))
        keep(self, sub_batch, stage, t)

    def spy_offload(self, plan, label):
        copies.append((label, sum(take for _, take in plan)))
        return offload(self, plan, label)

    def spy_prefetch(self, blocks, label):
        copies.append((label, sum(b.moved for b in blocks)))
        return prefetch(self, blocks, label)

    SavedStore.keep, CpuCopies.offload, CpuCopies.prefetch = spy_keep, spy_offload, spy_prefetch
    try:
        run = TorchExecutor(warmup=0, iterations=1).execute(schedule, profile, chain)
    finally:
        SavedStore.keep, CpuCopies.offload, CpuCopies.prefetch = keep, offload, prefetch
    assert run.status == "ok", run.message
    assert sorted(set(kept)) == [(sb, i) for sb in range(sub_batches) for i in (0, 2)]
    moved = dict(copies)  # each checkpoint went and came back whole: x_i's bytes each way
    for i in (0, 2):
        assert moved[f"offload {i}"] > 0 and moved[f"offload {i}"] == moved[f"prefetch {i}"]
    assert_gradients_equal(chain, expected)


def test_save_on_cpu_is_an_option_of_the_executor():
    """PyTorch's own save_on_cpu hooks, chosen by the executor, for any schedule (here a checkpointing one)."""
    chain, profile = setup(MODELS[0])
    schedule = registry().planner("torch-checkpoint").plan(profile, 10**12)
    expected = cached_reference(MODELS[0], 1)
    run = TorchExecutor(warmup=0, iterations=1, save_on_cpu=True).execute(schedule, profile, chain)
    assert run.status == "ok", run.message
    assert run.moved_bytes > 0  # the hooks copied every saved tensor out and back
    assert_gradients_equal(chain, expected)


def test_repeated_iterations_give_the_same_gradients():
    chain, profile = setup(MODELS[0])
    schedule = ordered_schedule(profile, 10**12, set(range(profile.n_stages)), planner="all")
    expected = cached_reference(MODELS[0], 1)
    run = TorchExecutor(warmup=1, iterations=2).execute(schedule, profile, chain)
    assert run.status == "ok" and run.metrics["iterations"] == 2
    assert_gradients_equal(chain, expected)


def test_stage_algorithms_switch_onednn_off_where_the_schedule_says():
    chain, profile = setup(MODELS[0])
    convs = [i for i, s in enumerate(profile.stages) if s.kind in ("conv", "block")]
    stages = tuple(
        s.__class__(**{**s.__dict__, "algorithms": (Algorithm("native", s.fwd_time, s.bwd_time),
                                                    Algorithm("onednn", s.fwd_time, s.bwd_time))})
        if i in convs else s
        for i, s in enumerate(profile.stages)
    )
    alt = profile.__class__(**{**profile.__dict__, "stages": stages})
    native = set(convs[::2])
    algorithms = tuple(0 if i in native else (1 if i in convs else -1) for i in range(alt.n_stages))
    schedule = ordered_schedule(alt, 10**12, set(), planner="algos", algorithms=algorithms)
    stage_of = _stage_of_modules(chain)
    expected = _reference_with_native(chain, {name for name, s in stage_of.items() if s in native})
    seen: dict[str, list[bool]] = {}
    hooks = []
    for name, module in chain.model.named_modules():
        if isinstance(module, torch.nn.Conv2d):
            def pre(mod, args, name=name):
                seen.setdefault(name, []).append(torch.backends.mkldnn.enabled)

            hooks.append(module.register_forward_pre_hook(pre))
    try:
        executor = TorchExecutor(warmup=0, iterations=1, grad_check=False)  # its reference forward would count
        run = executor.execute(schedule, alt, chain)
    finally:
        for h in hooks:
            h.remove()
    assert run.status == "ok", run.message
    assert executor.last_record.algorithms == {i: ("native" if i in native else "onednn") for i in convs}
    for name, flags in seen.items():
        assert flags == [stage_of[name] not in native], name
    assert_gradients_equal(chain, expected, scaled_tol=1e-4)


def _reference_with_native(chain: TorchChain, native: set[str]) -> dict[str, torch.Tensor]:
    """The plain model's gradients with oneDNN off in the forward of the modules named in ``native``.

    Each convolution's backward is the one its forward chose, so this is the same arithmetic as
    the schedule's: the rounding of the two algorithms differs, and a batch norm over few values
    (a batch of 2, 2x2 maps in layer4) magnifies that difference for some weights by 10% or more.
    """
    def off(module, args):
        torch._C._set_mkldnn_enabled(False)

    def on(module, args, output):
        torch._C._set_mkldnn_enabled(True)

    modules = dict(chain.model.named_modules())
    hooks = [h for name in native
             for h in (modules[name].register_forward_pre_hook(off), modules[name].register_forward_hook(on))]
    try:
        return reference_gradients(chain, 1)
    finally:
        for h in hooks:
            h.remove()


def _stage_of_modules(chain: TorchChain) -> dict[str, int]:
    """The stage each conv module's node belongs to."""
    out = {}
    for s, span in enumerate(chain.plan.stages):
        for i in range(span.first, span.last + 1):
            node = chain.graph.nodes[i]
            if node.op == "call_module":
                out[str(node.target)] = s
    return out
