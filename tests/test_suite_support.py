"""Shared by the suite, runner, publish and CLI tests: a synthetic test plugin and helpers.

The plugin brings a ``synthetic`` profiler with ``synthetic:chainN`` models (N stages,
sizes and times that grow with the batch), a simple offloading planner ``prefix``
(papers/004's eager, ordered, no-wait schedule of the first activations, like GREEDY),
and misbehaving planners: ``boom`` (raises), ``oom`` (runs out of memory), ``slow-first``
(its first call is slow, like a Numba compile), ``hang`` (never returns on one model),
``sloppy`` (a plugin author's slips), ``unpicklable`` (holds a lambda and a lock), ``interrupter``
(Ctrl-C on its Nth plan), ``numba-interrupter`` (Ctrl-C on its Nth plan as a Numba kernel
reports it: a ``SystemError`` whose context is the ``KeyboardInterrupt``) and ``killer``
(SIGKILLs its own process on its Nth plan when ``MEMBUDGET_TEST_KILL_AT`` is set); misbehaving allocators:
``overlapper`` (every block at offset 0), ``not-a-placement`` (returns a dict) and ``crasher`` (SIGKILLs its
own process when it places a trace); and an executor ``quirky``
(the simulator, with an executor author's slips). ``install()`` registers it in the process-wide registry.
This file has no tests of its own.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

from harness import hookimpl
from harness.errors import InfeasibleBudget
from harness.model import Profile, Stage
from harness.schedules import best_ordered_schedule, check_budget, keep_all_schedule

MODELS = {"synthetic:chain4": 4, "synthetic:chain8": 8, "synthetic:chain12": 12}
PLANS: Counter = Counter()  # (planner, model, batch, budget) -> how many times it was planned
PROFILED: Counter = Counter()  # (model, batch) -> how many times it was profiled


def chain(model: str, batch: int) -> Profile:
    """A deterministic chain whose early activations are the big ones, as in CNNs."""
    n = MODELS[model]
    stages = tuple(
        Stage(f"s{i}", "conv" if i % 2 == 0 else "act", 1e-3 * batch * (1 + i % 3), 2e-3 * batch * (1 + i % 2),
              input_bytes=batch * 4096 * (n - i), saved_bytes=batch * 4096 * (n - i), grad_bytes=batch * 1024 * (n - i),
              fwd_workspace=512 * (i % 3), bwd_workspace=512 * (i % 2))
        for i in range(n)
    )
    return Profile(model, batch, (3, 32, 32), "synthetic", 16 * 2**30, 2e7, 2e7, 10_000, batch * 100, stages,
                   profiler="synthetic")


class SyntheticProfiler:
    """Profiles ``synthetic:chainN`` without running anything."""

    name = "synthetic"
    description = "deterministic synthetic chains for tests"

    def profile(self, workload):
        """The chain of ``workload.model`` at ``workload.batch_size``."""
        if workload.model == "synthetic:broken":
            raise RuntimeError("profiler crashed")
        if workload.model not in MODELS:
            raise ValueError(f"no synthetic model {workload.model!r}")
        PROFILED[(workload.model, workload.batch_size)] += 1
        return chain(workload.model, workload.batch_size)


class SyntheticModels:
    """Model factory that names the synthetic chains (it builds nothing)."""

    name = "synthetic"
    description = "synthetic:chainN for tests"

    def names(self):
        """The synthetic model names (``synthetic:broken`` crashes the profiler)."""
        return [*MODELS, "synthetic:broken"]

    def default_input_size(self, model):
        """3x32x32."""
        return (3, 32, 32)

    def build(self, workload, device="cpu"):
        """Nothing to build."""
        raise NotImplementedError("synthetic chains have no module")


class Prefix:
    """Offload the first activations until M_peak - M is out (papers/004 section 4.2)."""

    name = "prefix"
    description = "GREEDY-like prefix offloading (test plugin)"
    extra_options = ("depth",)  # accepted and ignored: the suite tests label cases with it

    def plan(self, profile, budget_bytes, **options):
        """The fastest ordered no-wait schedule offloading the shortest sufficient prefix."""
        from harness.bounds import peak_memory

        if profile.model in MODELS:  # not the runner's warm-up chain
            PLANS[(self.name, profile.model, profile.batch_size, budget_bytes)] += 1
        check_budget(profile, budget_bytes, self.name)
        need = peak_memory(profile) - budget_bytes
        offload = []
        for i, stage in enumerate(profile.stages):
            if need <= 0:
                break
            offload.append(i)
            need -= stage.saved_bytes
        if not offload:
            return keep_all_schedule(profile, budget_bytes, self.name)
        for k in range(len(offload), profile.n_stages + 1):
            schedule = best_ordered_schedule(profile, budget_bytes, list(range(k)), planner=self.name)
            if schedule is not None:
                return schedule
        raise RuntimeError("no feasible prefix")


class Boom(Prefix):
    """Raises on every plan."""

    name = "boom"
    description = "always raises (test plugin)"

    def plan(self, profile, budget_bytes, **options):
        """Raise."""
        raise RuntimeError("boom goes the planner")


class Oom(Prefix):
    """Runs out of memory on every plan."""

    name = "oom"
    description = "always out of memory (test plugin)"

    def plan(self, profile, budget_bytes, **options):
        """Raise MemoryError."""
        raise MemoryError("cannot allocate the planning table")


class Interrupter(Prefix):
    """Like ``prefix``, but the ``interrupt_at``-th plan raises KeyboardInterrupt (0: never)."""

    name = "interrupter"
    description = "Ctrl-C on the Nth plan (test plugin)"
    interrupt_at = 0
    calls = 0

    def plan(self, profile, budget_bytes, **options):
        """Plan like ``prefix`` or press Ctrl-C."""
        type(self).calls += profile.model in MODELS
        if self.interrupt_at and type(self).calls == self.interrupt_at:  # 0 never: not at a warm-up plan either
            raise KeyboardInterrupt
        return super().plan(profile, budget_bytes, **options)


class NumbaInterrupter(Interrupter):
    """Like ``interrupter``, but the Ctrl-C surfaces as a compiled kernel reports it (a SystemError)."""

    name = "numba-interrupter"
    description = "Ctrl-C inside a Numba kernel on the Nth plan (test plugin)"
    interrupt_at = 0
    calls = 0

    def plan(self, profile, budget_bytes, **options):
        """Plan like ``prefix`` or raise what CPython raises when Ctrl-C hits a Numba kernel."""
        try:
            return super().plan(profile, budget_bytes, **options)
        except KeyboardInterrupt as exc:
            raise SystemError("CPUDispatcher(<function _plan_kernel at 0x7f>) returned a result with an "
                              "exception set") from exc


class Killer(Prefix):
    """Like ``prefix``, but the Nth plan signals its process (N from ``MEMBUDGET_TEST_KILL_AT``; the
    signal from ``MEMBUDGET_TEST_KILL_SIGNAL``, default ``KILL``)."""

    name = "killer"
    description = "kills its process on the Nth plan (test plugin)"
    calls = 0

    def plan(self, profile, budget_bytes, **options):
        """Plan like ``prefix`` or die."""
        type(self).calls += profile.model in MODELS
        if str(type(self).calls) == os.environ.get("MEMBUDGET_TEST_KILL_AT"):
            os.kill(os.getpid(), getattr(signal, "SIG" + os.environ.get("MEMBUDGET_TEST_KILL_SIGNAL", "KILL")))
        return super().plan(profile, budget_bytes, **options)


class SlowFirst(Prefix):
    """Like ``prefix``, but its first plan in a process takes a second (as a Numba compile would)."""

    name = "slow-first"
    description = "slow first call, like a JIT compile (test plugin)"
    compiled = False
    compile = staticmethod(lambda: __import__("time").sleep(1.0))  # a test may pass time on a clock of its own

    def plan(self, profile, budget_bytes, **options):
        """Spend ``compile`` on the first call, then plan like ``prefix``."""
        if not type(self).compiled:
            type(self).compile()
            type(self).compiled = True
        return super().plan(profile, budget_bytes, **options)


class Hang(Prefix):
    """Like ``prefix``, but it never returns on ``synthetic:chain8`` at batch 1 (a planner stuck in a loop)."""

    name = "hang"
    description = "never returns on chain8 at batch 1 (test plugin)"

    def plan(self, profile, budget_bytes, **options):
        """Sleep for an hour on chain8 at batch 1, else plan like ``prefix``."""
        if (profile.model, profile.batch_size) == ("synthetic:chain8", 1):
            import time

            time.sleep(3600)
        return super().plan(profile, budget_bytes, **options)


class Sloppy(Prefix):
    """The slips of a plugin author, by ``MEMBUDGET_TEST_SLIP``: ``exit`` calls ``sys.exit(3)``, ``none``
    returns None, ``key`` raises a KeyError, ``lie`` returns keep-all claiming a budget of a petabyte,
    ``over`` returns keep-all at the given budget (too small for it) instead of raising ``InfeasibleBudget``,
    ``refuse`` refuses saying it needs 1 byte, ``refuse-float`` saying it needs 1.5 bytes more than it got,
    ``cancel`` raises ``asyncio.CancelledError`` (a BaseException), ``ctrl-c`` raises ``KeyboardInterrupt``,
    ``chdir`` changes the working folder to ``MEMBUDGET_TEST_CHDIR`` (as a solver working in a temporary folder
    does), then plans, ``child`` starts ``sleep 600``, appends its process's pid and the child's to the file
    ``MEMBUDGET_TEST_CHILD`` and sleeps for an hour, ``child-returns`` does the same but plans like ``prefix``
    instead of sleeping (the child left running); and
    schedules no memory rule can read (``MALFORMED``): ``no-b0`` leaves out B0, ``algorithm`` names algorithm 7
    of every stage, ``stage999`` offloads stage 999, ``kind`` runs an operation ``X0``, ``tuple`` lists a plain
    tuple as an operation, ``sideways`` copies in a direction that is neither, ``half-byte`` moves 1000.5 bytes."""

    name = "sloppy"
    description = "a plugin author's slips (test plugin)"

    def plan(self, profile, budget_bytes, **options):
        """Slip as ``MEMBUDGET_TEST_SLIP`` says on the test models, else plan like ``prefix``."""
        slip = os.environ.get("MEMBUDGET_TEST_SLIP", "") if profile.model in MODELS else ""
        if slip == "exit":
            import sys

            sys.exit(3)
        if slip == "none":
            return None
        if slip == "key":
            return {}["x"]  # a slip in the plugin's own code: a KeyError from its line
        if slip == "cancel":
            import asyncio

            raise asyncio.CancelledError("its solver's task was cancelled")
        if slip == "ctrl-c":
            raise KeyboardInterrupt("pressed by the plugin")
        if slip == "chdir":
            os.chdir(os.environ["MEMBUDGET_TEST_CHDIR"])
        if slip in ("child", "child-returns"):
            import subprocess
            import time

            child = subprocess.Popen(["sleep", "600"])
            with open(os.environ["MEMBUDGET_TEST_CHILD"], "a") as pids:  # a plan may be asked for more than once
                pids.write(f"{os.getpid()} {child.pid}\n")
            if slip == "child":
                time.sleep(3600)
        if slip in ("lie", "over"):
            return keep_all_schedule(profile, 10**15 if slip == "lie" else budget_bytes, self.name)
        if slip in ("refuse", "refuse-float"):
            raise InfeasibleBudget("too small", needed_bytes=1 if slip == "refuse" else budget_bytes + 1.5)
        if slip in MALFORMED:
            return malformed(slip, keep_all_schedule(profile, budget_bytes, self.name))
        return super().plan(profile, budget_bytes, **options)


MALFORMED = {  # Sloppy's malformed schedules, and the first violation each is refused with
    "no-b0": "invalid schedule: operation B0 of sub-batch 0 is missing (stage 0)",
    "algorithm": "invalid schedule: algorithm 7 does not exist for stage 0 (stage 0)",
    "stage999": "invalid schedule: transfer 0 names stage 999 of sub-batch 0, which does not exist",
    "kind": "invalid schedule: operation 0 has kind 'X', not one of F, Fc, Fn, R, B",
    "tuple": "invalid schedule: operation 0 is ('F', 0), not an Op",
    "sideways": "invalid schedule: transfer 0 has direction 'sideways', not 'offload' or 'prefetch'",
    "half-byte": "invalid schedule: transfer 0 has nbytes 1000.5, not an int or None",
}


def malformed(slip: str, schedule):
    """``schedule`` (keep-all) broken as ``MALFORMED[slip]`` says."""
    import dataclasses

    from harness.model import Op, Transfer

    ops, n = schedule.ops, len(schedule.ops) // 2
    change = {
        "no-b0": dict(ops=ops[:-1]),
        "algorithm": dict(algorithms=(7,) * n),
        "stage999": dict(transfers=(Transfer(999, "offload", 0), Transfer(999, "prefetch", 1))),
        "kind": dict(ops=(Op("X", 0), *ops[1:])),
        "tuple": dict(ops=(("F", 0), *ops[1:])),
        "sideways": dict(transfers=(Transfer(0, "sideways", 0),)),
        "half-byte": dict(transfers=(Transfer(0, "offload", 0, nbytes=1000.5), Transfer(0, "prefetch", n))),
    }[slip]
    return dataclasses.replace(schedule, **change)


class Unpicklable(Prefix):
    """Like ``prefix``, but it holds a lambda (pickle refuses it) and a lock (cloudpickle, Ray's, refuses
    that): it cannot be sent to a worker process or a Ray task."""

    name = "unpicklable"
    description = "cannot be pickled (test plugin)"

    def __init__(self):
        import threading

        self.key = lambda stage: stage
        self.lock = threading.Lock()


class Overlapper:
    """An allocator that cheats: every block at offset 0, an arena of the largest block (test plugin)."""

    name = "overlapper"
    description = "every block at offset 0 (test plugin)"

    def place(self, blocks):
        """Offset 0 for all, the trace's true max-live, and an arena no valid placement can have."""
        from harness.allocators.trace import max_live_bytes
        from harness.model import Placement

        return Placement(self.name, tuple(0 for _ in blocks), max((b.size for b in blocks), default=0),
                         max_live_bytes(blocks), optimal=True)


