"""What a PyTorch user would reach for instead, as planners that share the results table.

- ``torch-save-on-cpu``: ``torch.autograd.graph.save_on_cpu``: every saved tensor is
  copied to the host as the forward saves it (the compute waits for the copy) and
  copied back when the backward unpacks it (the backward waits again): no overlap.
  As a schedule: every stage offloaded when its forward ends, each offload awaited by
  the next operation, each prefetch issued at the end of the operation before the
  backward that needs it and awaited by it.
  The torch executor runs its transfers like any schedule's; to run a schedule's
  saved data through PyTorch's own hooks instead, use the ``torch-save-on-cpu``
  executor (``TorchExecutor(save_on_cpu=True)``; note that ``save_on_cpu`` also copies
  the weights a backward saves, which the chain model does not count).
- ``torch-checkpoint``: activation checkpointing as ``torch.utils.checkpoint``
  (non-reentrant) does it, over segments of k stages, every segment but the last (as
  ``checkpoint_sequential`` does); k = ceil(sqrt(L)) by default, the usual choice
  (Chen et al. 2016), or ``every=auto`` for the fastest k that fits the budget. The
  schedule says it with operations (``harness.schedules.recompute_ops``): the first
  stage of a segment keeps its input (``Fc``), the others save nothing (``Fn``), and the
  segment is recomputed (``R``) just before the backward of its last stage.
"""

from __future__ import annotations

import math

from harness.errors import InfeasibleBudget, OptionValueError
from harness.model import Profile, Schedule, Transfer, training_ops
from harness.schedules import check_budget, op_index, recompute_ops, unconstrained_peak
from harness.units import format_bytes


def _fits(schedule: Schedule, profile: Profile, budget: int, what: str) -> None:
    """Raise ``InfeasibleBudget`` ("needs at least N bytes") if ``schedule`` does not fit."""
    from harness.simulate.executor import timing

    _, tm = timing(schedule, profile, budget=budget)
    if tm.ok:
        return
    need = unconstrained_peak(schedule, profile)
    raise InfeasibleBudget(
        f"infeasible: {what} needs at least {need} bytes ({format_bytes(need)}) for {profile.model} at batch "
        f"{profile.batch_size}; the budget is {budget} bytes ({format_bytes(budget)})",
        needed_bytes=need,
    )


class TorchSaveOnCpu:
    """Offload every saved tensor, synchronously, as ``torch.autograd.graph.save_on_cpu`` does."""

    name = "torch-save-on-cpu"
    description = "PyTorch's save_on_cpu: offload everything, compute waits for every copy (no overlap)"
    extra_options = ()

    def plan(self, profile: Profile, budget_bytes: int, **options) -> Schedule:
        """The save_on_cpu schedule; ``InfeasibleBudget`` if even that does not fit."""
        if options:
            raise TypeError(f"{self.name} takes no options, got {sorted(options)}")
        check_budget(profile, budget_bytes, self.name)
        schedule = save_on_cpu_schedule(profile, budget_bytes, self.name)
        _fits(schedule, profile, budget_bytes, self.name)
        return schedule


def save_on_cpu_schedule(profile: Profile, budget: int, planner: str = "torch-save-on-cpu") -> Schedule:
    """Every stage that saves data offloaded at the end of F_i (awaited by the next operation)
    and back at the end of the operation before B_i (awaited by B_i): no copy overlaps compute.

    save_on_cpu copies each tensor as it is packed, on the compute stream; issuing the
    offload when F_i ends and making F_{i+1} wait for it charges that time in full.
    """
    n = profile.n_stages
    ops = training_ops(n)
    where = op_index(ops)
    stages = [i for i, s in enumerate(profile.stages) if s.saved_bytes > 0]
    transfers = []
    for i in stages:
        wait = where[("F", i + 1, 0)] if i + 1 < n else where[("B", n - 1, 0)]
        transfers.append(Transfer(i, "offload", where[("F", i, 0)], "end", wait))
    for i in reversed(stages):
        before = where[("B", i, 0)] - 1
        transfers.append(Transfer(i, "prefetch", before, "end", where[("B", i, 0)]))
    return Schedule(planner, int(budget), ops, tuple(transfers), options={"sync": True},
                    notes="torch.autograd.graph.save_on_cpu: synchronous offload of everything, fetched on use")


class TorchCheckpoint:
    """Activation checkpointing (``torch.utils.checkpoint``) every k stages; k = ceil(sqrt(L)) by default.

    Options: ``every`` (an int k, ``"sqrt"`` or ``"auto"``: the fastest k that fits).
    """

    name = "torch-checkpoint"
    description = "PyTorch's activation checkpointing: segments of k stages recomputed in the backward (k=sqrt(L))"

    def plan(self, profile: Profile, budget_bytes: int, every: int | str = "sqrt", **options) -> Schedule:
        """The checkpointing schedule; ``InfeasibleBudget`` when it does not fit the budget."""
        if options:
            raise TypeError(f"{self.name} takes only the option 'every', got {sorted(options)}")
        check_budget(profile, budget_bytes, self.name)
        n = profile.n_stages
        if every == "auto":
            return self._fastest(profile, budget_bytes)
        if every != "sqrt" and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise OptionValueError(f"{self.name}: option every is 'sqrt', 'auto' or a whole number >= 1, "
                                   f"got {every!r}")
        k = math.ceil(math.sqrt(n)) if every == "sqrt" else every
        schedule = checkpoint_schedule(profile, budget_bytes, k, self.name)
        _fits(schedule, profile, budget_bytes, f"{self.name} (every {k} stages)")
        return schedule

    def _fastest(self, profile: Profile, budget: int) -> Schedule:
        from harness.simulate.executor import makespan

        best, best_time = None, math.inf
        for k in range(1, profile.n_stages + 1):
            schedule = checkpoint_schedule(profile, budget, k, self.name)
            time = makespan(schedule, profile, budget=budget)
            if time is not None and time < best_time:
                best, best_time = schedule, time
        if best is None:
            schedule = checkpoint_schedule(profile, budget, 1, self.name)
            _fits(schedule, profile, budget, f"{self.name} (every stage)")
        return best


def checkpoint_schedule(profile: Profile, budget: int, every: int, planner: str = "torch-checkpoint") -> Schedule:
    """Segments [0, k), [k, 2k), ... checkpointed, all but the last one (``checkpoint_sequential``)."""
    n = profile.n_stages
    segments = checkpoint_segments(n, every)
    return Schedule(planner, int(budget), recompute_ops(n, segments), options={"every": every},
                    notes=f"checkpoint every {every} stages: {len(segments)} recomputed segments")


def checkpoint_segments(n_stages: int, every: int) -> list[tuple[int, int]]:
    """The segments [0, k), [k, 2k), ... of ``checkpoint_sequential`` over ``n_stages``, all but the last."""
    bounds = list(range(0, n_stages, every)) + [n_stages]
    return list(zip(bounds, bounds[1:]))[:-1]
