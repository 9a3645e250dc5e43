"""The planners ``modnn`` (papers/000 section IV) and ``vdnn-plus`` (section V.B)."""

from __future__ import annotations

import math
from dataclasses import replace

from harness.bounds import peak_memory
from harness.errors import InfeasibleBudget
from harness.model import Profile, Schedule, Transfer, training_ops
from harness.options import choice_option, int_option
from harness.schedules import keep_all_schedule
from harness.simulate.executor import makespan
from harness.units import format_bytes
from membudget_modnn.scheduler import Algorithm1, PlanningError, SubBatchPlan, check_defragment
from membudget_modnn.subbatch import SubBatching, baseline_algorithm, m_min, max_task_bytes, select_sub_batch


def replicate(plan_transfers: list[Transfer], n_stages: int, sub_batches: int) -> tuple[Transfer, ...]:
    """One sub-batch's transfers repeated for every pass (each pass starts from an empty device)."""
    per = 2 * n_stages
    return tuple(
        Transfer(t.stage, t.direction, t.issue_op + sb * per, t.issue_at, None if t.wait_op is None else t.wait_op + sb * per,
                 sb, t.nbytes)
        for sb in range(sub_batches) for t in plan_transfers
    )


def makespan_of(schedule: Schedule, profile: Profile, duplex: bool) -> float | None:
    """The simulated makespan (None: the simulator cannot run it)."""
    return makespan(schedule, profile, duplex=duplex)


def safe_transfers(profile: Profile) -> list[Transfer]:
    """Offload every saved tensor during its F, prefetch it just before its B: fits any budget >= the task maximum.

    The fallback when Algorithm 1's plan does not run in the simulator (it never should;
    the schedule's notes say when it happened).
    """
    n = profile.n_stages
    out = [Transfer(i, "offload", i, "start") for i in range(n) if profile.stages[i].saved_bytes > 0]
    out += [Transfer(i, "prefetch", 2 * n - 2 - i, "end") for i in reversed(range(n)) if profile.stages[i].saved_bytes > 0]
    return out


SUB_BATCH_MODES = ("eq3", "search")
MAX_SEARCH = 12


def passes_to_fit(profile: Profile, budget: int, first: int) -> int:
    """The fewest passes (>= ``first``) whose sub-batch runs keep-all within ``budget`` (the batch size if none)."""
    batch = profile.batch_size
    lo, hi, best = first, batch, batch
    while lo <= hi:
        mid = (lo + hi) // 2
        if peak_memory(profile.at_batch(math.ceil(batch / mid))) <= budget:
            best, hi = mid, mid - 1
        else:
            lo = mid + 1
    return best


