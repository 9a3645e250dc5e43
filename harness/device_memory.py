"""One meaning of "budget": the bytes the training process may reserve on the device (issue #16).

A user's budget is the memory their GPU gives the process: what PyTorch's caching
allocator reserves (``torch.cuda.max_memory_reserved``, what
``set_per_process_memory_fraction`` caps). The chain model (papers/004 section 3.1) sees
less than that. What it does not see is set aside here, in one place:

- ``runtime_bytes``: what the framework holds beyond the chain model during an iteration
  (cuBLAS/cuDNN workspaces, autograd temporaries the stages allocate, the chain model's own
  error). Stored in the profile (``Profile.runtime_bytes``), calibrated on the device from
  one keep-all iteration: the reserved bytes it measured minus the caching allocator
  model's arena for the same schedule's chain trace (``calibrate_runtime_bytes``); 0 for an
  analytic profile.
- fragmentation: the caching allocator model (``harness.allocators.caching``, PyTorch's
  rules) applied to the schedule's memory trace simulated as the device runs it (offloads
  after their forward: ``harness.model.DEVICE_OFFLOAD_START``); its arena minus
  the trace's max-live bytes. Under a device budget the process runs capped
  (``set_per_process_memory_fraction``), and PyTorch then releases its cached whole segments
  before it gives up on a request: the arena is the peak reserved under the cap
  (``reserved_under_cap``), and a trace that cannot be served under it needs ``min_cap``.
  Without the cap the model reserves more: on the committed H100 smoke run it predicted 3 of
  the 9 rows that ran (and replan unchanged) to overflow, vdnn-all/dyn/plus at 9.56 GiB; under
  the cap it predicts all 9 to fit and still predicts each of the 12 real out-of-memory rows it
  can replan to overflow (``tests/test_device_memory.py``).

So a schedule's predicted reservation under a device budget B is the caching allocator's
peak under the cap B - ``runtime_bytes``, plus ``runtime_bytes`` (``DeviceMemory``; when the
trace cannot be served under that cap, the smallest cap that serves it plus the runtime, which
is above B). ``plan_for_device`` gives a planner the budget minus the runtime bytes and shrinks
it until the prediction fits (a search: see there), so that a plan the harness calls feasible holds in
the device budget; ``check_fits`` refuses a trace (simulated, or replayed from a real run) that
would exceed a budget, with the number; ``arena_fits`` says whether an allocator's arena holds
in a budget under either budget model (capped, for an allocator that gives cached memory back at a cap).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence, Union

from harness.errors import InfeasibleBudget
from harness.model import MemoryBlock, Profile, Schedule

MAX_ROUNDS = 16  # plans tried before a budget is declared too small for a planner


@dataclass(frozen=True)
class DeviceMemory:
    """A schedule's device memory, by part: what the chain model holds, what the runtime
    adds, what the caching allocator loses to fragmentation."""

    chain_bytes: int
    runtime_bytes: int
    fragmentation_bytes: int

    @property
    def reserved_bytes(self) -> int:
        """The predicted ``max_memory_reserved``: the caching allocator's arena plus the runtime."""
        return self.chain_bytes + self.fragmentation_bytes + self.runtime_bytes

    def describe(self) -> str:
        """``3.2 GiB reserved (chain 2.6 GiB + runtime 190 MiB + fragmentation 400 MiB)``."""
        from harness.units import format_bytes

        return (f"{self.reserved_bytes} bytes ({format_bytes(self.reserved_bytes)}) reserved: chain model "
                f"{format_bytes(self.chain_bytes)} + runtime {format_bytes(self.runtime_bytes)} + "
                f"fragmentation {format_bytes(self.fragmentation_bytes)}")


Trace = Union[Sequence[MemoryBlock], Any]  # MemoryBlocks or an allocators.trace.IntTrace


