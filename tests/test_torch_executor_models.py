"""The torch executor on models unlike torchvision's image classifiers: token ids in, a tuple out,
batch norms recomputed (found by a QA pass that brought its own models)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from harness import hookimpl  # noqa: E402
from harness.bounds import min_memory, peak_memory  # noqa: E402
from harness.executors._torch_chain import build_chain  # noqa: E402
from harness.executors.torch_executor import TorchExecutor  # noqa: E402
from harness.models.build import image_batch, on_device, prepare  # noqa: E402
from harness.plugins import registry  # noqa: E402
from harness.protocols import Workload  # noqa: E402
from tests.torch_cases import one_thread  # noqa: E402,F401 (an autouse fixture)


class _Logits(torch.nn.Module):
    """A small MLP that returns its logits in a 1-tuple, as many research models do."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 32), torch.nn.ReLU(),
                                        torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.body(x),)


class _Factory:
    """The factory of one test model, ``test:<model>``, an image classifier built from ``module``."""

    def __init__(self, model: str, module: type, description: str) -> None:
        self.model, self.module = model, module
        self.name, self.description = f"test-{model}", description

    def names(self) -> list[str]:
        return [f"test:{self.model}"]

    def build(self, workload: Workload, device="cpu"):
        model = prepare(on_device(self.module, device), device, workload.dtype)
        return model, image_batch(workload.batch_size, tuple(workload.input_size), device, workload.dtype)


def _register(factory: _Factory) -> None:
    """Register ``factory`` the way a plugin's is."""
    class Plugin:
        @staticmethod
        @hookimpl
        def membudget_register_models(register):
            register(factory)

    registry().add_plugin(Plugin(), f"membudget-{factory.name}", "0.0")


def _halfway(profile) -> int:
    return (min_memory(profile) + peak_memory(profile)) // 2


def _run(model: str, size: tuple[int, ...], planner: str, budget_of=peak_memory, iterations: int = 1):
    """The chain of ``model`` on the CPU after ``iterations`` of ``planner``'s schedule at ``budget_of(profile)``."""
    workload = Workload(model, 2, size, "cpu")
    profile = registry().profiler("analytic").profile(Workload(model, 2, size, "V100-PCIe"))
    schedule = registry().planner(planner).plan(profile, budget_of(profile))
    torch.manual_seed(0)  # the same weights and batch on every call: a test compares two chains' buffers
    chain = build_chain(workload, "cpu")
    run = TorchExecutor(warmup=0, iterations=iterations).execute(schedule, profile, chain)
    return chain, schedule, run


@pytest.mark.parametrize("planner", ["keep-all", "recompute"])
def test_a_model_fed_token_ids_trains_with_the_plain_gradients(planner):
    """tiny-gpt2 takes int64 token ids and returns float logits: the output gradient has the output's
    dtype (it had the input's, and every torch row of a token model was an error)."""
    pytest.importorskip("transformers")
    _, schedule, run = _run("transformers:tiny-gpt2", (16,), planner, peak_memory if planner == "keep-all" else _halfway)
    assert run.status == "ok", run.message
    assert planner == "keep-all" or any(op.kind == "R" for op in schedule.ops)
    assert run.metrics["grad_error"] < 1e-4


def _three_tenths(profile) -> int:
    return min_memory(profile) + 3 * (peak_memory(profile) - min_memory(profile)) // 10


@pytest.mark.parametrize("planner", ["recompute", "torch-checkpoint"])
def test_a_stage_run_without_saving_reads_the_attention_mask_that_crosses_its_cut(planner):
    """GPT-2's attention mask does not depend on the input, so it crosses the cuts beside the one
    activation; Fc, Fn and R must hand it to the stage (they carried only plain Python values, and
    every recomputing row of a transformers model stopped with "needs ..., which is not live")."""
    pytest.importorskip("transformers")
    _, schedule, run = _run("transformers:tiny-gpt2", (16,), planner, _three_tenths)
    assert run.status == "ok", run.message
    assert any(op.kind in ("Fc", "Fn") and op.stage > 0 for op in schedule.ops)
    assert run.metrics["grad_error"] < 1e-4


