"""Numba's compilation stays out of the times a row reports (``harness.jit_time``; docs/results.md).

The quick suite's published rows of 2026-11-28 had a ``recompute`` plan at 2.5 s against a median
of 3 ms and a ``bestfit`` placement at 14 s against 0.8 ms: kernels (or signatures) that the
runner's warm-up on a toy chain had not compiled, compiled inside the timed call.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from numba import njit

from harness.allocators.first_fit import FirstFit
from harness.jit_time import stopwatch
from harness.results import read_rows_csv
from harness.runner import run_suite
from harness.simulate.executor import Simulator
from harness.suite import load_suite
from tests import test_suite_support as support


def fresh_kernel():
    """A Numba function no process has compiled (no cache): its first call compiles it."""
    @njit
    def kernel(n):
        values = np.arange(n)[::-1].copy()
        values.sort()
        total = 0
        for i in range(n):
            total += values[i] * (i % 7)
        return total

    return kernel


def test_the_stopwatch_takes_a_compilation_off_the_wall_time():
    kernel = fresh_kernel()
    outer = time.perf_counter()
    with stopwatch() as watch:
        kernel(10)
    wall = time.perf_counter() - outer
    assert watch.jit_seconds > 0 and watch.seconds + watch.jit_seconds <= wall
    assert watch.seconds < watch.jit_seconds  # the call is far shorter than its compilation
    with stopwatch() as again:  # compiled: nothing to take off
        kernel(10)
    assert again.jit_seconds == 0 and again.seconds > 0


def test_the_stopwatch_reads_a_block_that_raised():
    kernel = fresh_kernel()
    with pytest.raises(ZeroDivisionError):
        with stopwatch() as watch:
            kernel(10)
            1 / 0
    assert watch.jit_seconds > 0 and watch.seconds < watch.jit_seconds  # read in the block's finally


def test_a_rows_plan_place_and_run_times_leave_out_a_kernel_compiled_in_them(tmp_path, monkeypatch):
    """A planner, an allocator and an executor that each compile a kernel on a path the runner's
    warm-up does not take (a chain longer than the toy one): their rows' times are without it."""
    compiled: dict[str, float] = {}

    def compile_once(kind: str):
        kernel = fresh_kernel()

        def run() -> None:
            if kind not in compiled:
                started = time.perf_counter()
                kernel(10)
                compiled[kind] = time.perf_counter() - started
        return run

    plan_compile, place_compile, run_compile = compile_once("plan"), compile_once("place"), compile_once("run")
    plan, place, run = support.Prefix.plan, FirstFit.place, Simulator.run

    def late_plan(self, profile, budget_bytes, **options):
        if profile.n_stages > 4:  # the toy chain of the warm-up has 4 stages
            plan_compile()
        return plan(self, profile, budget_bytes, **options)

    def late_place(self, trace):
        place_compile()
        return place(self, trace)

    def late_run(self, schedule, profile, workload=None):
        run_compile()
        return run(self, schedule, profile, workload)

    monkeypatch.setattr(support.Prefix, "plan", late_plan)
    monkeypatch.setattr(FirstFit, "place", late_place)
    monkeypatch.setattr(Simulator, "run", late_run)
    support.install()
    text = support.SUITE.format(name="jit-late").replace("[keep-all, prefix]", "[prefix]")
    suite = load_suite(support.write_suite(tmp_path, text + "allocators: [first-fit]\n"))
    outcome = run_suite(suite, tmp_path / "r", progress=False)
    rows = [r for r in read_rows_csv(outcome.run_dir / "rows.csv") if r["status"] == "ok"]
    assert set(compiled) == {"plan", "place", "run"} and rows
    for column, kind in (("plan_time_s", "plan"), ("place_time_s", "place"), ("run_time_s", "run")):
        assert max(float(r[column]) for r in rows) < compiled[kind], column


