"""Conformance tests every planner plugin runs on itself, and the random chains they use.

In a plugin's tests::

    from harness.testing import PlannerConformance

    class TestGreedyConformance(PlannerConformance):
        planner = Greedy()
        reaches_min_memory = True   # plans for every budget from min_memory up

The kit draws chains with Hypothesis (``chains()``) and walks budgets from the minimum
to the peak: every schedule returned must pass ``harness.validate``, its simulated makespan
may not beat papers/004's lower bound, the peak budget must give the keep-all makespan,
and a budget below the minimum must raise ``InfeasibleBudget``. ``cnn_like_chain`` and
``budget_at`` give the seeded chain and budget that plugins' tests and benchmarks share.

A refusal is judged by its type and its ``needed_bytes``, never by its wording: every
``InfeasibleBudget`` a planner raises must carry a message and ``needed_bytes``, an int
above the refused budget (the bytes the planner knows it would need: ``check_budget``'s
minimum, or the unconstrained peak of the leanest schedule it tried); below the minimum,
``needed_bytes`` is at least ``minimum_budget``.
"""

from __future__ import annotations

import math
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bounds import min_memory, peak_memory, schedule_lower_bound
from harness.errors import InfeasibleBudget
from harness.model import Algorithm, Profile, Stage
from harness.schedules import checked_schedule
from harness.simulate.executor import simulate
from harness.validate import validate

KINDS = ("conv", "conv", "act", "pool", "norm", "linear", "block")


@st.composite
def stages(draw, with_algorithms: bool = True) -> Stage:
    """A random stage: times in ms, sizes in KiB-ish units, sometimes conv algorithms."""
    size = st.integers(0, 4000)
    kind = draw(st.sampled_from(KINDS))
    fwd = draw(st.floats(0.0, 3e-3, allow_nan=False))
    bwd = draw(st.floats(0.0, 6e-3, allow_nan=False))
    algorithms: tuple[Algorithm, ...] = ()
    if with_algorithms and kind == "conv" and draw(st.booleans()):
        n = draw(st.integers(1, 3))
        algorithms = tuple(
            Algorithm(f"algo{a}", fwd * (1 + 0.5 * (n - a)), bwd * (1 + 0.5 * (n - a)),
                      draw(st.integers(0, 300)) * a, draw(st.integers(0, 300)) * a)
            for a in range(n)
        )
    return Stage(
        name=f"{kind}", kind=kind, fwd_time=fwd, bwd_time=bwd,
        input_bytes=draw(size), saved_bytes=draw(size), grad_bytes=draw(size),
        fwd_workspace=draw(st.integers(0, 800)), bwd_workspace=draw(st.integers(0, 800)),
        algorithms=algorithms,
    )


@st.composite
def chains(draw, min_stages: int = 1, max_stages: int = 12, with_algorithms: bool = True) -> Profile:
    """A random chain profile (papers/004's model with random sizes, times and bandwidths)."""
    n = draw(st.integers(min_stages, max_stages))
    chain = tuple(draw(stages(with_algorithms)) for _ in range(n))
    # a stage may need part of its output for its backward (a trailing ReLU): at most what the
    # next stage saves (one storage), nothing for the last stage
    held = [draw(st.integers(0, nxt.saved_bytes)) if draw(st.booleans()) else 0 for nxt in chain[1:]] + [0]
    chain = tuple(s.__class__(**{**s.__dict__, "name": f"{s.kind}{i}", "output_saved_bytes": h})
                  for i, (s, h) in enumerate(zip(chain, held)))
    return Profile(
        model="random-chain", batch_size=draw(st.sampled_from([1, 2, 4, 8])), input_shape=(3, 32, 32),
        device="synthetic", device_memory=10**9,
        d2h_bandwidth=draw(st.floats(1e5, 1e7)), h2d_bandwidth=draw(st.floats(1e5, 1e7)),
        weight_bytes=draw(st.integers(0, 2000)), output_bytes=draw(st.integers(0, 500)),
        stages=chain, profiler="hypothesis",
    )


def cnn_like_chain(n: int, seed: int = 0, bandwidth: float = 12.2e9) -> Profile:
    """A seeded CNN-like chain of ``n`` stages: saved data of 5-120 MB shrinking with depth, and
    compute shorter than the transfers (a V100's 12.2 GB/s link by default), as in papers/004's
    experiments. The chain DYNPROG's and HYBRID's tests and benchmarks plan on."""
    rng = random.Random(seed)
    stages = []
    for i in range(n):
        size = int(rng.uniform(5e6, 1.2e8) * (1 - 0.6 * i / n))
        t = size / bandwidth * rng.uniform(0.05, 0.8)
        stages.append(Stage(f"s{i}", "conv", t, 2 * t, size, int(size * rng.uniform(0.8, 2.0)), size,
                            int(rng.uniform(0, 3e7)), int(rng.uniform(0, 3e7))))
    return Profile("synthetic", 32, (3, 224, 224), "synthetic", 16 * 2**30, bandwidth, bandwidth,
                   100_000_000, 400_000, tuple(stages))