def test_a_model_that_returns_a_one_tuple_is_checked_against_its_logits():
    """The chain reads the one tensor inside ``(logits,)``; so does the gradient check."""
    _register(_Factory("tuple-out", _Logits, "a model that returns (logits,)"))
    _, _, run = _run("test:tuple-out", (3, 4, 4), "keep-all")
    assert run.status == "ok", run.message
    assert run.metrics["grad_error"] == 0.0


def test_recomputation_updates_the_running_statistics_once_per_forward():
    """A batch norm's running mean, variance and counter after three iterations are the plain model's
    when its stage is recomputed: R leaves the buffers as F left them (PyTorch's checkpoint updates
    them twice; the gradient check cannot see that)."""
    plain, _, _ = _run("builtin:tiny-cnn", (3, 16, 16), "keep-all", iterations=3)
    chain, schedule, run = _run("builtin:tiny-cnn", (3, 16, 16), "recompute", _halfway, iterations=3)
    assert run.status == "ok", run.message
    recomputed = {op.stage for op in schedule.ops if op.kind == "R"}
    assert any(chain.stage_buffers(s) for s in recomputed), "no stage with a batch norm is recomputed"
    expected = dict(plain.model.named_buffers())
    assert int(expected["bn1.num_batches_tracked"]) == 3 + 1  # and the gradient check's plain forward
    for name, buffer in chain.model.named_buffers():
        torch.testing.assert_close(buffer, expected[name], msg=lambda m, name=name: f"{name}: {m}")


class _TwoDropouts(torch.nn.Module):
    """Three linear layers with a dropout after each of the first two (a transformer has one in every block)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.drop_a = torch.nn.Linear(48, 32), torch.nn.Dropout(0.5)
        self.b, self.drop_b = torch.nn.Linear(32, 32), torch.nn.Dropout(0.5)
        self.c = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.drop_b(self.b(self.drop_a(self.a(x.flatten(1))))))


def test_a_recomputed_dropout_draws_the_mask_of_its_first_run_and_leaves_the_later_draws_alone():
    """R runs its stage with the random state the stage's first run had and then puts back the state it found
    (``ChainPass.recompute``, as ``torch.utils.checkpoint`` does): the recomputed dropout drops what its forward
    dropped, and the next sub-batch's dropouts draw what the plain model's do, so the gradients are the plain
    model's, computed by the check from the same seed. Without the restore the error was 0.95; without putting the
    state back (the next sub-batch's first dropout then drew the second one's mask again), 1.37; with a reference
    drawn from whatever state the iterations left, 1.58."""
    from harness.schedules import ordered_schedule

    _register(_Factory("two-dropouts", _TwoDropouts, "two dropouts"))
    workload = Workload("test:two-dropouts", 4, (3, 4, 4), "cpu")
    profile = registry().profiler("analytic").profile(Workload("test:two-dropouts", 4, (3, 4, 4), "V100-PCIe"))
    first = [s.name for s in profile.stages].index("drop_a")
    schedule = ordered_schedule(profile, peak_memory(profile), {}, planner="hand", sub_batches=2,
                                recompute=[(first, first + 1)])
    assert [op.stage for op in schedule.ops if op.kind == "R"] == [first, first]  # once a sub-batch
    torch.manual_seed(0)
    run = TorchExecutor(warmup=0, iterations=2).execute(schedule, profile, build_chain(workload, "cpu"))
    assert run.status == "ok", run.message
    assert run.metrics["grad_error"] == 0.0


class _SharedShift(torch.nn.Module):
    """Computes one tensor from a parameter before its layers and adds it after two of them: the tensor
    does not depend on the input, but the parameter's gradient flows through it."""

    def __init__(self) -> None:
        super().__init__()
        self.shift = torch.nn.Parameter(torch.randn(32))
        self.a, self.b, self.c = (torch.nn.Linear(48 if k == 0 else 32, 32) for k in range(3))
        self.d = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shift = torch.tanh(self.shift) * 2.0
        x = torch.relu(self.a(x.flatten(1)))
        x = torch.relu(self.b(x) + shift)
        x = torch.relu(self.c(x))
        return self.d(x + shift)