class MoDNN:
    """moDNN (Chen, Chen, Hu, DATE 2018): sub-batching (eq. 3), Algorithm 1, algorithm selection (eq. 5).

    Options: ``duplex`` (the copy engines the schedule is planned for); ``sub_batch``:
    ``eq3`` (the paper: eq. (3)'s sub-batch) or ``search`` (an extension, not in the
    paper: also plan with more passes, up to the fewest at which a pass needs no
    offloading, and keep the fastest in the simulator; eq. (3) takes the largest
    sub-batch, which pays off when small sub-batches run slower, and costs headroom
    when they do not); ``sub_batches`` (force the number of passes); ``select_algorithms``
    (False: every stage keeps its baseline algorithm); ``defragment``: when no offloading
    scheme exists, ``enough`` (ours, the default) offloads the earliest blocks until the
    compacted memory holds the request, ``all`` offloads every block as the paper's text
    says (IV.B: "offloading all data and then reloading required data").
    """

    name = "modnn"
    description = "moDNN (Chen et al. 2018): sub-batch selection, linked-list offload/prefetch scheduling, conv algorithm choice"

    def plan(self, profile: Profile, budget_bytes: int, duplex: bool = False, sub_batch: str = "eq3",
             sub_batches: int | None = None, select_algorithms: bool = True, defragment: str = "enough",
             **options) -> Schedule:
        """A schedule for ``budget_bytes``; ``InfeasibleBudget`` below M_min (eq. 2)."""
        check_defragment(defragment)  # also where the keep-all shortcut below skips Algorithm 1
        choice_option(self.name, "sub_batch", sub_batch, SUB_BATCH_MODES)
        budget = int(budget_bytes)
        if sub_batches is None and budget >= peak_memory(profile):
            # papers/000 III.A: moDNN steps in when the memory cannot hold everything
            return keep_all_schedule(profile, budget, self.name)
        sb = self._sub_batching(profile, budget, sub_batches)
        best, best_time = self._plan_passes(profile, budget, sb, duplex, select_algorithms, defragment)
        if sub_batch == "search" and sub_batches is None:
            last = passes_to_fit(profile, budget, sb.sub_batches)
            span = range(sb.sub_batches + 1, last + 1)
            step = max(1, math.ceil(len(span) / MAX_SEARCH))
            tried = {sb.sub_batch}
            for n in list(span[::step]) + [last]:
                sub = math.ceil(profile.batch_size / n)
                if sub in tried:
                    continue
                tried.add(sub)
                trial = SubBatching(sub, math.ceil(profile.batch_size / sub), sb.iterations, profile.at_batch(sub))
                schedule, makespan = self._plan_passes(profile, budget, trial, duplex, select_algorithms, defragment)
                if makespan < best_time * (1 - 1e-12):
                    best, best_time = schedule, makespan
            best = replace(best, options={**best.options, "sub_batch_mode": "search"},
                           notes=best.notes + f"; searched {len(tried)} sub-batch sizes from eq. (3)'s {sb.sub_batch}")
        return replace(best, options={**best.options, "defragment": defragment})

    def _plan_passes(self, profile: Profile, budget: int, sb: SubBatching, duplex: bool,
                     select_algorithms: bool, defragment: str) -> tuple[Schedule, float]:
        """Algorithm 1 on one pass, repeated; checked in the simulator (fallback when it cannot run)."""
        try:
            plan = Algorithm1(sb.profile, budget, duplex, select_algorithms, defragment).run()
            fallback = ""
        except PlanningError as exc:
            plan, fallback = None, f"Algorithm 1 failed ({exc})"
        schedule = self._schedule(profile, budget, sb, plan, duplex, select_algorithms)
        makespan = makespan_of(schedule, profile, duplex) if plan is not None else None
        if sb.sub_batches > 1 and peak_memory(sb.profile) <= budget:
            # papers/000 III.A: moDNN steps in when the memory cannot hold everything, and IV.B's
            # objective (2) is to minimise offloading: when a whole pass fits the budget there is
            # nothing to offload. Algorithm 1's linked list can still offload there, to undo the
            # fragmentation of its address model, which eq. (3)'s sub-batch (the largest whose
            # heaviest task fits, so little headroom) makes likely; the simulator counts bytes.
            # The pass without transfers is kept when it is not slower.
            plain = self._schedule(profile, budget, sb, None, duplex, select_algorithms, keep_all=True)
            plain_time = makespan_of(plain, profile, duplex)
            if plain_time is not None and (makespan is None or plain_time <= makespan):
                return plain, plain_time
        if makespan is None:
            fallback = fallback or "the simulator could not run Algorithm 1's plan"
            schedule = self._schedule(profile, budget, sb, None, duplex, select_algorithms, fallback)
            makespan = makespan_of(schedule, profile, duplex)
        return schedule, makespan if makespan is not None else math.inf

    def _sub_batching(self, profile: Profile, budget: int, forced: int | None) -> SubBatching:
        if forced is None:
            return select_sub_batch(profile, budget, self.name)
        forced = int_option(self.name, "sub_batches", forced, 1)
        if not 1 <= forced <= profile.batch_size:
            raise ValueError(f"sub_batches must be between 1 and the batch size {profile.batch_size}, got {forced}")
        select_sub_batch(profile, budget, self.name)  # the M_min check
        sub = math.ceil(profile.batch_size / forced)
        need = profile.weight_bytes + max_task_bytes(profile.at_batch(sub), fastest=False)  # eq. (1), baseline
        if need > budget:
            raise InfeasibleBudget(
                f"infeasible: {self.name} with {forced} passes of {sub} needs at least {need} bytes "
                f"({format_bytes(need)}) for its heaviest task (papers/000 eq. 1); the budget is {budget} bytes",
                needed_bytes=need)
        return SubBatching(sub, forced, (), profile.at_batch(sub))

    def _schedule(self, profile: Profile, budget: int, sb: SubBatching, plan: SubBatchPlan | None, duplex: bool,
                  select_algorithms: bool, fallback: str = "", keep_all: bool = False) -> Schedule:
        p, n = sb.profile, profile.n_stages
        if keep_all:  # every pass holds all its data: no transfers, the stages' default algorithms
            transfers, algorithms, estimate, defrags = [], (-1,) * n, None, 0
        elif plan is None:
            transfers = safe_transfers(p)
            algorithms = tuple(baseline_algorithm(p, i) for i in range(n))
            estimate, defrags = None, 0  # no estimate (None, not NaN: schedules must compare equal)
        else:
            transfers = plan.transfers()
            algorithms, estimate, defrags = plan.algorithms, plan.makespan * sb.sub_batches, plan.defragmentations
        notes = [f"sub-batch {sb.sub_batch} x {sb.sub_batches} (eq. 3 rounds: {list(sb.iterations)})",
                 f"M_min {format_bytes(m_min(profile))}", f"defragmentations per pass: {defrags}"]
        if "derived_from" in p.notes and sb.sub_batches > 1:
            notes.append(f"sub-batch profile {p.notes['derived_from']}")
        if keep_all:
            notes.append("a whole pass fits the budget: no transfers (papers/000 III.A)")
        if fallback:
            notes.append(f"fallback to offload-all, just-in-time prefetch: {fallback}")
        return Schedule(
            planner=self.name, budget_bytes=budget, ops=training_ops(n, sb.sub_batches),
            transfers=replicate(transfers, n, sb.sub_batches),
            algorithms=algorithms if any(a != -1 for a in algorithms) else (),
            sub_batches=sb.sub_batches,
            options={"duplex": duplex, "sub_batch": sb.sub_batch, "estimated_makespan": estimate,
                     "select_algorithms": select_algorithms, "fallback": bool(fallback), "keep_all_passes": keep_all},
            notes="; ".join(notes),
        )