class NotAPlacement:
    """An allocator that returns a dict (test plugin)."""

    name = "not-a-placement"
    description = "returns a dict (test plugin)"

    def place(self, blocks):
        """A dict of offsets."""
        return {"offsets": [0] * len(blocks)}


class Crasher:
    """An allocator whose native code crashes: it SIGKILLs its own process (test plugin)."""

    name = "crasher"
    description = "kills its process when it places a trace (test plugin)"

    def place(self, blocks):
        """Never returns."""
        os.kill(os.getpid(), signal.SIGKILL)


class Quirky:
    """The simulator with an executor author's slips, by ``MEMBUDGET_TEST_RUN``: ``numpy`` reports NumPy values
    in its metrics (a documented column, a figure of its own, an array) and an object JSON cannot write;
    ``cancel`` raises ``asyncio.CancelledError`` (a BaseException); ``negative`` says ok with a makespan of
    -1 s and a peak of -100 bytes, ``nan`` with a makespan of NaN; ``memory`` raises ``MemoryError`` (the host's);
    ``gpu`` says it needs a GPU (``needs_gpu``) and appends the GPU ids Ray gave its worker to the file
    ``MEMBUDGET_TEST_GPU_IDS``, one JSON list a run; else it runs as ``simulate``."""

    name = "quirky"
    description = "the simulator with an executor author's slips (test plugin)"

    @property
    def needs_gpu(self):
        """True with ``MEMBUDGET_TEST_RUN=gpu`` (read where the runner submits the unit)."""
        return os.environ.get("MEMBUDGET_TEST_RUN") == "gpu"

    def run(self, schedule, profile, workload=None):
        """Simulate ``schedule``, then slip as ``MEMBUDGET_TEST_RUN`` says."""
        import dataclasses
        import json

        import numpy as np

        from harness.simulate.executor import simulate

        slip = os.environ.get("MEMBUDGET_TEST_RUN", "")
        if slip == "gpu":
            import ray

            with open(os.environ["MEMBUDGET_TEST_GPU_IDS"], "a") as ids:
                ids.write(json.dumps([str(i) for i in ray.get_gpu_ids()]) + "\n")
        if slip == "cancel":
            import asyncio

            raise asyncio.CancelledError("its device's stream was cancelled")
        if slip == "memory":
            raise MemoryError("no host memory for the trace")
        run = simulate(schedule, profile)
        if slip in ("negative", "nan"):
            return dataclasses.replace(run, makespan=-1.0 if slip == "negative" else float("nan"),
                                       peak_bytes=-100 if slip == "negative" else run.peak_bytes)
        if slip == "numpy":
            return dataclasses.replace(run, metrics={"stall_s": np.float64(0.25), "iterations": np.int64(3),
                                                     "stalls": np.int64(3), "per_stage": np.arange(3),
                                                     "handle": object()})
        return run


