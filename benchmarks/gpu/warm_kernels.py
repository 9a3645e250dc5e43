"""Compile the Numba kernels a GPU call will use into Numba's on-disk cache, beside the GPU jobs.

    python benchmarks/gpu/warm_kernels.py

benchmarks/gpu/session.sh starts it in the background as soon as its Python is ready. A fresh GPU
machine has no Numba cache (it is not in the copied tree, and a cache is only good for the CPU and
Python it was made on), so the first case of each planner in the smoke run compiled its kernels
on the clock of the call: about a minute for all planners and allocators on the 2-core development
machine, most of it hybrid (30 s), dynprog (12 s) and bestfit (8 s). Every kernel is ``cache=True``, so what this process compiles while the GPU runs the
planned job, later processes (the suite's runner, the planned runs) load instead of compiling.

It plans a four-stage toy chain with every registered planner at its peak, half-way and minimum
budgets, with and without the device budget model, runs each schedule in the simulator (the
simulator's, the validator's and the allocator model's kernels), and places keep-all's trace with
every registered allocator right after keep-all (so that bestfit, which the planned job's processes
place with, is compiled early). Nothing is written but the cache; a planner or allocator that fails
on the toy chain (an error row, for a planner) is named on stderr and skipped. Prints one line per planner and allocator with the
seconds it took.
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    from harness.bounds import min_memory, peak_memory
    from harness.case import _tiny_chain, run_case
    from harness.plugins import registry

    started = time.perf_counter()
    reg = registry()
    simulate = reg.executor("simulate")
    tiny = _tiny_chain()
    lo, hi = min_memory(tiny), peak_memory(tiny)
    traces = []

    def warm_planner(name: str) -> None:
        t0 = time.perf_counter()
        for budget in (hi, (lo + hi) // 2, lo):
            for device_budget in (False, True):
                outcome = run_case(reg.planner(name), tiny, budget, simulate, None, device_budget=device_budget)
                if outcome.fields.get("status") == "error":  # run_case makes a planner's exception a row
                    print(f"warm: planner {name} failed on the toy chain: {outcome.fields.get('message')}",
                          file=sys.stderr)
                    return
                if outcome.run is not None and outcome.run.trace:
                    traces.append(outcome.run.trace)
        print(f"warm: planner {name} {time.perf_counter() - t0:.1f} s", flush=True)

    # keep-all first: its trace lets the allocators (bestfit: the planned job's) compile next
    planners = sorted(reg.names("planner"), key=lambda name: name != "keep-all")
    warm_planner(planners[0])
    for name in reg.names("allocator") if traces else ():
        t0 = time.perf_counter()
        try:
            reg.allocator(name).place(max(traces, key=len))
        except Exception as exc:  # noqa: BLE001 -- warming is best effort: name it and go on
            print(f"warm: allocator {name} failed on the toy trace: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        print(f"warm: allocator {name} {time.perf_counter() - t0:.1f} s", flush=True)
    for name in planners[1:]:
        warm_planner(name)
    print(f"warm: {time.perf_counter() - started:.1f} s in all", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