def static_vdnn_need(profile: Profile, *, duplex: bool = False) -> int:
    """The fewest bytes any of ``best_static_vdnn``'s configurations needs on ``profile``."""
    from membudget_vdnn import algorithm_choice, offload_set, synchronous

    return min(synchronous(profile, 0, offload_set(profile, policy), algorithm_choice(profile, mode),
                           planner="vdnn", duplex=duplex).needed
               for policy in ("conv", "all") for mode in ("performance", "memory"))


def best_static_vdnn(profile: Profile, budget: int, *, planner: str = "vdnn", duplex: bool = False) -> Schedule | None:
    """vDNN as papers/000 describes it: offload all layers or all CONV layers, fastest algorithms.

    Built from membudget-vdnn's static vDNN (papers/001 section 3.4, every transfer
    synchronised at its layer's end): the configurations vDNN_conv and vDNN_all, each
    with the fastest algorithms and, when those do not fit, the memory-optimal ones; the
    fastest one that fits ``budget`` in the simulator (None when none does). The policy
    applies whatever the budget, as static vDNN does.
    """
    from membudget_vdnn import algorithm_choice, offload_set, synchronous

    best, best_time = None, math.inf
    for policy in ("conv", "all"):
        for mode in ("performance", "memory"):
            attempt = synchronous(profile, budget, offload_set(profile, policy), algorithm_choice(profile, mode),
                                  planner=planner, duplex=duplex, options={"offload": policy, "algorithms": mode})
            if not attempt.ok:
                continue
            makespan = makespan_of(attempt.schedule, profile, duplex)
            if makespan is not None and makespan < best_time:
                best, best_time = attempt.schedule, makespan
            break  # the memory-optimal algorithms only when the fastest do not fit
    return best


class VDNNPlus:
    """vDNN+ (papers/000 section V.B): vDNN with moDNN's sub-batch selection.

    vDNN is ``best_static_vdnn`` (vDNN_conv or vDNN_all on membudget-vdnn, fastest
    algorithms). It runs on the sub-batch that eq. (3) selects; when vDNN does not fit at
    that size (it also holds the data it prefetches for the next layer, which eq. (1)
    does not count), the number of passes grows to the fewest at which it does. A budget
    that holds the whole iteration gets the plain keep-all iteration. Options: ``duplex``.
    """

    name = "vdnn-plus"
    description = "vDNN+ (Chen et al. 2018, V.B): static vDNN (all/conv layers, synchronous) with moDNN's sub-batching"

    def plan(self, profile: Profile, budget_bytes: int, duplex: bool = False, **options) -> Schedule:
        """A schedule for ``budget_bytes``; ``InfeasibleBudget`` when no sub-batch lets vDNN fit."""
        budget = int(budget_bytes)
        if budget >= peak_memory(profile):
            return keep_all_schedule(profile, budget, self.name)
        sb = select_sub_batch(profile, budget, self.name)
        batch = profile.batch_size

        def attempt(n: int) -> Schedule | None:
            return best_static_vdnn(profile.at_batch(math.ceil(batch / n)), budget, planner=self.name, duplex=duplex)

        # the fewest passes, from eq. (3)'s, at which vDNN fits (its memory shrinks with the sub-batch)
        n, found = sb.sub_batches, attempt(sb.sub_batches)
        if found is None:
            lo, hi = sb.sub_batches + 1, batch
            while lo <= hi:
                mid = (lo + hi) // 2
                trial = attempt(mid)
                if trial is not None:
                    n, found, hi = mid, trial, mid - 1
                else:
                    lo = mid + 1
        if found is None:
            need = static_vdnn_need(profile.at_batch(1), duplex=duplex)
            raise InfeasibleBudget(
                f"infeasible: {self.name} needs at least {need} bytes ({format_bytes(need)}) for "
                f"{profile.model}: vDNN's schedule does not fit {budget} bytes ({format_bytes(budget)}) even at "
                f"sub-batch 1",
                needed_bytes=need,
            )
        sub = math.ceil(batch / n)
        return Schedule(
            self.name, budget, training_ops(profile.n_stages, n),
            replicate(list(found.transfers), profile.n_stages, n), found.algorithms, n,
            {**found.options, "duplex": duplex, "sub_batch": sub},
            f"sub-batch {sub} x {n} (eq. 3 gave {sb.sub_batch}); {found.notes}",
        )