NOISY_RUNS: list[str] = []  # the fingerprints of the schedules Noisy ran, in order


class Noisy:
    """The simulator as a measured executor looks: each run's time a little longer than the last (noise),
    and every run counted in ``NOISY_RUNS``."""

    name = "noisy"
    description = "the simulator with a time of its own on every run, counting its runs (test plugin)"

    def run(self, schedule, profile, workload=None):
        """Simulate ``schedule`` and add a microsecond per run before it to the time."""
        import dataclasses

        from harness.simulate.executor import simulate

        NOISY_RUNS.append(schedule.fingerprint())
        run = simulate(schedule, profile)
        return dataclasses.replace(run, makespan=run.makespan + 1e-6 * len(NOISY_RUNS)) if run.feasible else run


class Plugin:
    """The hook implementations of the test plugin."""

    @hookimpl
    def membudget_register_profilers(self, register):
        register(SyntheticProfiler())

    @hookimpl
    def membudget_register_models(self, register):
        register(SyntheticModels())

    @hookimpl
    def membudget_register_allocators(self, register):
        register(Overlapper())
        register(NotAPlacement())
        register(Crasher())

    @hookimpl
    def membudget_register_planners(self, register):
        for planner in (Prefix(), Boom(), Oom(), Interrupter(), NumbaInterrupter(), Killer(), SlowFirst(),
                        Hang(), Sloppy(), Unpicklable()):
            register(planner)

    @hookimpl
    def membudget_register_executors(self, register):
        register(Quirky())
        register(Noisy())