def device_memory(trace: Trace, runtime_bytes: int = 0, budget: int | None = None) -> DeviceMemory:
    """The parts of the reservation of ``trace`` (the caching allocator model places it).

    ``budget``: the device budget the process runs capped at; the allocator then has
    ``budget - runtime_bytes`` and releases its cached segments at that cap (module docstring).
    None: uncapped, the reservation of a process with the whole device (as a profiler's
    calibration iteration runs)."""
    from harness.allocators.caching import CachingAllocator, min_cap, reserved_under_cap
    from harness.allocators.trace import as_int_trace

    trace = as_int_trace(trace)  # once, for every replay below
    placement = CachingAllocator().place(trace)
    arena = placement.arena_bytes
    if budget is not None and arena + runtime_bytes > budget:
        capped = reserved_under_cap(trace, max(0, budget - int(runtime_bytes)))
        arena = capped if capped is not None else min_cap(trace, placement)
    return DeviceMemory(placement.max_live_bytes, int(runtime_bytes), arena - placement.max_live_bytes)


def check_fits(trace: Trace, budget: int, runtime_bytes: int = 0, what: str = "the trace") -> DeviceMemory:
    """The trace's ``DeviceMemory`` under the cap of ``budget``; ``InfeasibleBudget`` (with the
    bytes needed) when it exceeds ``budget``."""
    memory = device_memory(trace, runtime_bytes, budget)
    if memory.reserved_bytes > budget:
        raise InfeasibleBudget(f"{what} needs {memory.describe()}, above the budget of {budget} bytes",
                               needed_bytes=memory.reserved_bytes)
    return memory


def arena_reservation(arena_bytes: Any, runtime_bytes: Any, device_budget: bool) -> Any:
    """What an allocator's arena makes the process hold against the budget (numbers or pandas columns).

    Under the chain model (papers/004's M) the arena alone is what the budget bounds. Under a
    device budget the process reserves the arena plus the runtime bytes the chain model does
    not see (as in ``DeviceMemory.reserved_bytes``).
    """
    return arena_bytes + runtime_bytes if device_budget else arena_bytes


def arena_fits(arena_bytes: int, budget: int, runtime_bytes: int, device_budget: bool,
               serves_under_cap: Callable[[int], bool] | None = None) -> bool:
    """Whether an allocator's arena holds in ``budget`` under the suite's budget model (``arena_reservation``).

    ``serves_under_cap``: for an allocator that gives cached memory back when the process reaches a cap
    (the optional ``Allocator.serves_under_cap``: PyTorch's caching allocator under
    ``set_per_process_memory_fraction``), whether it serves the trace capped at so many bytes. Its arena
    is then what an uncapped process reserves, and an arena above the budget still fits when the trace
    is served capped at the budget (less the runtime bytes under a device budget)."""
    if arena_reservation(arena_bytes, runtime_bytes, device_budget) <= budget:
        return True
    cap = budget - (int(runtime_bytes) if device_budget else 0)
    return serves_under_cap is not None and cap > 0 and serves_under_cap(cap)


def keep_all_memory(profile: Profile, duplex: bool = False) -> DeviceMemory:
    """``DeviceMemory`` of the keep-all iteration of ``profile`` (no budget)."""
    from harness.bounds import peak_memory
    from harness.schedules import keep_all_schedule
    from harness.simulate.executor import simulate

    schedule = keep_all_schedule(profile, peak_memory(profile))
    return device_memory(simulate(schedule, profile, duplex=duplex).trace, profile.runtime_bytes)


def calibrate_runtime_bytes(profile: Profile, measured_reserved_bytes: int) -> int:
    """The runtime bytes of a device: a keep-all iteration's measured reservation minus the caching
    allocator model's arena for its chain trace (never below 0)."""
    model = keep_all_memory(profile)
    return max(0, int(measured_reserved_bytes) - model.chain_bytes - model.fragmentation_bytes)


@dataclass(frozen=True)
class DevicePlan:
    """A schedule planned to hold in a device budget: the chain budget it was planned for and its memory."""

    schedule: Schedule
    planning_budget: int
    memory: DeviceMemory | None  # None when the simulator could not run the schedule
    makespan: float = float("inf")  # the simulated iteration time, as the device runs it


