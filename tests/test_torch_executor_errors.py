"""The torch executor refuses what it cannot run, reports running out of memory as a result,
and plugs into the registry and the runner like any executor."""

from __future__ import annotations

import functools
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from harness.bounds import min_memory, peak_memory  # noqa: E402
from harness.errors import MembudgetError  # noqa: E402
from harness.executors._torch_chain import TorchChain, build_chain  # noqa: E402
from harness.executors.torch_executor import (  # noqa: E402
    ScheduleMismatch, TorchExecutor, resolve_device,
)
from harness.model import Profile, Schedule, Stage, Transfer, training_ops  # noqa: E402
from harness.plugins import registry  # noqa: E402
from harness.protocols import Workload  # noqa: E402
from harness.schedules import keep_all_schedule, ordered_schedule  # noqa: E402
from harness.simulate.lowering import lower  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL, BATCH, SIZE = "builtin:tiny-cnn", 4, (3, 16, 16)


@functools.cache
def setup() -> tuple[TorchChain, Profile]:
    chain = build_chain(Workload(MODEL, BATCH, SIZE, "cpu"), "cpu")
    profile = registry().profiler("analytic").profile(Workload(MODEL, BATCH, SIZE, "V100-PCIe"))
    return chain, profile


def _other_chain_profile(n: int) -> Profile:
    stage = Stage("s", "conv", 1e-3, 2e-3, 1000, 1000, 1000)
    return Profile("other", BATCH, SIZE, "synthetic", 10**9, 1e9, 1e9, 100, 100, (stage,) * n)


def test_a_schedule_for_another_chain_is_refused():
    _, profile = setup()
    other = _other_chain_profile(profile.n_stages + 3)
    schedule = registry().planner("keep-all").plan(other, peak_memory(other))
    with pytest.raises(ScheduleMismatch, match=rf"planned for a chain of {profile.n_stages + 3} stages, but the "
                                               rf"profile of {MODEL} at batch {BATCH} has {profile.n_stages}"):
        TorchExecutor().run(schedule, profile)


def test_a_profile_of_another_model_is_refused():
    chain, profile = setup()
    other = _other_chain_profile(profile.n_stages + 1)
    with pytest.raises(ScheduleMismatch, match=rf"has {profile.n_stages + 1} stages but the model cuts into "
                                               rf"{profile.n_stages}"):
        TorchExecutor().execute(keep_all_schedule(other, 10**12), other, chain)


def test_a_schedule_that_never_brings_data_back_is_refused():
    chain, profile = setup()
    schedule = Schedule("broken", 10**12, training_ops(profile.n_stages), (Transfer(1, "offload", 1),))
    with pytest.raises(ScheduleMismatch, match="stage 1 is offloaded but never prefetched"):
        TorchExecutor().execute(schedule, profile, chain)


def test_going_over_the_budget_is_an_oom_run_on_the_cpu():
    chain, profile = setup()
    budget = chain.weight_bytes() + sum(s.saved_bytes for s in profile.stages) // 2
    executor = TorchExecutor(warmup=0, iterations=1, emulate_budget=True)
    run = executor.execute(keep_all_schedule(profile, budget), profile, chain)
    assert run.status == "oom"
    assert f"out of memory under the budget of {budget} bytes" in run.message
    assert math.isnan(run.makespan) and run.peak_bytes > budget


def test_the_emulated_budget_is_exactly_what_is_held():
    chain, profile = setup()
    everything = ordered_schedule(profile, 10**12, set(range(profile.n_stages)), planner="all", prefetch_window=1)
    offloading = TorchExecutor(warmup=0, iterations=1).execute(everything, profile, chain).peak_bytes
    held = TorchExecutor(warmup=0, iterations=1).execute(keep_all_schedule(profile, 10**12), profile, chain).peak_bytes
    assert chain.weight_bytes() < offloading < held  # offloading holds less, measured on the storages
    # keep-all holds the weights and every stage's saved data as the forward ends (and gradients after)
    weights = sum(t.untyped_storage().nbytes() for t in (*chain.model.parameters(), *chain.model.buffers()))
    assert held >= weights + sum(s.saved_bytes for s in profile.stages)
    strict = TorchExecutor(warmup=0, iterations=1, emulate_budget=True)
    assert strict.execute(keep_all_schedule(profile, held), profile, chain).status == "ok"
    assert strict.execute(keep_all_schedule(profile, held - 1), profile, chain).status == "oom"