PLUGIN = Plugin()
PLUGIN.__name__ = "membudget_test_support"


def install():
    """Register the test plugin in the process-wide registry (once) and return it."""
    from harness.plugins import registry

    registry().add_plugin(PLUGIN, "membudget-test-support", "0.0")
    return registry()


SUITE = """\
name: {name}
profiler: synthetic
device: synthetic
models:
  - model: synthetic:chain4
    batch_sizes: [2]
  - model: synthetic:chain8
    batch_sizes: [1, 2]
budgets: {{fractions: [0, 0.5, 1.0]}}
planners: [keep-all, prefix]
executors: [simulate]
"""


def write_suite(folder: Path, text: str | None = None, name: str = "synth", filename: str = "synth.yaml") -> Path:
    """Write a suite file (the small synthetic suite by default) and return its path."""
    path = Path(folder) / filename
    path.write_text(text if text is not None else SUITE.format(name=name))
    return path


def runs_with_allocators(folder: Path, name: str, allocators: str, run_ids: tuple[str, ...]):
    """The synthetic suite with a failing planner (``boom``) beside keep-all and prefix and the allocators
    ``allocators`` (YAML list text), run once per run id in ``folder/results``: (suite, run folders)."""
    from harness.runner import run_suite
    from harness.suite import load_suite

    install()
    text = SUITE.format(name=name).replace("[keep-all, prefix]", "[keep-all, prefix, boom]")
    suite = load_suite(write_suite(folder, text + f"allocators: {allocators}\n"))
    return suite, [run_suite(suite, Path(folder) / "results", run_id=r, progress=False).run_dir for r in run_ids]


