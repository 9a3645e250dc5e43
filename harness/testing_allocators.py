"""Conformance tests that every allocator (built-in or plugin) runs on itself.

A plugin's test module subclasses :class:`AllocatorConformance` and names its allocator
(as ``harness.testing.PlannerConformance`` does for planners)::

    from harness.testing_allocators import AllocatorConformance

    class TestMyAllocatorConformance(AllocatorConformance):
        allocator = MyAllocator()

or, to build it lazily (e.g. to skip when an optional dependency is missing), defines
``make_allocator(self)``.

pytest then runs, on that allocator: Hypothesis-random traces (ties between event
times, zero sizes, zero-length lifetimes, never-freed blocks), a set of fixed edge
cases, and synthetic DNN-like traces; on every one the placement must be valid
(:func:`harness.allocators.validate.violations`), report the trace's max-live bytes,
have an arena of at least those bytes, and be the same when placed again
(deterministic). Set ``max_examples`` / ``max_blocks`` on the subclass to trade coverage
for time (an exact solver wants small traces).

The trace generators are public too: :func:`memory_traces` (a Hypothesis strategy) and
:func:`dnn_training_trace` / :func:`dnn_inference_trace` (seeded synthetic traces shaped like
a CNN's iteration: forward activations freed in reverse order during the backward pass,
convolution workspaces, gradients, weight gradients kept to the optimizer step), and
:func:`paper001_sequence` (papers/001 section 6.1's allocation sequence that fragments any
pool of its size), and :func:`suite_traces` (the simulated traces of a suite's grid).
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.allocators.trace import blocks_from_events, max_live_bytes, to_int_trace
from harness.allocators.validate import violations
from harness.model import MemoryBlock, Placement

__all__ = [
    "AllocatorConformance",
    "check_placement_conforms",
    "memory_traces",
    "edge_case_traces",
    "dnn_training_trace",
    "dnn_inference_trace",
    "paper001_sequence",
    "deterministic_variant",
]

MiB = 1 << 20


# --------------------------------------------------------------------------- strategies


@st.composite
def memory_traces(draw: Any, max_blocks: int = 40, max_size: int = 1 << 22, max_time: int = 30) -> list[MemoryBlock]:
    """A Hypothesis strategy for random traces of up to ``max_blocks`` blocks.

    Times are drawn from a small integer range (so many events share a time), sizes from
    0 to ``max_size`` with an emphasis on small values and on multiples of 512; some
    blocks have empty lifetimes and some are never freed (``free = inf``).
    """
    n = draw(st.integers(min_value=0, max_value=max_blocks))
    sizes = st.one_of(
        st.integers(min_value=0, max_value=16),
        st.integers(min_value=1, max_value=max_size),
        st.integers(min_value=1, max_value=max(1, max_size // 512)).map(lambda k: 512 * k),
    )
    blocks = []
    for i in range(n):
        alloc = draw(st.integers(min_value=0, max_value=max_time))
        length = draw(st.integers(min_value=0, max_value=max_time))
        never = draw(st.integers(min_value=0, max_value=19)) == 0
        free = float("inf") if never else float(alloc + length)
        blocks.append(MemoryBlock(id=i, name=f"b{i}", size=draw(sizes), alloc=float(alloc), free=free))
    return blocks


def edge_case_traces() -> dict[str, list[MemoryBlock]]:
    """Small fixed traces that break careless allocators, by name."""

    def b(i: int, size: int, a: float, f: float) -> MemoryBlock:
        return MemoryBlock(id=i, name=f"b{i}", size=size, alloc=a, free=f)

    return {
        "empty": [],
        "single": [b(0, 1000, 0.0, 1.0)],
        "zero-size": [b(0, 0, 0.0, 1.0), b(1, 10, 0.0, 1.0)],
        "zero-length": [b(0, 10, 1.0, 1.0), b(1, 10, 1.0, 1.0), b(2, 10, 0.0, 2.0)],
        "back-to-back": [b(0, 100, 0.0, 1.0), b(1, 100, 1.0, 2.0), b(2, 100, 2.0, 3.0)],
        "all-overlap": [b(i, 100 * (i + 1), 0.0, 10.0) for i in range(6)],
        "nested": [b(i, 64 << i, float(i), float(20 - i)) for i in range(8)],
        "never-freed": [b(0, 5, 0.0, float("inf")), b(1, 7, 1.0, 2.0)],
        "same-time-events": [b(0, 3, 0.0, 2.0), b(1, 5, 2.0, 4.0), b(2, 4, 2.0, 2.0), b(3, 6, 0.0, 4.0)],
        "large-sizes": [b(0, 3 << 30, 0.0, 2.0), b(1, 5 << 30, 1.0, 3.0), b(2, 1 << 40, 2.5, 4.0)],
    }


# --------------------------------------------------------------------------- DNN-like traces


def _tensor_bytes(rng: random.Random, batch: int, channels: int, side: int) -> int:
    return 4 * batch * channels * side * side


def _cnn_layers(rng: random.Random, layers: int, batch: int) -> list[dict[str, int]]:
    """Per layer: activation, workspace (fwd/bwd), weight bytes; shapes like a CNN's."""
    out = []
    channels, side = 64, 112
    for i in range(layers):
        if i and i % max(1, layers // 5) == 0 and side > 7:
            side //= 2
            channels = min(2048, channels * 2)
        c = channels * rng.choice([1, 1, 2, 4])
        act = _tensor_bytes(rng, batch, c, side)
        ws = rng.choice([0, 0, 1, 2, 4, 8, 16, 32]) * MiB + rng.randrange(0, 512) * 4
        bws = rng.choice([0, 1, 2, 4, 8, 16, 32]) * MiB + rng.randrange(0, 512) * 4
        weight = 4 * channels * c * rng.choice([1, 9])
        out.append({"act": act, "ws": ws, "bws": bws, "weight": weight})
    return out



class _Recorder:
    """Allocations and frees of named blocks, each at the next tick of a random clock."""

    def __init__(self, rng: random.Random):
        self.rng, self.clock = rng, 0.0
        self.blocks: list[MemoryBlock] = []
        self.open: dict[str, tuple[int, float]] = {}

    def tick(self) -> float:
        self.clock += self.rng.uniform(0.5, 2.0)
        return self.clock

    def alloc(self, key: str, size: int) -> None:
        self.open[key] = (size, self.tick())

    def free(self, key: str) -> None:
        size, start = self.open.pop(key)
        self.blocks.append(MemoryBlock(id=len(self.blocks), name=key, size=size, alloc=start, free=self.tick()))


def dnn_training_trace(
    seed: int = 0, layers: int = 30, batch: int = 16, residual_every: int = 3, include_weights: bool = True
) -> list[MemoryBlock]:
    """A synthetic training-iteration trace shaped like a CNN's (seeded, deterministic).

    Weights live for the whole iteration; the forward pass allocates each layer's
    workspace (freed at the end of the layer) and output activation (kept for the
    backward pass, freed in reverse order there); every ``residual_every`` layers an
    extra skip tensor lives across a block; the backward pass allocates the input
    gradient (freed after the previous layer's backward), a backward workspace and the
    weight gradient (kept until the optimizer step at the end).
    """
    rng = random.Random(seed)
    spec = _cnn_layers(rng, layers, batch)
    recorder = _Recorder(rng)
    alloc, free, open_, blocks = recorder.alloc, recorder.free, recorder.open, recorder.blocks

    if include_weights:
        for i, s in enumerate(spec):
            alloc(f"w{i}", s["weight"])
    alloc("input", _tensor_bytes(rng, batch, 3, 224))
    for i, s in enumerate(spec):
        if s["ws"]:
            alloc(f"ws{i}", s["ws"])
        alloc(f"a{i}", s["act"])
        if residual_every and i % residual_every == 0 and i + residual_every < layers:
            alloc(f"skip{i}", s["act"])
        if s["ws"]:
            free(f"ws{i}")
        if residual_every and i >= residual_every and (i - residual_every) % residual_every == 0:
            free(f"skip{i - residual_every}")
    alloc("loss_grad", spec[-1]["act"])
    grad_key = "loss_grad"
    for i in reversed(range(layers)):
        s = spec[i]
        if s["bws"]:
            alloc(f"bws{i}", s["bws"])
        gin = f"g{i}"
        alloc(gin, spec[i - 1]["act"] if i else _tensor_bytes(rng, batch, 3, 224))
        if include_weights:
            alloc(f"dw{i}", s["weight"])
        if s["bws"]:
            free(f"bws{i}")
        free(f"a{i}")
        free(grad_key)
        grad_key = gin
    free(grad_key)
    free("input")
    for key in [k for k in open_ if k.startswith("skip")]:
        free(key)
    if include_weights:
        for i in range(layers):
            free(f"dw{i}")  # the optimizer step
        for i in range(layers):
            free(f"w{i}")
    return sorted(blocks, key=lambda blk: (blk.alloc, blk.id))


def dnn_inference_trace(seed: int = 0, layers: int = 30, batch: int = 1, include_weights: bool = True) -> list[MemoryBlock]:
    """A synthetic inference trace: each activation lives until the next layer has used it."""
    rng = random.Random(seed)
    spec = _cnn_layers(rng, layers, batch)
    recorder = _Recorder(rng)
    alloc, free, blocks = recorder.alloc, recorder.free, recorder.blocks

    if include_weights:
        for i, s in enumerate(spec):
            alloc(f"w{i}", s["weight"])
    prev = "input"
    alloc(prev, _tensor_bytes(rng, batch, 3, 224))
    for i, s in enumerate(spec):
        if s["ws"]:
            alloc(f"ws{i}", s["ws"])
        alloc(f"a{i}", s["act"])
        if s["ws"]:
            free(f"ws{i}")
        free(prev)
        prev = f"a{i}"
    free(prev)
    if include_weights:
        for i in range(layers):
            free(f"w{i}")
    return sorted(blocks, key=lambda blk: (blk.alloc, blk.id))


def paper001_sequence(pool: int = 12 * MiB) -> tuple[MemoryBlock, ...]:
    """papers/001 section 6.1: a11 a12 a13 a14 d1 a22 a23 a24 d2 a33 a34 d3 a44 d4.

    a_ij is requested after d_(i-1) and before d_i and freed at d_j; every a_ij of block
    i has the same size s_i; just before each d_j the live requests sum to the pool size
    P. Those conditions fix the sizes: 4 s1 = P, 3 s1 + 3 s2 = P, 2 (s1 + s2 + s3) = P,
    s1 + s2 + s3 + s4 = P, i.e. s = (P/4, P/12, P/6, P/2).
    """
    if pool <= 0 or pool % 12:
        raise ValueError(f"the pool size must be a positive multiple of 12, got {pool}")
    size = {1: pool // 4, 2: pool // 12, 3: pool // 6, 4: pool // 2}
    events = []
    for token in "a11 a12 a13 a14 d1 a22 a23 a24 d2 a33 a34 d3 a44 d4".split():
        if token[0] == "a":
            i, j = int(token[1]), int(token[2])
            events.append(("alloc", f"a{i}{j}", size[i]))
        else:
            j = int(token[1])
            events.extend(("free", f"a{i}{j}", 0) for i in range(1, j + 1))
    return blocks_from_events(events)


def suite_traces(path: Any, executor: str = "simulate") -> list[tuple[str, str, str, list[MemoryBlock]]]:
    """``(model, planner label, budget label, trace)`` of every feasible run of a suite's grid.

    The suite's cases as ``membudget run`` plans them (its profiler, device, budgets and
    planner options; planners and profilers that are not registered are skipped), one per
    (model, planner, budget), run through the simulator; runs that do not fit give none.
    ``suite_traces(ROOT / "suites/quick.yaml")`` are the DNN traces of the quick suite.
    """
    from harness.case import run_case
    from harness.errors import UnknownPlugin
    from harness.plugins import registry
    from harness.protocols import Workload
    from harness.runner import bounds_of
    from harness.simulate.executor import Simulator
    from harness.suite import load_suite

    reg = registry()
    suite = load_suite(path, check_names=False)
    profiles: dict[Any, Any] = {}
    out: dict[tuple[str, str, str], list[MemoryBlock]] = {}
    for case in suite.cases():
        key = (case.model, case.planner_label, case.budget.label)
        if case.executor != executor or key in out:
            continue
        try:
            if case.profile_key not in profiles:
                profile = reg.profiler(case.profiler).profile(
                    Workload(case.model, case.batch_size, case.input_size, case.device, case.dtype))
                profiles[case.profile_key] = (profile, bounds_of(profile))
            profile, bounds = profiles[case.profile_key]
            planner = reg.planner(case.planner)
        except UnknownPlugin:
            continue
        budget = case.budget.resolve(bounds.min_memory, bounds.peak_memory)
        workload = Workload(case.model, case.batch_size, case.input_size, case.device, case.dtype)
        outcome = run_case(planner, profile, budget, Simulator(), workload, options=case.planner_options,
                           device_budget=suite.spec.budget_model == "device", validate=False, seed=case.seed)
        if outcome.run is not None and outcome.run.feasible:
            out[key] = list(outcome.run.trace)
    return [(*key, trace) for key, trace in out.items()]


# --------------------------------------------------------------------------- checks


def deterministic_variant(allocator: Any) -> Any:
    """``allocator.deterministic()`` when it has one, else ``allocator`` itself.

    An anytime allocator under a time limit (``minisearch``) may return a different
    placement when the machine is slower or busier; its ``deterministic()`` gives the same
    allocator with a budget that does not depend on time (a node limit), which is what
    the repeat check of :func:`check_placement_conforms` needs.
    """
    make = getattr(allocator, "deterministic", None)
    return make() if callable(make) else allocator


def check_placement_conforms(allocator: Any, trace: Sequence[MemoryBlock], placement: Placement | None = None) -> Placement:
    """Assert the conformance properties of ``allocator`` on ``trace``; return the placement.

    Valid (no overlap in address while alive, inside the arena), one offset per block,
    ``max_live_bytes`` equal to the trace's, ``arena_bytes >= max_live_bytes``, the
    allocator's name on the placement, and the same placement when placed again.
    """
    if placement is None:
        placement = allocator.place(trace)
    assert isinstance(placement, Placement), f"{allocator.name}: place() returned {type(placement).__name__}"
    assert placement.allocator == allocator.name, (placement.allocator, allocator.name)
    assert len(placement.offsets) == len(trace)
    problems = violations(trace, placement)
    assert not problems, f"{allocator.name}: " + "; ".join(v.message for v in problems[:5])
    live = max_live_bytes(to_int_trace(trace))
    assert placement.max_live_bytes == live
    assert placement.arena_bytes >= live, (placement.arena_bytes, live)
    again = allocator.place(trace)
    assert again.offsets == placement.offsets, f"{allocator.name}: not deterministic"
    assert again.arena_bytes == placement.arena_bytes
    return placement


class AllocatorConformance:
    """The conformance suite; subclass it as ``Test...`` and set ``allocator`` (or define :meth:`make_allocator`).

    Class attributes: ``allocator`` (the allocator under test), ``max_examples``
    (Hypothesis examples), ``max_blocks`` (blocks per random trace), ``dnn_layers``
    (layers of the DNN-like traces; 0 skips them).
    """

    allocator: Any = None
    max_examples: int = 60
    max_blocks: int = 40
    dnn_layers: int = 30

    def make_allocator(self) -> Any:
        """Return the allocator under test: ``self.allocator`` unless a subclass builds one."""
        if self.allocator is None:
            raise NotImplementedError("subclass AllocatorConformance and set allocator = ... (or make_allocator())")
        return self.allocator

    def test_protocol(self) -> None:
        """It has a name, a one-line description and ``place``."""
        alloc = self.make_allocator()
        assert isinstance(alloc.name, str) and alloc.name
        assert isinstance(alloc.description, str) and alloc.description and "\n" not in alloc.description
        assert callable(alloc.place)

    def test_edge_cases(self) -> None:
        """Every fixed edge case places validly."""
        alloc = self.make_allocator()
        for name, trace in edge_case_traces().items():
            try:
                check_placement_conforms(alloc, trace)
            except AssertionError as exc:
                raise AssertionError(f"edge case {name!r}: {exc}") from exc

    def test_dnn_like_traces(self) -> None:
        """Training and inference traces shaped like a CNN's place validly."""
        if not self.dnn_layers:
            return
        alloc = self.make_allocator()
        for seed in range(3):
            check_placement_conforms(alloc, dnn_training_trace(seed, layers=self.dnn_layers))
            check_placement_conforms(alloc, dnn_inference_trace(seed, layers=self.dnn_layers))

    def test_random_traces(self) -> None:
        """Hypothesis-random traces place validly, deterministically, in at least max-live bytes."""
        alloc = self.make_allocator()

        @settings(
            max_examples=self.max_examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(trace=memory_traces(max_blocks=self.max_blocks))
        def run(trace: list[MemoryBlock]) -> None:
            check_placement_conforms(alloc, trace)

        run()