def test_on_the_cpu_a_prefetch_waits_for_memory_as_on_the_device():
    """QA: a schedule that issues every prefetch at the start of the backward and relies on each
    waiting for memory (the simulator's rule; dynprog's schedules do this) held keep-all's bytes on
    the CPU, twice its budget, reported ``ok``; with ``emulate_budget`` it was out of memory. The
    prefetches now wait, in issue order, until the weights, what is held and their bytes fit."""
    from harness.executors.grad_check import gradient_error

    chain, profile = setup()
    n = profile.n_stages
    recorder = TorchExecutor(warmup=0, iterations=1, record=True)
    keep_all = recorder.execute(keep_all_schedule(profile, 10**12), profile, chain)
    group_bytes = recorder.last_record.group_bytes
    budget = chain.weight_bytes() + 2 * max(group_bytes.values())
    assert keep_all.peak_bytes > budget  # every prefetch at once would not fit
    transfers = (tuple(Transfer(i, "offload", i) for i in range(n - 1))
                 + tuple(Transfer(i, "prefetch", n) for i in reversed(range(n - 1))))
    schedule = Schedule("all-at-the-backward", budget, training_ops(n), transfers)
    run = TorchExecutor(warmup=0, iterations=1, emulate_budget=True).execute(schedule, profile, chain)
    assert run.status == "ok" and chain.weight_bytes() < run.peak_bytes <= budget, run.message
    offloaded = sum(b for (_, stage), b in group_bytes.items() if stage < n - 1)
    assert run.moved_bytes == 2 * offloaded  # each offloaded group went out and came back whole
    assert gradient_error(chain, 1, 0) < 1e-5  # and the backward read it back intact


def test_an_out_of_memory_error_is_an_oom_run_and_leaves_the_executor_usable():
    chain, profile = setup()
    calls = {"n": 0}

    def explode(module, args, output):
        calls["n"] += 1
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")

    handle = chain.model.conv2.register_forward_hook(explode)
    executor = TorchExecutor(warmup=0, iterations=1)
    try:
        run = executor.execute(keep_all_schedule(profile, 10**12), profile, chain)
    finally:
        handle.remove()
    assert calls["n"] == 1 and run.status == "oom"
    assert "Tried to allocate 2.00 GiB (injected)" in run.message
    assert executor.execute(keep_all_schedule(profile, 10**12), profile, chain).status == "ok"


def test_other_errors_are_not_mistaken_for_oom():
    chain, profile = setup()

    def fail(module, args, output):
        raise ValueError("a bug in the model")

    handle = chain.model.conv2.register_forward_hook(fail)
    try:
        with pytest.raises(ValueError, match="a bug in the model"):
            TorchExecutor(warmup=0, iterations=1).execute(keep_all_schedule(profile, 10**12), profile, chain)
    finally:
        handle.remove()


def test_devices_resolve_from_the_workload():
    assert resolve_device(Workload(MODEL, 1, SIZE, "cpu"), None).type == "cpu"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(Workload(MODEL, 1, SIZE, "V100-PCIe"), None).type == expected  # a spec, not a device
    if not torch.cuda.is_available():
        with pytest.raises(MembudgetError, match="no CUDA GPU is available"):
            resolve_device(None, "cuda")