def budgets(profile: Profile, points: int = 5) -> list[int]:
    """``points`` budgets evenly spread from ``min_memory`` to ``peak_memory`` (both included)."""
    lo, hi = min_memory(profile), peak_memory(profile)
    if hi <= lo:
        return [hi]
    return sorted({lo + (hi - lo) * k // (points - 1) for k in range(points)})


def budget_at(profile: Profile, where: float) -> int:
    """The budget ``where`` of the way from ``min_memory`` (0) to ``peak_memory`` (1)."""
    lo, hi = min_memory(profile), peak_memory(profile)
    return int(lo + (hi - lo) * where)


def registered_by_entry_point(name: str, distribution: str, kind: str) -> Any:
    """The object the entry point ``name`` of the ``membudget`` group registers as ``kind``, after
    checking that exactly one such entry point exists and that ``distribution`` brings it (what a
    plugin's test asserts about its packaging; ``Registered.obj`` is returned)."""
    from importlib.metadata import entry_points

    from harness.plugins import Registry

    eps = [ep for ep in entry_points(group="membudget") if ep.name == name]
    assert len(eps) == 1, f"{len(eps)} entry points named {name!r} in the membudget group"
    assert eps[0].dist is not None and eps[0].dist.name == distribution, eps[0].dist
    registry = Registry()
    registry.add_plugin(eps[0].load(), distribution, eps[0].dist.version)
    entry = {e.name: e for e in registry.entries(kind)}[name]
    assert entry.plugin == distribution
    return entry.obj


def check_refusal(exc: InfeasibleBudget, budget: int, planner: str = "the planner") -> None:
    """Assert the refusal contract: a message, and ``needed_bytes`` an int above ``budget``."""
    assert str(exc), f"{planner}: InfeasibleBudget must say why"
    need = exc.needed_bytes
    assert isinstance(need, int) and not isinstance(need, bool), (
        f"{planner} refused {budget} bytes without needed_bytes (got {need!r}): {exc}")
    assert need > budget, f"{planner} refused {budget} bytes but says it needs only {need}: {exc}"


_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


class PlannerConformance:
    """Mix-in test class: set ``planner`` (and optionally ``options``, ``reaches_min_memory``)."""

    planner: Any = None
    options: dict = {}
    reaches_min_memory: bool = False  # must plan every budget >= min_memory
    duplex: bool = False

    def minimum_budget(self, profile: Profile) -> int:
        """The smallest budget this planner may accept; below it, ``InfeasibleBudget``.

        The unsplit chain's minimum with memory-optimal algorithms; a sub-batching planner
        overrides it (moDNN's M_min, papers/000 eq. 2).
        """
        return min_memory(profile, memory_optimal=True)

    def _plan(self, profile: Profile, budget: int):
        """The planner's schedule, checked as the runner checks it (``checked_schedule``), or None
        for a well-formed refusal."""
        try:
            schedule = self.planner.plan(profile, budget, **self.options)
        except InfeasibleBudget as exc:
            check_refusal(exc, budget, self.planner.name)
            return None
        return checked_schedule(self.planner, schedule, budget)

    @_SETTINGS
    @given(profile=chains())
    def test_every_schedule_validates_and_respects_the_lower_bound(self, profile: Profile) -> None:
        m_peak = peak_memory(profile)
        for budget in budgets(profile):
            schedule = self._plan(profile, budget)
            if schedule is None:
                assert not self.reaches_min_memory, f"{self.planner.name} refused budget {budget} >= min_memory"
                assert budget < m_peak, f"{self.planner.name} refused the peak budget {budget}"
                continue
            problems = validate(schedule, profile, budget, duplex=self.duplex)
            assert not problems, [str(p) for p in problems]
            run = simulate(schedule, profile, duplex=self.duplex)
            assert run.feasible, run.message
            lb = schedule_lower_bound(profile, schedule, budget, duplex=self.duplex)
            assert run.makespan >= lb * (1 - 1e-9) - 1e-15, (run.makespan, lb)

    @_SETTINGS
    @given(profile=chains())
    def test_peak_budget_reproduces_keep_all(self, profile: Profile) -> None:
        peak = peak_memory(profile)
        schedule = self._plan(profile, peak)
        assert schedule is not None, "a planner must accept the peak budget"
        run = simulate(schedule, profile, duplex=self.duplex)
        assert run.feasible, run.message
        assert math.isclose(run.makespan, profile.compute_time, rel_tol=1e-9, abs_tol=1e-15)

    @_SETTINGS
    @given(profile=chains())
    def test_budget_below_minimum_is_refused(self, profile: Profile) -> None:
        low = self.minimum_budget(profile) - 1
        if low < 0:
            return
        try:
            schedule = self.planner.plan(profile, low, **self.options)
        except InfeasibleBudget as exc:
            check_refusal(exc, low, self.planner.name)  # so needed_bytes >= minimum_budget
            return
        raise AssertionError(f"{self.planner.name} returned a schedule below the minimum: {schedule}")

    @_SETTINGS
    @given(profile=chains())
    def test_deterministic(self, profile: Profile) -> None:
        budget = budgets(profile, 3)[len(budgets(profile, 3)) // 2]
        assert self._plan(profile, budget) == self._plan(profile, budget)