@pytest.mark.parametrize("planner", ["keep-all", "recompute", "torch-checkpoint"])
def test_a_tensor_computed_from_a_parameter_never_crosses_a_cut(planner):
    """A tensor made from a parameter alone is not a constant of the workload: Fn and Fc would compute
    it without its graph (the parameter's gradient lost), and F would run its backward once per stage
    that reads it. The cut keeps it inside one stage, so every schedule trains the plain network."""
    _register(_Factory("shared-shift", _SharedShift, "a model that reuses a tensor computed from a parameter"))
    chain, schedule, run = _run("test:shared-shift", (3, 4, 4), planner, _three_tenths)
    assert run.status == "ok", run.message
    assert run.metrics["grad_error"] < 1e-5
    assert chain.n_stages >= 2  # the layers around the shared tensor still form a chain


class _PositionGate(torch.nn.Module):
    """Scales a hidden layer by a gate an MLP computes from fixed coordinates, as Swin-V2's continuous
    position bias does: the gate depends on parameters alone, and the product saves it for its backward."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("coords", torch.randn(64, 4))
        self.gate_mlp = torch.nn.Linear(4, 1)
        self.a, self.b, self.c = torch.nn.Linear(48, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 10)

    def gate(self) -> torch.Tensor:
        return torch.sigmoid(self.gate_mlp(self.coords)).flatten()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.a(x.flatten(1)))
        x = torch.relu(self.b(x) * self.gate())
        return self.c(x)


class _FrozenGate(_PositionGate):
    """The gate's MLP frozen: a constant of the workload, which the profile counts with the weights."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_mlp.requires_grad_(False)