# every planner's warm-up on the toy chain compiles what it plans real chains with: in a fresh
# process (nothing compiled by another test), after harness.case.warm_up, planning ResNet-50 and
# ViT-B/16 (analytic H100 profiles, batch 256) at a quarter and three quarters of their span, on
# the chain model and within the device budget model, adds no signature to any Numba kernel
_NO_NEW_SIGNATURES = textwrap.dedent("""
    import json, sys
    from numba.core.registry import CPUDispatcher
    from harness.bounds import min_memory, peak_memory
    from harness.case import plan_case, warm_up
    from harness.errors import PLUGIN_FAILURES
    from harness.plugins import registry
    from harness.protocols import Workload

    def signatures():
        out = {}
        for name, module in list(sys.modules.items()):
            if name.split(".")[0] == "harness" or name.startswith("membudget_"):
                for obj in list(vars(module).values()):
                    if isinstance(obj, CPUDispatcher):
                        out[obj.py_func.__module__ + "." + obj.py_func.__name__] = set(map(str, obj.signatures))
        return out

    reg = registry()
    planners = {name: reg.planner(name) for name in reg.names("planner")}
    for planner in planners.values():
        warm_up(planner)
    before = signatures()
    for model in ("torchvision:resnet50", "torchvision:vit_b_16"):
        profile = reg.profiler("analytic").profile(Workload(model, 256, (3, 224, 224), "H100"))
        low, high = min_memory(profile), peak_memory(profile)
        for fraction in (0.25, 0.75):
            for planner in planners.values():
                for device_budget in (False, True):
                    try:
                        plan_case(planner, profile, int(low + fraction * (high - low)), device_budget=device_budget)
                    except PLUGIN_FAILURES:
                        pass
    after = signatures()
    print(json.dumps({name: sorted(sigs - before.get(name, set())) for name, sigs in after.items()
                      if sigs - before.get(name, set())}))
""")


def test_the_warm_up_compiles_what_planning_real_chains_compiles():
    """moDNN's segment shrink (a stage whose backward needs part of its output) and recompute's exact
    search (called with ``thin``, which its warm-up left out: another signature, 9.6 s) were compiled
    in the first real plan's time; a kernel a planner reaches only on real chains is named here."""
    done = subprocess.run([sys.executable, "-c", _NO_NEW_SIGNATURES], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}


# in a fresh process, every planner planned on a real chain, within the chain's budget and the device
# budget model: the modules that were first imported while the plan's clock ran
_IMPORTS_WHILE_TIMED = textwrap.dedent("""
    import contextlib, json, sys
    import harness.case as case
    from harness.bounds import min_memory, peak_memory
    from harness.errors import PLUGIN_FAILURES
    from harness.plugins import registry
    from harness.protocols import Workload

    timed, imported, current = case.stopwatch, {}, [None]

    @contextlib.contextmanager
    def watching():
        before = set(sys.modules)
        with timed() as watch:
            yield watch
        new = sorted(set(sys.modules) - before)
        if new:
            imported[current[0]] = new

    case.stopwatch = watching
    reg = registry()
    profile = reg.profiler("analytic").profile(Workload("torchvision:resnet18", 32, (3, 224, 224), "V100-PCIe"))
    budget = (min_memory(profile) + peak_memory(profile)) // 2
    for name in reg.names("planner"):
        for device_budget in (False, True):
            current[0] = f"{name}, device budget {device_budget}"
            try:
                case.plan_case(reg.planner(name), profile, budget, device_budget=device_budget)
            except PLUGIN_FAILURES:
                pass
    print(json.dumps(imported))
""")


def test_the_first_plan_of_a_process_imports_nothing_while_it_is_timed():
    """QA (2026-12-01): the first case of every run reported a plan of 7-17 ms where the same planner
    took 0.3 ms later, whichever planner came first: the import of ``harness.validate`` (and, within a
    device budget, of ``harness.device_memory``) ran on the plan's clock. The warm-up plans as a case
    plans, and the device budget's module is imported before the clock starts."""
    done = subprocess.run([sys.executable, "-c", _IMPORTS_WHILE_TIMED], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}