def test_the_registered_executor_imports_torch_only_when_it_runs():
    code = textwrap.dedent("""
        import sys
        import harness.executors as executors
        got = []
        executors.register_builtin(got.append)
        print(sorted(e.name for e in got), "torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['simulate',", "'torch',", "'torch-planned',", "'torch-save-on-cpu']", "False"]
    assert registry().executor("torch").name == "torch"
    assert registry().executor("torch-save-on-cpu").executor().save_on_cpu
    assert registry().executor("torch-planned").executor().name == "torch-planned"


def test_a_suite_runs_the_torch_executor_beside_the_simulator(tmp_path, monkeypatch):
    """On the CPU, also on a CUDA machine: there the real cap makes the chain model's budget an
    oom (the allocator's rounding; tests/test_torch_executor_gpu.py), which is not what this checks."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from harness.results import read_rows_csv
    from harness.runner import run_suite
    from harness.suite import load_suite

    suite = tmp_path / "cpu.yaml"
    suite.write_text(textwrap.dedent(f"""
        name: torch-cpu
        profiler: analytic
        device: V100-PCIe
        models:
          - model: {MODEL}
            batch_sizes: [{BATCH}]
            input_size: {list(SIZE)}
        budgets: {{fractions: [0.0, 1.0]}}
        planners: [keep-all, greedy, torch-save-on-cpu, torch-checkpoint]
        executors: [simulate, torch]
    """))
    outcome = run_suite(load_suite(suite), tmp_path / "results", progress=False)
    rows = read_rows_csv(outcome.run_dir / "rows.csv")
    torch_rows = [r for r in rows if r["executor"] == "torch"]
    assert len(torch_rows) == 8
    for row in torch_rows:  # every torch row that ran says it trained the same network (issue #16)
        if row["status"] == "ok":
            assert row["grad_error"] != "" and float(row["grad_error"]) <= 1e-6, row["case_id"]
        assert all(r["grad_error"] == "" for r in rows if r["executor"] == "simulate")
    by = {(r["planner"], r["budget_label"]): r for r in torch_rows}
    assert by[("keep-all", "f1")]["status"] == "ok" and float(by[("keep-all", "f1")]["makespan_s"]) > 0
    assert by[("keep-all", "f0")]["status"] == "infeasible"
    assert by[("greedy", "f0")]["status"] == "ok" and int(by[("greedy", "f0")]["moved_bytes"]) > 0
    simulated = {(r["planner"], r["budget_label"]): r for r in rows if r["executor"] == "simulate"}
    assert by[("greedy", "f0")]["moved_bytes"] == simulated[("greedy", "f0")]["moved_bytes"]
    # QA: "x ideal 1585" read as a slowdown; it is CPU time over a V100 estimate, and the row says so
    assert all(r["message"].startswith("the profile's times are V100-PCIe's (analytic), not this cpu's")
               for r in torch_rows if r["status"] == "ok")


def test_a_suite_of_profile_files_runs_the_model_each_profile_names(tmp_path, monkeypatch):
    """QA (2026-12-01): with ``profiler: file`` every torch case was an error row, "unknown model
    'prof/cnn_b8.json'": the executor was handed the file's path as the model to build, where
    ``membudget simulate p.json --executor torch`` runs the model the profile names."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from harness.model import save
    from harness.results import read_rows_csv
    from harness.runner import run_suite
    from harness.suite import load_suite

    _, profile = setup()
    save(profile, tmp_path / "measured.json")
    suite = tmp_path / "files.yaml"
    suite.write_text(textwrap.dedent("""
        name: torch-files
        profiler: file
        device: cpu
        models:
          - model: measured.json
            batch_sizes: [2]  # not the file's 4: the file profiler scales it, the executor trains batch 2
        budgets: {fractions: [0.0, 1.0]}
        planners: [keep-all, greedy]
        executors: [simulate, torch]
    """))
    outcome = run_suite(load_suite(suite), tmp_path / "results", progress=False)
    torch_rows = {(r["planner"], r["budget_label"]): r
                  for r in read_rows_csv(outcome.run_dir / "rows.csv") if r["executor"] == "torch"}
    for key in (("keep-all", "f1"), ("greedy", "f0")):
        assert torch_rows[key]["status"] == "ok", torch_rows[key]["message"]
        assert torch_rows[key]["batch_size"] == "2"
        assert float(torch_rows[key]["grad_error"]) <= 1e-6
    assert int(torch_rows[("greedy", "f0")]["moved_bytes"]) > 0


def test_a_profile_measured_on_this_device_needs_no_note_and_any_other_does():
    import dataclasses

    from harness.executors.torch_executor import _timed_elsewhere
    from tests.test_suite_support import chain

    estimate = chain("synthetic:chain4", 2)
    cpu = torch.device("cpu")
    assert _timed_elsewhere(dataclasses.replace(estimate, device="cpu", measured=True), cpu) == ""
    assert _timed_elsewhere(dataclasses.replace(estimate, device="NVIDIA H100 80GB HBM3", measured=True), cpu) == (
        "the profile's times are NVIDIA H100 80GB HBM3's (measured), not this cpu's: its ratios to them (x ideal, "
        "prediction_error) compare two devices")
    assert "(synthetic), not this cpu's" in _timed_elsewhere(dataclasses.replace(estimate, device="cpu"), cpu)


def test_min_memory_budgets_run():
    """At the smallest budget any schedule fits, greedy's schedule runs (and moves data)."""
    chain, profile = setup()
    schedule = registry().planner("greedy").plan(profile, min_memory(profile))
    run = TorchExecutor(warmup=0, iterations=1).execute(schedule, profile, chain)
    assert run.status == "ok" and run.moved_bytes > 0 and run.metrics["stall_s"] >= 0


def test_the_gradient_check_measures_how_far_gradients_are():
    """0 for the plain gradients, the relative size of a perturbation otherwise, inf for a missing one."""
    from harness.executors.grad_check import largest_relative_error, reference_gradients

    chain, _ = setup()
    expected = reference_gradients(chain, 1)
    assert largest_relative_error(reference_gradients(chain, 1), expected) == 0.0
    name, grad = next(iter(expected.items()))
    bumped = dict(expected, **{name: grad + 0.01 * grad.abs().max()})
    assert largest_relative_error(bumped, expected) == pytest.approx(0.01, rel=1e-3)
    assert largest_relative_error({k: v for k, v in expected.items() if k != name}, expected) == float("inf")


def test_a_model_too_large_for_the_reference_keeps_its_row_and_its_gradients(monkeypatch):
    """The gradient check runs the unmodified model, which needs the memory the schedule saves: on a
    device too small for it (the case the harness exists for) the run stays ok, without grad_error,
    its message says why, and the model holds the schedule's gradients, not a half-run reference's."""
    from harness.executors import grad_check

    chain, profile = setup()
    lo, hi = min_memory(profile), peak_memory(profile)
    schedule = registry().planner("greedy").plan(profile, (lo + hi) // 2)
    TorchExecutor(warmup=0, iterations=1, grad_check=False).execute(schedule, profile, chain)
    expected = {n: p.grad.clone() for n, p in chain.model.named_parameters()}

    def out_of_memory(chain, sub_batches, seed=0):
        for p in chain.model.parameters():  # part-way through the reference pass
            p.grad = torch.zeros_like(p)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(grad_check, "reference_gradients", out_of_memory)
    run = TorchExecutor(warmup=0, iterations=1).execute(schedule, profile, chain)
    assert run.status == "ok" and "grad_error" not in run.metrics
    assert "no gradient check: the unmodified model does not fit the device" in run.message
    got = dict(chain.model.named_parameters())
    assert all(torch.equal(got[n].grad, g) for n, g in expected.items())


def test_one_executors_runs_on_a_chain_share_one_reference_pass_until_a_weight_changes(monkeypatch):
    """The gradient check ran the unmodified model after every case: on the H200's smoke suite a
    keep-all iteration a case (0.65 s for ViT-B/16 at batch 256), the same pass every time. An
    executor now computes it once per chain, sub-batch count and seed and keeps it on the host; a
    weight changed in place (its version counter moves) makes it compute the reference again,
    where the kept one would judge right gradients wrong."""
    from harness.executors import grad_check

    chain, profile = setup()
    calls = []
    real = grad_check.reference_gradients
    monkeypatch.setattr(grad_check, "reference_gradients",
                        lambda chain, sub_batches, seed=0: calls.append(sub_batches) or real(chain, sub_batches, seed))
    lo, hi = min_memory(profile), peak_memory(profile)
    n = profile.n_stages
    schedules = [registry().planner("keep-all").plan(profile, 10**12),
                 registry().planner("greedy").plan(profile, (lo + hi) // 2),
                 Schedule("two-passes", 10**12, training_ops(n, sub_batches=2), (), sub_batches=2)]
    executor = TorchExecutor(warmup=0, iterations=1)
    runs = [executor.execute(s, profile, chain) for s in schedules + schedules]
    assert calls == [1, 2]
    assert all(r.status == "ok" and r.metrics["grad_error"] < 1e-5 for r in runs), [r.message for r in runs]

    weight = next(chain.model.parameters())
    before = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(1.5)
        run = executor.execute(schedules[1], profile, chain)
        kept_vs_fresh = grad_check.largest_relative_error(real(chain, 1), executor._references.get(chain, 1, 0))
    finally:
        with torch.no_grad():
            weight.copy_(before)
    assert calls == [1, 2, 1]
    assert run.metrics["grad_error"] < 1e-5
    assert kept_vs_fresh == 0.0  # the kept reference is the new weights' ...
    assert executor.execute(schedules[0], profile, chain).metrics["grad_error"] < 1e-5  # ... and the old ones' again
    assert calls == [1, 2, 1, 1]


def test_the_kept_reference_is_the_one_of_the_chain_and_seed_asked_for():
    """``ReferenceCache`` keys its reference by chain, sub-batch count and seed: a second chain of the same model
    (other weights, the same version counters) or another seed (another output gradient) computes its own,
    where the kept one would judge right gradients wrong."""
    from harness.executors.grad_check import ReferenceCache, largest_relative_error, reference_gradients

    chain, other = (build_chain(Workload(MODEL, BATCH, SIZE, "cpu"), "cpu") for _ in range(2))
    for p in other.model.parameters():  # other weights; through .data, so that the version counters stay the
        p.data.mul_(1.5)                # first chain's and only the chain tells the two apart
    cache = ReferenceCache()
    cache.get(chain, 1, 0)
    assert largest_relative_error(cache.get(chain, 1, 1), reference_gradients(chain, 1, 1)) == 0.0
    assert largest_relative_error(cache.get(other, 1, 0), reference_gradients(other, 1, 0)) == 0.0
    assert largest_relative_error(reference_gradients(chain, 1, 0), reference_gradients(other, 1, 0)) > 0.1


def test_a_gradient_that_should_be_zero_is_judged_against_the_models_scale():
    """A convolution's bias before a batch norm has a true gradient of zero: the reference holds
    rounding noise (1e-9), and another algorithm's noise read as an error of about 1 when each
    parameter was judged against its own largest gradient. A real error there still shows, and a
    NaN gradient is never an error of 0 (max() ignored it)."""
    from harness.executors.grad_check import SCALE_FLOOR, largest_relative_error

    expected = {"conv.weight": torch.tensor([0.5, -2.0]), "conv.bias": torch.tensor([1e-9, -1e-9])}
    noise = dict(expected, **{"conv.bias": torch.tensor([-1e-9, 2e-9])})
    assert largest_relative_error(noise, expected) == pytest.approx(3e-9 / (SCALE_FLOOR * 2.0))
    wrong = dict(expected, **{"conv.bias": torch.tensor([0.2, 1e-9])})
    assert largest_relative_error(wrong, expected) == pytest.approx(0.2 / (SCALE_FLOOR * 2.0))
    assert largest_relative_error(dict(expected, **{"conv.weight": torch.tensor([float("nan"), 0.0])}),
                                  expected) == float("inf")
    zero = {"w": torch.tensor([0.0, 0.0])}  # every gradient zero: no scale at all
    assert largest_relative_error(zero, zero) == 0.0
    assert largest_relative_error({"w": torch.tensor([0.0, 1e-6])}, zero) == float("inf")


def test_memory_statistics_are_reset_before_the_warm_up(monkeypatch):
    """An oom during warm-up must report this case's peaks: the statistics are reset before the
    first warm-up iteration, not only after the warm-up (the H100 run's oom rows showed the
    previous case's max_memory_reserved)."""
    from harness.executors import torch_executor

    calls: list[str] = []
    reset, iteration = torch_executor._Execution._reset_stats, torch_executor._Execution._iteration
    monkeypatch.setattr(torch_executor._Execution, "_reset_stats",
                        lambda self: (calls.append("reset"), reset(self))[1])
    monkeypatch.setattr(torch_executor._Execution, "_iteration",
                        lambda self, record, timeline=False: (calls.append("iteration"),
                                                              iteration(self, record, timeline))[1])
    chain, profile = setup()
    schedule = registry().planner("keep-all").plan(profile, 10**12)
    run = TorchExecutor(warmup=2, iterations=1).execute(schedule, profile, chain)
    assert run.status == "ok"
    assert calls[0] == "reset" and calls.index("iteration") == 1


def test_the_chain_is_built_once_for_the_cases_of_one_workload_on_cuda(monkeypatch):
    """The cache compared the device asked for ("cuda") with the chain's ("cuda:0"): on CUDA every
    case rebuilt, re-traced and re-pinned its model, seconds each out of a GPU slice."""
    from harness.executors import torch_executor

    built = []

    def build(workload, device):
        built.append(device)
        return type("FakeChain", (), {"workload": workload, "device": torch.device("cuda", 0)})()

    monkeypatch.setattr(torch_executor, "build_chain", build)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    executor, workload = TorchExecutor(), Workload(MODEL, BATCH, SIZE, "cuda")
    first = executor.chain(workload, torch.device("cuda"))
    assert executor.chain(workload, torch.device("cuda")) is first
    assert executor.chain(workload, torch.device("cuda:0")) is first and len(built) == 1


def _waiting_execution(monkeypatch, held: int, schedule: Schedule | None = None):
    """An execution of ``schedule`` (greedy's by default), as on CUDA, whose group (0, 1) has 400
    bytes away and whose store holds ``held`` bytes on the device; 600 bytes are allocated."""
    from types import SimpleNamespace

    from harness.executors import torch_executor

    chain, profile = setup()
    if schedule is None:
        schedule = registry().planner("greedy").plan(profile, (min_memory(profile) + peak_memory(profile)) // 2)
    execution = torch_executor._Execution(TorchExecutor(), schedule, profile, chain)
    away = [SimpleNamespace(moved=300), SimpleNamespace(moved=0), SimpleNamespace(moved=100)]
    monkeypatch.setattr(execution.store, "blocks", lambda group: away if group == (0, 1) else [])
    monkeypatch.setattr(execution.store, "device_bytes", lambda: {(0, 2): held})
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 600)
    execution.cuda, execution.limit_bytes = True, 10**15
    return execution


def test_a_prefetch_waits_for_the_chain_budget_where_the_cap_has_room(monkeypatch):
    """H200, 2026-11-29: on CUDA a waiting prefetch went as soon as the allocator took it, under the
    cap of the device budget, so it took the margin the planner had left for the runtime and the
    allocator, and the backward after it ran out of memory (13 oom rows). Its room is now the
    simulator's on CUDA too: the chain model's memory as the operation about to run starts (every
    saved tensor on the device, less the bytes the store has on the host: what the model holds
    beyond the saved data, the gradients between the backwards among it, counts) and its own bytes
    within the chain's budget."""
    chain, profile = setup()
    execution = _waiting_execution(monkeypatch, 0)
    assert execution.weights >= chain.weight_bytes()  # every gradient counted, made yet or not
    resident = lower(execution.schedule, profile).resident_in_use()
    k = int(resident.argmax())  # keep-all's peak, above the budget: the store must have bytes away
    away = int(resident[k]) + 400 - execution.schedule.budget_bytes  # the prefetch's 400 bytes fit exactly
    assert away > 400
    execution.next_op = k
    monkeypatch.setattr(execution.store, "host_bytes", lambda: away)
    assert execution._room((0, 1))
    monkeypatch.setattr(execution.store, "host_bytes", lambda: away - 1)
    assert not execution._room((0, 1))
    execution.next_op = len(execution.schedule.ops)  # after the last operation: the weights and the saved bytes
    assert execution._room((0, 1))


def test_a_waiting_prefetch_is_not_asked_of_the_allocator_while_it_cannot_fit(monkeypatch):
    """Under a cap, a refused allocation makes PyTorch's caching allocator free every cached block
    and synchronise the device first: a prefetch is asked of it only once the bytes allocated
    leave room for it under the cap, even where the chain's budget has room."""
    execution = _waiting_execution(monkeypatch, 0)
    execution.next_op = len(execution.schedule.ops)
    execution.limit_bytes = 999  # 600 allocated + the 400 bytes away: one over the cap
    assert not execution._room((0, 1))
    execution.limit_bytes = 1000
    assert execution._room((0, 1))


@pytest.mark.parametrize("cuda", [True, False])
def test_prefetches_go_in_list_order_behind_one_waiting_for_memory(monkeypatch, cuda):
    """The simulator's copy engine serves its transfers in list order: a prefetch waiting for
    memory holds back the ones after it. On CUDA a later prefetch that fitted went first
    and took the memory the waiting one was to have."""
    _, profile = setup()
    n = profile.n_stages
    transfers = (tuple(Transfer(i, "offload", i) for i in range(n - 1))
                 + tuple(Transfer(i, "prefetch", n) for i in reversed(range(n - 1))))
    execution = _waiting_execution(monkeypatch, 0, Schedule("all-at-the-backward", 10**12, training_ops(n), transfers))
    execution.cuda = cuda
    first, later = n - 1, n  # the prefetches of stages n - 2 and n - 3
    tried = []
    monkeypatch.setattr(execution, "_prefetch", lambda j, force=False: tried.append(j) or False)
    execution.heads, execution.ready = [first], {first}  # the offloads are over; the first prefetch issued
    execution._start_copies()
    assert tried == [first]  # it does not fit
    execution.issued = {(0, "start"): [later]}
    execution._issue(0, "start")
    assert tried == [first, first]  # the first still does not fit: the later one is not asked


def test_a_transfer_waits_for_those_listed_before_it_on_its_engine(monkeypatch):
    """moDNN lists its transfers in its own order, not that of their issue points, and the simulator's
    engine serves them in list order: an offload issued at F_0 but listed after one issued at F_1 starts
    after it. The executor started each at its issue point (ViT-B/16 with the H200 profile's times, moDNN
    at a quarter of the span: +2.5% against the prediction in ``tests/test_torch_executor_timing.py``'s
    virtual time). Before an operation that waits for a transfer, those before it start, forced."""
    _, profile = setup()
    n = profile.n_stages
    transfers = (Transfer(1, "offload", 1), Transfer(0, "offload", 0), Transfer(1, "prefetch", n),
                 Transfer(0, "prefetch", n, wait_op=n))
    execution = _waiting_execution(monkeypatch, 0, Schedule("listed", 10**12, training_ops(n), transfers))
    started = []
    monkeypatch.setattr(execution, "_offload", lambda j: started.append(j))
    monkeypatch.setattr(execution, "_prefetch", lambda j, force=False: started.append(j) or force)
    execution._issue(0, "start")
    execution._after_forward(0, 0)
    assert started == []  # listed after the offload of stage 1, which is not issued yet
    execution._issue(1, "start")
    assert started == []  # issued, but stage 1's forward has not produced its data
    execution._after_forward(0, 1)
    assert started == [0, 1]
    execution._submit_through(3)  # op n waits for the last prefetch: the one before it goes first, forced
    assert started == [0, 1, 2, 3] and execution.heads == [4]


def test_with_two_copy_engines_a_prefetch_does_not_queue_behind_an_offload(monkeypatch):
    """Duplex copy engines (``Schedule.duplex``): offloads and prefetches queue in list order each on
    their own engine, as on the simulator's two engines, so a prefetch issued while an offload listed
    before it waits for its forward starts at once."""
    _, profile = setup()
    n = profile.n_stages
    transfers = (Transfer(3, "offload", 3), Transfer(4, "offload", 4), Transfer(3, "prefetch", 4),
                 Transfer(4, "prefetch", n))
    schedule = Schedule("early-prefetch", 10**12, training_ops(n), transfers, duplex=True)
    execution = _waiting_execution(monkeypatch, 0, schedule)
    started = []
    monkeypatch.setattr(execution, "_offload", lambda j: started.append(j))
    monkeypatch.setattr(execution, "_prefetch", lambda j, force=False: started.append(j) or True)
    execution._issue(3, "start")
    execution._after_forward(0, 3)
    execution._issue(4, "start")
    assert started == [0, 2]  # stage 4's offload waits for F_4; stage 3's prefetch does not wait for it
    execution._after_forward(0, 4)
    assert started == [0, 2, 1] and execution.heads == [2, 1]


def test_an_offload_passed_over_for_a_wait_goes_once_its_forward_has_run(monkeypatch):
    """An operation that waits for a transfer starts those listed before it on its engine first; an
    offload among them whose forward has not produced its data yet cannot go then, and is not lost:
    it goes as soon as that forward is over (``_after_forward``), or its stage would keep all its
    saved data on the device and the prefetch would find nothing to bring back."""
    _, profile = setup()
    n = profile.n_stages
    # F_1 waits for the offload of stage 0 (vDNN's synchronisation), listed after that of stage 1
    transfers = (Transfer(1, "offload", 1), Transfer(0, "offload", 0, wait_op=1), Transfer(1, "prefetch", n),
                 Transfer(0, "prefetch", n))
    execution = _waiting_execution(monkeypatch, 0, Schedule("passed-over", 10**12, training_ops(n), transfers))
    started = []
    monkeypatch.setattr(execution, "_offload", lambda j: started.append(j))
    execution._issue(0, "start")
    execution._after_forward(0, 0)
    execution._issue(1, "start")
    assert started == []  # stage 0's offload waits behind stage 1's, whose forward has not run
    execution._submit_through(1)  # F_1 waits for stage 0's offload: it starts, stage 1's cannot yet
    assert started == [1] and execution.heads == [2]
    execution._after_forward(0, 1)
    assert started == [1, 0]


@pytest.mark.parametrize("text, status", [
    ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "oom"),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "oom"),
    ("GET was unable to find an engine to execute this computation", "oom"),
    ("CUDA error: an illegal memory access was encountered", None),
])
def test_cudnn_running_out_of_workspace_under_the_cap_is_an_oom_row(monkeypatch, text, status):
    """cuDNN and cuBLAS say they could not allocate with a plain RuntimeError: under the budget's cap
    that is an oom row giving their message, not an error row; any other RuntimeError still fails."""
    from harness.executors import torch_executor

    chain, profile = setup()
    schedule = registry().planner("keep-all").plan(profile, 10**12)

    def capped(self):
        self.cap = 0.5

    def fail(self, record, timeline=False):
        raise RuntimeError(text)

    monkeypatch.setattr(torch_executor._Execution, "_set_cap", capped)
    monkeypatch.setattr(torch_executor._Execution, "_release_cap", lambda self: None)
    monkeypatch.setattr(torch_executor._Execution, "_iteration", fail)
    executor = TorchExecutor(warmup=0, iterations=1)
    if status is None:
        with pytest.raises(RuntimeError, match="illegal memory access"):
            executor.execute(schedule, profile, chain)
        return
    run = executor.execute(schedule, profile, chain)
    assert run.status == "oom" and text in run.message and "memory cap 0.5000" in run.message


def test_cudnn_finding_no_engine_in_the_reference_pass_is_a_fault_not_a_device_too_small(monkeypatch):
    """Outside the cap, cuDNN finding no engine may be a configuration it does not support: the gradient
    check does not read it as the unmodified model not fitting (only running out of memory is)."""
    from harness.executors import grad_check

    chain, profile = setup()
    schedule = registry().planner("keep-all").plan(profile, 10**12)

    def no_engine(chain, sub_batches, seed=0):
        raise RuntimeError("GET was unable to find an engine to execute this computation")

    monkeypatch.setattr(grad_check, "reference_gradients", no_engine)
    with pytest.raises(RuntimeError, match="unable to find an engine"):
        TorchExecutor(warmup=0, iterations=1).execute(schedule, profile, chain)


def test_the_output_gradient_goes_to_the_device_before_the_transfers_of_its_stage(monkeypatch):
    """H200, 2026-11-29: the output gradient's copy, made inside the last stage's backward, queued on
    the copy engine behind every prefetch issued at that backward's start, and the backward waited
    for them all (ViT-B/16: 404 ms). Each sub-batch's gradient is now sent as its last stage's first
    operation begins, before the transfers issued there, and the gradients are unchanged."""
    from harness.executors import torch_executor
    from harness.executors.grad_check import gradient_error

    chain, profile = setup()
    n = profile.n_stages
    transfers = (tuple(Transfer(i, "offload", i) for i in range(n - 1))
                 + tuple(Transfer(i, "prefetch", n) for i in reversed(range(n - 1))))
    schedule = Schedule("two-passes", 10**12, training_ops(n, sub_batches=2), transfers, sub_batches=2)
    events = []
    stage_grad, issue = torch_executor._Execution._stage_grad, torch_executor._Execution._issue
    monkeypatch.setattr(torch_executor._Execution, "_stage_grad",
                        lambda self, sb: events.append(("grad", sb)) or stage_grad(self, sb))
    monkeypatch.setattr(torch_executor._Execution, "_issue",
                        lambda self, k, at: events.append((k, at)) or issue(self, k, at))
    run = TorchExecutor(warmup=0, iterations=1).execute(schedule, profile, chain)
    assert run.status == "ok", run.message
    for sb in (0, 1):
        first = next(k for k, op in enumerate(schedule.ops) if op.stage == n - 1 and op.sub_batch == sb)
        assert events.index(("grad", sb)) == events.index((first, "start")) - 1
    assert gradient_error(chain, 2, 0) < 1e-5


class _Copying:
    """An offload's CUDA event, as far as the executor asks it: done or not, and waited for."""

    def __init__(self, log: list, name: str, done: bool = False):
        self.log, self.name, self.done = log, name, done

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.log.append(self.name)
        self.done = True


def test_an_operation_waits_for_the_offloads_that_free_its_memory(monkeypatch):
    """H200, 2026-11-29: a forward ran ahead of the offloads freeing its memory (their storages are
    shrunk at once, but the allocator reuses the bytes only when the copy is over), the reserve
    grew to the cap, and there the allocator synchronised with every copy. An operation now waits
    as in the simulator: for the oldest offloads still copying, until the chain model's memory as it
    starts fits beside the offloads left. A prefetch that only offloads still copying keep out waits
    for them likewise (counted until the host saw them end, it waited for the end of the operation
    it was issued with: ``tests/test_torch_executor_timing.py``); one the budget has no room for even
    without them waits for memory, and the host for nothing."""
    execution = _waiting_execution(monkeypatch, 0)
    budget, weights = execution.schedule.budget_bytes, execution.weights
    k = 2
    room = budget - execution._in_use(k)  # what the offloads in flight may hold while op k runs
    log, retried = [], []
    execution._start_copies = lambda: retried.append(k)
    execution.releasing = [(_Copying(log, "a"), room // 2), (_Copying(log, "b"), room // 2), (_Copying(log, "c"), 10)]
    execution._make_room(k)
    assert log == ["a"]  # one wait is enough: b and c fit beside op k
    assert retried == [k]  # and the memory it freed may let a waiting prefetch start with op k
    execution._make_room(k)
    assert log == ["a"] and retried == [k]
    execution.next_op = len(execution.schedule.ops)
    execution.store.device_bytes = lambda: {(0, 2): budget - weights - 400 - room // 2 - 10 + 1}
    assert execution._room((0, 1))  # one byte over with the bytes still copying out: the oldest is waited for
    assert log == ["a", "b"] and len(execution.releasing) == 1
    execution.store.device_bytes = lambda: {(0, 2): budget - weights - 400 + 1}
    assert not execution._room((0, 1))  # one byte over with nothing copying: no wait helps
    assert log == ["a", "b"] and len(execution.releasing) == 1


def test_an_offload_counts_its_blocks_whole_until_its_copy_is_over(monkeypatch):
    """What an offload frees comes free when its copy is over (the allocator reuses a storage's memory
    then), so until that copy's event says so its blocks count, whole, beside what is held."""
    from harness.executors._torch_store import Block

    _, profile = setup()
    n = profile.n_stages
    schedule = Schedule("one-offload", 10**12, training_ops(n), (Transfer(1, "offload", 1), Transfer(1, "prefetch", n)))
    execution = _waiting_execution(monkeypatch, 0, schedule)
    blocks = [Block(torch.zeros(size, dtype=torch.uint8).untyped_storage(), size, (0, 1)) for size in (1000, 600)]
    monkeypatch.setattr(execution.store, "blocks", lambda group: blocks if group == (0, 1) else [])
    copying = _Copying([], "offload 1")
    monkeypatch.setattr(execution.copies, "offload", lambda plan, label: copying)
    execution._offload(0)
    assert execution._releasing_bytes() == 1600
    copying.done = True
    assert execution._releasing_bytes() == 0 and execution.releasing == []