class _InPlaceGate(_PositionGate):
    """A frozen MLP's output shifted in place by a trainable parameter: the write makes it the parameter's."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_mlp = torch.nn.Linear(4, 64).requires_grad_(False)
        self.shift = torch.nn.Parameter(torch.randn(64))

    def gate(self) -> torch.Tensor:
        gate = self.gate_mlp(self.coords[:1]).flatten()
        gate.add_(self.shift)
        return gate


@pytest.mark.parametrize("module", [_PositionGate, _FrozenGate, _InPlaceGate], ids=["trained", "frozen", "in-place"])
def test_the_executor_moves_what_the_profile_says_a_stage_saves_of_a_tensor_the_input_does_not_reach(module):
    """A gate made from a trained parameter (alone, or written in place into a frozen layer's output) is made
    anew by every forward of its stage and saved by the product: that stage's saved data, which the executor
    offloads with the rest. The profile counted it once with the weights, as if it were a causal mask, so
    the simulator moved fewer bytes than the executor (4352 against 3840 for the trained gate). A gate made
    from frozen weights alone is such a constant: the executor moved it all the same (2816 against 3328)."""
    name = f"gate-{module.__name__.lower()}"
    _register(_Factory(name, module, "a model that saves a tensor the input does not reach"))
    run, simulated = _offload_everything(f"test:{name}", (3, 4, 4))
    assert run.status == "ok", run.message
    assert run.metrics["grad_error"] < 1e-5
    assert run.moved_bytes == simulated.moved_bytes > 0


def test_the_executor_counts_a_gradient_only_for_the_weights_that_train():
    """The weights the executor counts while no gradient exists yet (``TorchChain.trained_weight_bytes``,
    its memory in use past the last operation) are the profiler's: every parameter, a gradient for those that
    train, the buffers. The frozen gate's MLP has no gradient. (A QA mutant that gave every parameter a
    gradient passed every test.)"""
    from harness.profilers.instrument import record_chain

    _register(_Factory("gate-frozen-weights", _FrozenGate, "a model with a frozen layer"))
    torch.manual_seed(0)
    chain = build_chain(Workload("test:gate-frozen-weights", 2, (3, 4, 4), "cpu"), "cpu")
    record = record_chain(chain.graph, chain.plan, chain.example)
    assert 0 < record.grad_param_bytes < record.param_bytes
    assert chain.trained_weight_bytes() == record.param_bytes + record.grad_param_bytes + record.buffer_bytes


def _offload_everything(model: str, size: tuple[int, ...]):
    """The torch executor's run (on the CPU) and the simulator's of ``model`` with every stage offloaded."""
    from harness.schedules import ordered_schedule
    from harness.simulate.executor import simulate

    workload = Workload(model, 2, size, "cpu")
    profile = registry().profiler("analytic").profile(Workload(model, 2, size, "V100-PCIe"))
    schedule = ordered_schedule(profile, 10**12, set(range(profile.n_stages)), planner="all")
    torch.manual_seed(0)
    run = TorchExecutor(warmup=0, iterations=1).execute(schedule, profile, build_chain(workload, "cpu"))
    return run, simulate(schedule, profile, budget=float("inf"))


def test_offloading_every_stage_of_a_transformer_leaves_its_constants_on_the_device():
    """GPT-2's position ids cross every cut, and its embedding saves them. The executor packed them with
    that stage, and its offload freed the memory the later stages read them from: the second forward
    stopped with "setStorage: ... out of bounds for storage of size 0"."""
    pytest.importorskip("transformers")
    run, simulated = _offload_everything("transformers:tiny-gpt2", (16,))
    assert run.status == "ok", run.message
    assert run.metrics["grad_error"] < 1e-4
    assert run.moved_bytes == simulated.moved_bytes > 0


class _InPlaceShift(_SharedShift):
    """``_SharedShift`` with its shift made in place: a frozen layer's output, then ``add_`` of the parameter.
    Its later readers read the frozen layer's node, which the parameter reaches only through the write."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = torch.nn.Linear(4, 32).requires_grad_(False)
        self.register_buffer("coords", torch.randn(1, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shift = self.frozen(self.coords).flatten()
        shift.add_(self.shift)
        return self.forward_with(x, shift)

    def forward_with(self, x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.a(x.flatten(1)))
        x = torch.relu(self.b(x) + shift)
        x = torch.relu(self.c(x))
        return self.d(x + shift)


class _ShiftThroughTranspose(_InPlaceShift):
    """The write goes through ``.mT``, which fx traces as ``getattr``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shift = self.frozen(self.coords)
        shift.mT.add_(self.shift[:, None])
        return self.forward_with(x, shift.flatten())


@pytest.mark.parametrize("module", [_InPlaceShift, _ShiftThroughTranspose], ids=["add_", "mT.add_"])
@pytest.mark.parametrize("planner", ["keep-all", "recompute"])
def test_a_tensor_a_parameter_writes_into_never_crosses_a_cut(planner, module):
    """The cut let the shift cross (a frozen layer's output looks constant): the profiler stopped with
    "backward through the graph a second time" and a recomputed stage lost the parameter's gradient."""
    name = f"inplace-{module.__name__.lower()}"
    _register(_Factory(name, module, "a model that writes a parameter into a frozen output"))
    chain, _, run = _run(f"test:{name}", (3, 4, 4), planner, peak_memory)
    assert run.status == "ok", run.message
    assert run.metrics["grad_error"] < 1e-5


def test_a_side_value_leaves_the_sub_batch_after_its_last_reader_whatever_the_forward(monkeypatch):
    """GPT-2's side values (the attention mask, the position ids) are carried from stage to stage until the
    last stage that reads them: after the forward of each stage the sub-batch holds the same side values
    whether the stage saved (F, keep-all) or not (Fc, Fn, torch-checkpoint). (A QA mutant whose Fc and Fn
    kept every side value to the end of the iteration passed every test.)"""
    pytest.importorskip("transformers")
    from harness.executors._torch_chain import ChainPass

    model, size = "transformers:tiny-gpt2", (16,)
    profile = registry().profiler("analytic").profile(Workload(model, 2, size, "V100-PCIe"))
    torch.manual_seed(0)
    chain = build_chain(Workload(model, 2, size, "cpu"), "cpu")
    seen: dict[int, tuple[str, list[int]]] = {}  # stage: (its forward's kind, the sub-batch's values after it)
    forward = ChainPass.forward

    def spy(self, stage, sb, kind="F"):
        forward(self, stage, sb, kind)
        seen[stage] = (kind, sorted(self.state[sb].env))

    monkeypatch.setattr(ChainPass, "forward", spy)
    carried = {}
    for planner, budget in (("keep-all", peak_memory(profile)), ("torch-checkpoint", 10**12)):
        seen.clear()
        schedule = registry().planner(planner).plan(profile, budget)
        run = TorchExecutor(warmup=0, iterations=1, grad_check=False).execute(schedule, profile, chain)
        assert run.status == "ok", run.message
        carried[planner] = dict(seen)
    plain, checkpointed = carried["keep-all"], carried["torch-checkpoint"]
    assert {kind for kind, _ in checkpointed.values()} >= {"Fc", "Fn"}
    assert any(values for _, values in plain.values())  # side values do cross some cuts
    assert {s: v for s, (_, v) in checkpointed.items()} == {s: v for s, (_, v) in plain.items()}