def plan_for_device(planner: Any, profile: Profile, budget: int, options: dict[str, Any] | None = None,
                    duplex: bool = False) -> DevicePlan:
    """Plan so that the predicted reservation holds in ``budget`` (device bytes).

    The planner first gets ``budget - profile.runtime_bytes``. While the caching allocator
    model's arena of the simulated trace plus the runtime bytes exceeds ``budget``, the chain
    budget steps down: by the excess while the reservation follows the chain budget down, by
    twice the last step while it does not (a plan's fragmentation can grow as its chain bytes
    shrink, so that an excess of a few MiB stays put over many small steps). Once a plan fits,
    the chain budget is bisected between it and the last one that did not; the plan kept is the
    fastest found to fit, as the device runs it (fragmentation is not monotone in the budget, so
    this is a search, not a formula, and a smaller chain budget's plan, timed by the device's
    rule for offloads rather than the one its planner planned by, may be the faster). A step
    below the planner's minimum, which the planner refuses, is followed by a plan at that
    minimum (``InfeasibleBudget.needed_bytes``):
    its leanest plan; when that plan does not fit either, the search ends there (a plan between it
    and the last one too big might fit, fragmentation being what it is, but is not looked for). A plan
    the simulator cannot run counts as too big. At most ``MAX_ROUNDS`` plans.

    When no plan fits, ``InfeasibleBudget`` says what the leanest plan tried would reserve (its
    ``needed_bytes``: the smallest cap that plan runs under, plus the runtime); when the
    planner refuses the first chain budget already, the same of its plan at the minimum it
    names (or that minimum plus the runtime bytes, if that plan cannot be made; and the plan itself
    when it fits after all, a minimum that was loose).
    """
    options = options or {}
    precision = max(1, budget // 1000)
    search = _Search(budget - profile.runtime_bytes, precision)
    tried: list[DevicePlan] = []
    unrunnable: DevicePlan | None = None  # the first plan the simulator could not run
    first_refusal: InfeasibleBudget | None = None
    for _ in range(MAX_ROUNDS):
        if search.planning is None:
            break
        planning = search.planning
        try:
            plan = _plan_once(planner, profile, budget, planning, options, duplex)
        except InfeasibleBudget as exc:
            minimum = getattr(exc, "chain_minimum", None)
            if first_refusal is not None:
                break  # not even at the minimum it named
            if search.too_big is None and not tried and unrunnable is None:
                first_refusal = exc
                search.planning = minimum if minimum is not None and minimum > planning else None
                continue
            search.refused(planning, minimum)
            continue
        if first_refusal is not None:  # the plan at the planner's minimum
            if plan.memory is not None and plan.memory.reserved_bytes <= budget:
                return plan  # the minimum the planner named was loose: its leanest plan fits
            if plan.memory is not None:
                tried.append(plan)
            break
        if plan.memory is None:  # the simulator cannot run it: smaller chain budgets may run
            unrunnable = unrunnable or plan
            search.unrunnable(planning)
            continue
        tried.append(plan)
        search.judged(plan, plan.memory.reserved_bytes - budget)
    if search.best is not None:
        return search.best
    leanest = min((p.memory for p in tried), key=lambda m: m.reserved_bytes, default=None)
    if first_refusal is not None:
        if leanest is None:
            raise first_refusal
        raise InfeasibleBudget(f"{first_refusal}; its plan at that minimum would need {leanest.describe()}",
                               needed_bytes=leanest.reserved_bytes)
    if leanest is None and unrunnable is not None:
        return unrunnable  # nothing the simulator could run: the executor reports why
    if leanest is not None:
        needed_bytes, said = leanest.reserved_bytes, f"; the leanest plan it tried needs {leanest.describe()}"
    else:  # the runtime bytes leave no chain budget at all
        from harness.bounds import min_memory

        needed_bytes = max(budget + 1, profile.runtime_bytes + min_memory(profile))
        said = f"; the runtime bytes alone are {profile.runtime_bytes}"
    raise InfeasibleBudget(f"{getattr(planner, 'name', 'the planner')} finds no plan whose predicted reservation "
                           f"holds in the device budget of {budget} bytes{said}", needed_bytes=needed_bytes)


class _Search:
    """The chain budgets ``plan_for_device`` tries, from what each plan reserved (see there)."""

    def __init__(self, planning: int, precision: int):
        self.planning: int | None = planning if planning > 0 else None
        self.precision = precision
        self.best: DevicePlan | None = None  # the fastest fitting plan (of the largest chain budget among equals)
        self.fits: int | None = None  # the largest chain budget whose plan fits
        self.too_big: int | None = None  # the smallest chain budget whose plan did not fit
        self.floor: int | None = None  # the largest chain budget the planner refused
        self._step = 0
        self._last: tuple[int, int] | None = None  # (chain budget, reservation) of the last plan too big

    def judged(self, plan: DevicePlan, excess: int) -> None:
        planning, reserved = plan.planning_budget, plan.memory.reserved_bytes
        if excess <= 0:
            self.fits = planning if self.fits is None else max(self.fits, planning)
            if self.best is None or (plan.makespan, -planning) < (self.best.makespan, -self.best.planning_budget):
                self.best = plan
            if self.too_big is None:
                self.planning = None  # the first chain budget fits: nothing to gain above it
                return
            self._bisect()
        else:
            following = self._last is None or self._last[1] - reserved >= (self._last[0] - planning) // 2
            self._last = (planning, reserved)
            self._too_big(planning, max(excess, self.precision) if following else max(excess, 2 * self._step))

    def refused(self, planning: int, minimum: int | None) -> None:
        """The planner refused ``planning``; ``minimum``: the chain budget it says it needs (it
        refuses every budget below it, so only ``minimum`` and above are left to try)."""
        floor = minimum - 1 if minimum is not None and minimum > planning else planning
        self.floor = floor if self.floor is None else max(self.floor, floor)
        if self.best is None and minimum is not None and planning < minimum and (
                self.too_big is None or minimum < self.too_big):
            self._next(minimum)  # its leanest plan
            return
        self._bisect()

    def unrunnable(self, planning: int) -> None:
        """The simulator could not run the plan of ``planning``: counted as too big, and stepped past."""
        self._too_big(planning, max(2 * self._step, self.precision))

    def _too_big(self, planning: int, step: int) -> None:
        """``planning``'s plan does not fit: down by ``step`` while nothing bounds the search below, else bisect."""
        self.too_big = planning if self.too_big is None else min(self.too_big, planning)
        if self.best is None and self.floor is None:
            self._step = step
            self._next(planning - step)
        else:
            self._bisect()

    def _bisect(self) -> None:
        lower = max(b for b in (self.fits, self.floor) if b is not None)
        if self.too_big - lower <= self.precision:
            self.planning = None
        else:
            self.planning = (lower + self.too_big) // 2

    def _next(self, planning: int) -> None:
        if self.floor is not None and planning <= self.floor:
            self._bisect()
        else:  # never below one byte: the planner's refusal there names its minimum, planned next
            planning = max(planning, 1)
            self.planning = planning if self.too_big is None or planning < self.too_big else None


def _plan_once(planner: Any, profile: Profile, budget: int, planning: int, options: dict[str, Any],
               duplex: bool) -> DevicePlan:
    from harness.schedules import checked_plan
    from harness.simulate.executor import simulate

    try:  # checked before the simulator trusts its budget_bytes
        # planned for the device budget: the simulator runs it as the device does (``offload_start_of``)
        schedule = replace(checked_plan(planner, profile, planning, options), device_budget_bytes=budget)
    except InfeasibleBudget as exc:
        needed = None if exc.needed_bytes is None else exc.needed_bytes + (budget - planning)
        refusal = InfeasibleBudget(f"{exc} (the chain budget of {planning} bytes it was given for the device "
                                   f"budget of {budget} bytes, its {profile.runtime_bytes} runtime bytes and room for "
                                   "fragmentation set aside)", needed_bytes=needed)
        refusal.chain_minimum = exc.needed_bytes  # the chain budget the planner said it needs
        raise refusal from None
    run = simulate(schedule, profile, duplex=duplex)
    if not run.feasible:
        return DevicePlan(schedule, planning, None)
    return DevicePlan(schedule, planning, device_memory(run.trace, profile.runtime_bytes, budget), run.makespan)