def run_yaml(folder: Path, text: str) -> Path:
    """Run the suite ``text`` (YAML, indented as in a test) in ``folder``, quietly; return its run folder."""
    import textwrap

    from harness.runner import run_suite
    from harness.suite import load_suite

    suite = write_suite(folder, textwrap.dedent(text), filename="suite.yaml")
    return run_suite(load_suite(suite), Path(folder) / "results", progress=False).run_dir


def rewrite_rows(run_dir: Path, change) -> None:
    """Edit a finished run's rows in place, as if measured otherwise: ``change(row)`` updates each row
    (a dict of the CSV's strings); ``rows.csv`` is written again and its parquet copy dropped, so that
    readers see the edit."""
    import csv
    import io

    path = Path(run_dir) / "rows.csv"
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    for row in rows:
        change(row)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (Path(run_dir) / "rows.parquet").unlink(missing_ok=True)


def gpu_script(name: str, module_name: str | None = None):
    """``benchmarks/gpu/NAME.py`` loaded as a module (the GPU scripts are scripts, not a package),
    registered in ``sys.modules`` under ``module_name`` (default ``name``): dataclasses look their
    module up there."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(module_name or name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def resnet18_caching_suite(folder: Path, name: str):
    """The quick suite's ResNet-18 profile as a file, and a suite over it at five fractions of the span, five
    planners and the caching allocator model (whose uncapped arenas exceed some budgets): (profile, suite path)."""
    from harness.model import Profile, load, save

    root = Path(__file__).resolve().parents[1]
    profile = load(Profile, root / "results" / "quick" / "published" / "profiles"
                   / "torchvision_resnet18-b32-3x224x224-float32.json")
    save(profile, Path(folder) / "r18.json")
    text = (f"name: {name}\nprofiler: file\ndevice: synthetic\nmodels:\n  - model: {Path(folder) / 'r18.json'}\n"
            f"    batch_sizes: [{profile.batch_size}]\nbudgets: {{fractions: [0.0, 0.25, 0.5, 0.75, 1.0]}}\n"
            "planners: [keep-all, recompute, greedy, dynprog, vdnn-all]\nexecutors: [simulate]\nallocators: [caching]\n")
    return profile, write_suite(folder, text)
