"""Compile the Numba kernels a GPU call will use into Numba's on-disk cache, beside the GPU jobs.

    python benchmarks/gpu/warm_kernels.py

benchmarks/gpu/session.sh starts it in the background as soon as its Python is ready. A fresh GPU
machine has no Numba cache (it is not in the copied tree, and a cache is only good for the CPU and
Python it was made on), so the first case of each planner in the smoke run compiled its kernels
on the clock of the call: about a minute for all planners and allocators on the 2-core development
machine (56-65 s from an empty cache), most of it hybrid, bestfit and dynprog. Every kernel is
``cache=True``, so what this process compiles while the GPU runs the planned job, later processes
(the suite's runner, the planned runs) load instead of compiling.

It runs every registered planner as a case on the toy chain ``tiny_chain`` (planning a case first
warms the planner up, ``harness.case.warm_up``: the chain's peak, half-way and minimum budgets): at the peak, and
at the peak and half-way within the device budget model (the simulator's, the validator's and the
allocator model's kernels), and places keep-all's trace (its case at the peak) with
every registered allocator right after keep-all (so that bestfit, which the planned job's processes
place with, is compiled early). Nothing is written but the cache; a planner or allocator that fails
on the toy chain (an error row, for a planner) is named on stderr and skipped; an allocator whose optional
package is not installed (the exact allocator's OR-Tools, which the GPU image lacks) is named "skipped". Prints one line per planner and allocator with the
seconds it took.
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    from harness.bounds import min_memory, peak_memory
    from harness.case import run_case, tiny_chain
    from harness.errors import MissingDependency
    from harness.plugins import registry

    started = time.perf_counter()
    reg = registry()
    simulate = reg.executor("simulate")
    tiny = tiny_chain()
    lo, hi = min_memory(tiny), peak_memory(tiny)

    def warm_planner(name: str):
        """Compile ``name``'s kernels; its trace at the peak (None when it failed)."""
        t0 = time.perf_counter()
        planner = reg.planner(name)
        trace = None
        # as cases: planning warms the planner up first (harness.case.warm_up: the toy chain's peak,
        # half-way and minimum budgets), then the simulator, the validator and the device budget model
        for budget, device_budget in ((hi, False), (hi, True), ((lo + hi) // 2, True)):
            outcome = run_case(planner, tiny, budget, simulate, None, device_budget=device_budget)
            if outcome.fields.get("status") == "error":  # run_case makes a planner's exception a row
                print(f"warm: planner {name} failed on the toy chain: {outcome.fields.get('message')}",
                      file=sys.stderr)
                return None
            trace = trace or (outcome.run.trace if outcome.run is not None else None)
        print(f"warm: planner {name} {time.perf_counter() - t0:.1f} s", flush=True)
        return trace

    # keep-all first: its trace lets the allocators (bestfit: the planned job's) compile next
    planners = sorted(reg.names("planner"), key=lambda name: name != "keep-all")
    trace = warm_planner(planners[0])
    for name in reg.names("allocator") if trace else ():
        t0 = time.perf_counter()
        try:
            reg.allocator(name).place(trace)
        except MissingDependency as exc:  # the GPU image has no OR-Tools: the exact allocator has nothing to warm
            print(f"warm: allocator {name} skipped: {exc}", flush=True)
            continue
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
