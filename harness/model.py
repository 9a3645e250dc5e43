"""The data that flows through the pipeline: profiles, schedules, runs, placements.

Every box of the pipeline (see docs/architecture.md) is a frozen dataclass here, with a lossless
JSON round trip (``to_json`` / ``from_json``) and field-naming errors for malformed input
(validation through pydantic's ``TypeAdapter`` on these plain dataclasses).

Time is in seconds, sizes in bytes, bandwidths in bytes per second.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import pydantic

StageKind = Literal["conv", "linear", "pool", "norm", "act", "block", "attention", "embedding", "other"]
STAGE_KINDS: tuple[str, ...] = StageKind.__args__  # type: ignore[attr-defined]


class ModelError(ValueError):
    """Raised for data that does not describe a valid profile, schedule, run or placement."""


MAX_BYTES = 2**50  # 1 PiB per size
MAX_TOTAL_BYTES = 2**53  # 8 PiB in all: past it the simulator's float64 sums of bytes lose bytes


def _non_negative(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, int) and value > MAX_BYTES:  # the int fields are sizes in bytes
            shown = value if value < 2**64 else f"a {len(str(value))}-digit number"
            raise ValueError(f"{name} must be at most 2**50 bytes (1 PiB), got {shown}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")


# --------------------------------------------------------------------------- profile


@dataclass(frozen=True)
class Algorithm:
    """One way to compute a stage (e.g. a cuDNN convolution algorithm), with its cost.

    moDNN (papers/000 eq. 5) and vDNN_dyn (papers/001 section 3.4) trade workspace for
    time by choosing among these.
    """

    name: str
    fwd_time: float
    bwd_time: float
    fwd_workspace: int = 0
    bwd_workspace: int = 0

    def __post_init__(self) -> None:
        _non_negative(self, "fwd_time", "bwd_time", "fwd_workspace", "bwd_workspace")


@dataclass(frozen=True)
class Stage:
    """One link of the chain: a forward operation F_i and its backward B_i (papers/004 section 3.1).

    ``input_bytes`` is |x_i|, the stage input; ``saved_bytes`` is what F_i keeps for B_i
    (the input included when the stage needs it) and is the unit that offloading moves;
    ``grad_bytes`` is |y_i|, the gradient of the input. The default times and workspaces
    are those of the algorithm a framework picks; ``algorithms`` lists alternatives, the
    first being the memory-optimal one.

    ``output_saved_bytes``: the bytes of the stage's own output x_{i+1} that B_i needs (a
    trailing ReLU keeps its result). One storage with what stage i+1 saves of its input, so
    they are counted once, in stage i+1's ``saved_bytes``; but they stay on the device until
    B_i ends, after B_{i+1} (papers/004 section 3.1: "B_i requires x_{i+1}, x_i and y_{i+1}").
    """

    name: str
    kind: StageKind
    fwd_time: float
    bwd_time: float
    input_bytes: int
    saved_bytes: int
    grad_bytes: int
    fwd_workspace: int = 0
    bwd_workspace: int = 0
    algorithms: tuple[Algorithm, ...] = ()
    flops: float = 0.0
    output_saved_bytes: int = 0

    def __post_init__(self) -> None:
        _non_negative(
            self, "fwd_time", "bwd_time", "input_bytes", "saved_bytes", "grad_bytes",
            "fwd_workspace", "bwd_workspace", "flops", "output_saved_bytes",
        )

    def algorithm(self, index: int) -> Algorithm:
        """The stage's algorithm ``index``; -1 is the default (the stage's own figures)."""
        if index < 0:
            return Algorithm("default", self.fwd_time, self.bwd_time, self.fwd_workspace, self.bwd_workspace)
        return self.algorithms[index]


@dataclass(frozen=True)
class Profile:
    """A workload measured or estimated as a chain of stages, plus the transfer bandwidths.

    ``weight_bytes`` (parameters, their gradients, buffers, and any optimizer state: the profilers
    count none, as for plain SGD) stays resident on the
    device for the whole iteration; ``output_bytes`` is the size of the last stage's output
    (and of the gradient that enters the backward pass). ``variants`` holds profiles of the
    same workload at other batch sizes (sub-batching, papers/000 eq. 3). ``runtime_bytes``
    is what the framework reserves on the device beyond the chain model and the caching
    allocator's fragmentation (``harness.device_memory``; measured on a GPU, 0 otherwise).
    """

    model: str
    batch_size: int
    input_shape: tuple[int, ...]
    device: str
    device_memory: int
    d2h_bandwidth: float
    h2d_bandwidth: float
    weight_bytes: int
    output_bytes: int
    stages: tuple[Stage, ...]
    dtype: str = "float32"
    profiler: str = "unknown"
    measured: bool = False
    variants: tuple[Profile, ...] = ()
    notes: dict[str, str] = field(default_factory=dict, hash=False)
    runtime_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("stages: a profile needs at least one stage")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not (0 < self.d2h_bandwidth < math.inf and 0 < self.h2d_bandwidth < math.inf):
            raise ValueError("d2h_bandwidth and h2d_bandwidth must be finite and > 0 (bytes/s)")
        _non_negative(self, "device_memory", "weight_bytes", "output_bytes", "runtime_bytes")
        total = self.weight_bytes + 2 * self.output_bytes + self.runtime_bytes + sum(
            s.input_bytes + s.saved_bytes + s.grad_bytes + s.output_saved_bytes
            + max(s.fwd_workspace, s.bwd_workspace, *(w for a in s.algorithms for w in (a.fwd_workspace, a.bwd_workspace)))
            for s in self.stages)
        if total >= MAX_TOTAL_BYTES:  # a bound on every peak: past it the simulator's peaks lose bytes
            raise ValueError(f"the sizes add up to {total} bytes, 2**53 (8 PiB) or more: beyond what the simulator "
                             "counts to the byte")
        for i, (s, nxt) in enumerate(zip(self.stages, (*self.stages[1:], None))):
            room = nxt.saved_bytes if nxt is not None else 0
            if s.output_saved_bytes > room:
                raise ValueError(f"stages.{i}: output_saved_bytes ({s.output_saved_bytes}) is part of the next "
                                 f"stage's saved_bytes ({room}) and cannot exceed it")

    @property
    def n_stages(self) -> int:
        """L, the number of stages."""
        return len(self.stages)

    @property
    def compute_time(self) -> float:
        """Sum of all forward and backward times with default algorithms (the ideal iteration)."""
        return sum(s.fwd_time + s.bwd_time for s in self.stages)

    def at_batch(self, batch_size: int) -> Profile:
        """This workload at another batch size: measured where it can be, else interpolated or scaled.

        - a batch that was measured (this profile or one of its ``variants``): that profile,
          with this profile's host link (the device's, measured once);
        - a batch between two measured ones: every per-stage time, size and FLOP count, the
          output size and the weights interpolated piecewise-linearly in the batch between
          the two nearest measured batches (small batches run less efficiently on a real
          GPU, so time is not proportional to the batch; sizes of activations are affine in
          it, which the interpolation reproduces exactly, and measured workspaces are not,
          which it follows). A stage's algorithm alternatives are interpolated when both
          neighbours list the same ones, else taken from the nearer neighbour scaled
          linearly. Neighbours whose chains differ (stage names) are not interpolated: the
          linear rule below applies;
        - outside the measured range: this profile scaled linearly in the batch (sizes and
          times).

        The result says where it came from in its notes (``derived_from``), so a measured
        profile can be told apart from an interpolated or extrapolated one.
        """
        if batch_size == self.batch_size:
            return self
        for variant in self.variants:
            if variant.batch_size == batch_size:
                # the host link belongs to the device, not to the batch: a variant's own (noisy)
                # measurement of it would make one schedule's copies differ from pass to pass
                return replace(variant, d2h_bandwidth=self.d2h_bandwidth, h2d_bandwidth=self.h2d_bandwidth)
        measured = (self, *self.variants)
        below = max((p for p in measured if p.batch_size < batch_size), key=lambda p: p.batch_size, default=None)
        above = min((p for p in measured if p.batch_size > batch_size), key=lambda p: p.batch_size, default=None)
        if below is not None and above is not None and _same_chain(below, above):
            return _interpolate(self, below, above, batch_size)  # the result keeps this profile's link
        return _scaled(self, batch_size)


def _same_chain(a: Profile, b: Profile) -> bool:
    return a.n_stages == b.n_stages and all(s.name == t.name for s, t in zip(a.stages, b.stages))


def _scaled(source: Profile, batch_size: int) -> Profile:
    """``source`` scaled linearly to ``batch_size`` (sizes and times)."""
    r = batch_size / source.batch_size

    def b(n: int) -> int:
        return int(round(n * r))

    stages = tuple(
        replace(
            s,
            fwd_time=s.fwd_time * r, bwd_time=s.bwd_time * r,
            input_bytes=b(s.input_bytes), saved_bytes=b(s.saved_bytes), grad_bytes=b(s.grad_bytes),
            output_saved_bytes=b(s.output_saved_bytes),
            fwd_workspace=b(s.fwd_workspace), bwd_workspace=b(s.bwd_workspace), flops=s.flops * r,
            algorithms=_scaled_algorithms(s.algorithms, r),
        )
        for s in source.stages
    )
    return replace(
        source, batch_size=batch_size, stages=stages, output_bytes=b(source.output_bytes), measured=False,
        variants=(), notes={**source.notes, "derived_from": f"batch {source.batch_size}, scaled linearly"},
    )


def _scaled_algorithms(algorithms: tuple[Algorithm, ...], r: float) -> tuple[Algorithm, ...]:
    return tuple(replace(a, fwd_time=a.fwd_time * r, bwd_time=a.bwd_time * r,
                         fwd_workspace=int(round(a.fwd_workspace * r)), bwd_workspace=int(round(a.bwd_workspace * r)))
                 for a in algorithms)


_STAGE_TIMES = ("fwd_time", "bwd_time", "flops")
_STAGE_BYTES = ("input_bytes", "saved_bytes", "grad_bytes", "fwd_workspace", "bwd_workspace", "output_saved_bytes")


def _interpolate(base: Profile, lo: Profile, hi: Profile, batch_size: int) -> Profile:
    """Piecewise-linear interpolation between the measured ``lo`` and ``hi`` (``Profile.at_batch``)."""
    w = (batch_size - lo.batch_size) / (hi.batch_size - lo.batch_size)
    nearer, r_nearer = (lo, batch_size / lo.batch_size) if w <= 0.5 else (hi, batch_size / hi.batch_size)

    def t(x: float, y: float) -> float:
        return x + (y - x) * w

    def n(x: int, y: int) -> int:
        return int(round(x + (y - x) * w))

    def algorithms(i: int) -> tuple[Algorithm, ...]:
        a, b = lo.stages[i].algorithms, hi.stages[i].algorithms
        if [x.name for x in a] == [y.name for y in b]:
            return tuple(replace(x, fwd_time=t(x.fwd_time, y.fwd_time), bwd_time=t(x.bwd_time, y.bwd_time),
                                 fwd_workspace=n(x.fwd_workspace, y.fwd_workspace),
                                 bwd_workspace=n(x.bwd_workspace, y.bwd_workspace))
                         for x, y in zip(a, b))
        return _scaled_algorithms(nearer.stages[i].algorithms, r_nearer)

    stages = tuple(
        replace(s, **{k: t(getattr(s, k), getattr(u, k)) for k in _STAGE_TIMES},
                **{k: n(getattr(s, k), getattr(u, k)) for k in _STAGE_BYTES}, algorithms=algorithms(i))
        for i, (s, u) in enumerate(zip(lo.stages, hi.stages))
    )
    return replace(
        base, batch_size=batch_size, stages=stages, output_bytes=n(lo.output_bytes, hi.output_bytes),
        weight_bytes=n(lo.weight_bytes, hi.weight_bytes), measured=False, variants=(),
        notes={**base.notes, "derived_from": f"batches {lo.batch_size} and {hi.batch_size} (profiled), "
                                              f"interpolated piecewise-linearly"},
    )


# --------------------------------------------------------------------------- schedule


OpKind = Literal["F", "Fc", "Fn", "R", "B"]
OP_KINDS: tuple[str, ...] = get_args(OpKind)  # the closed vocabulary, in this order


@dataclass(frozen=True)
class Op:
    """A compute operation on ``stage`` for ``sub_batch``; ``kind`` says which, in the vocabulary
    of checkpointing (papers/004 section 2.1 and its reference [29], rotor: Beaumont et al.,
    "Optimal checkpointing for heterogeneous chains"):

    - ``F``: the forward that saves what B_i needs (rotor's F_all);
    - ``Fc``: the forward that keeps only its input x_i, a checkpoint (rotor's F_ck), which
      transfers of the stage may move to the host until R_i reads it again;
    - ``Fn``: the forward that saves nothing ("forward-without-saving", rotor's F_nograd);
    - ``R``: the recomputation, a forward run again during the backward pass to re-create
      the stage's saved data (after ``Fc``, from the checkpoint; after ``Fn``, from the
      x_i that the recomputation of stage i-1 produced);
    - ``B``: the backward.

    Every stage of a pass has one forward (``F``, ``Fc`` or ``Fn``) and one ``B``, and an
    ``R`` exactly when its forward did not save; some stages may be offloaded while
    others are recomputed (the combination papers/004 section 7 calls complementary), and
    the checkpoint of a recomputed segment may itself be offloaded (Beaumont et al. 2021).
    What each allocates and frees is ``harness.memory``'s.
    """

    kind: OpKind
    stage: int
    sub_batch: int = 0

    @property
    def is_forward(self) -> bool:
        """A forward-pass operation (``F``, ``Fc`` or ``Fn``)."""
        return self.kind in ("F", "Fc", "Fn")

    @property
    def label(self) -> str:
        suffix = f"/{self.sub_batch}" if self.sub_batch else ""
        return f"{self.kind}{self.stage}{suffix}"


@dataclass(frozen=True)
class Transfer:
    """A copy of a stage's tensor between device and host.

    What it moves depends on the stage's forward (``harness.memory.movable_bytes``): after
    ``F``, the saved data (``saved_bytes``), which must be back before B_i; after ``Fc``,
    the checkpoint (all of its input x_i, ``input_bytes``), offloaded once Fc_i has started
    and prefetched before R_i, the first operation that reads it again (``wait_op`` R_i;
    the simulator makes R_i wait for it in any case). A stage whose forward is ``Fn`` has
    nothing to move, and recomputed data never moves (``harness.validate`` refuses both).

    It is issued at the ``start`` or ``end`` of compute operation ``issue_op`` (an index
    into ``Schedule.ops``), runs on its copy engine in the order transfers are listed,
    and, when ``wait_op`` is set, that operation may not start before the copy completes
    (vDNN's end-of-layer synchronisation). With ``wait_op`` None it only holds things up
    through memory (vDNN++). ``nbytes`` below what the stage moves moves part of it
    (the fractional relaxation of papers/004 section 4); None moves all of it.
    """

    stage: int
    direction: Literal["offload", "prefetch"]
    issue_op: int
    issue_at: Literal["start", "end"] = "start"
    wait_op: int | None = None
    sub_batch: int = 0
    nbytes: int | None = None


@dataclass(frozen=True)
class Schedule:
    """What a planner decided, runnable by any executor without knowing the planner.

    ``ops`` is the compute order (``Op``: forwards that save, keep a checkpoint or keep
    nothing, recomputations, backwards); ``transfers`` the copies; ``algorithms`` the
    algorithm index per stage (-1: the stage default; empty: all defaults);
    ``sub_batches`` how many gradient-accumulation passes the batch is split into (the
    stage figures are then those of ``Profile.at_batch(batch_size // sub_batches)``).
    ``budget_bytes`` is the chain model's budget the planner planned for;
    ``device_budget_bytes``, when set, the bytes the process may reserve on the device
    (``harness.device_memory``), the cap a real executor enforces. ``duplex`` is the
    copy-engine layout the schedule was planned for and runs on: one engine per direction
    (True) or one shared by both (False, papers/004's assumption B); ``harness.case.plan_case``
    records it, and the simulator, the validator, the bounds and the torch executor read it
    when they are not given a layout (``duplex_of``). ``options`` and ``notes`` describe the
    plan; no executor reads them.
    """

    planner: str
    budget_bytes: int
    ops: tuple[Op, ...]
    transfers: tuple[Transfer, ...] = ()
    algorithms: tuple[int, ...] = ()
    sub_batches: int = 1
    options: dict[str, Any] = field(default_factory=dict, hash=False)
    notes: str = ""
    device_budget_bytes: int | None = None
    duplex: bool = False

    def algorithm_of(self, stage: int) -> int:
        """The algorithm index of ``stage`` (-1: the stage default)."""
        return self.algorithms[stage] if self.algorithms else -1

    def fingerprint(self) -> str:
        """A short hash of what an executor runs: the operations, transfers, algorithms, sub-batches,
        copy layout and the chain budget the run holds it to (the torch executor's prefetches wait for
        it); not the planner, its options, notes or the device budget (the row's budget column). Two
        planners' schedules with one fingerprint at one budget run the same iteration, so their measured
        times differ by noise alone."""
        import hashlib

        algorithms = self.algorithms if any(a >= 0 for a in self.algorithms) else ()
        what = repr((self.ops, self.transfers, algorithms, self.sub_batches, self.duplex, self.budget_bytes))
        return hashlib.sha1(what.encode()).hexdigest()[:12]

    @property
    def recomputed_stages(self) -> tuple[int, ...]:
        """Stages this schedule recomputes (in any sub-batch)."""
        return tuple(sorted({op.stage for op in self.ops if op.kind == "R"}))

    @property
    def offloaded_stages(self) -> tuple[int, ...]:
        """Stages whose saved data this schedule offloads (in any sub-batch)."""
        return tuple(sorted({t.stage for t in self.transfers if t.direction == "offload"}))


def training_ops(n_stages: int, sub_batches: int = 1) -> tuple[Op, ...]:
    """F_0..F_{L-1} then B_{L-1}..B_0, once per sub-batch: the order every chain schedule uses.

    One tuple per chain shape, shared by every schedule made of it (its operations are frozen),
    so that the simulator's lowering finds the operations it flattened already, by identity."""
    return _training_ops(int(n_stages), int(sub_batches))


@lru_cache(maxsize=64)
def _training_ops(n_stages: int, sub_batches: int) -> tuple[Op, ...]:
    ops: list[Op] = []
    for sb in range(sub_batches):
        ops.extend(Op("F", i, sb) for i in range(n_stages))
        ops.extend(Op("B", i, sb) for i in reversed(range(n_stages)))
    return tuple(ops)


def duplex_of(schedule: Schedule, duplex: bool | None = None) -> bool:
    """The copy-engine layout to run ``schedule`` with: ``duplex`` when given, else the schedule's own."""
    return schedule.duplex if duplex is None else bool(duplex)


# When an offload may start: with the forward of its stage (papers/004's rule: x_i is F_i's input, so
# its copy overlaps F_i) or once that forward has ended (the torch executor's: a stage's saved data
# here is mostly what F_i produces). Planners plan under the paper's; a run on a device goes the
# device's way (docs/gpu.md, "When an offload starts").
OFFLOAD_STARTS = ("forward-start", "forward-end")
PAPER_OFFLOAD_START, DEVICE_OFFLOAD_START = OFFLOAD_STARTS


def checked_offload_start(offload_start: str) -> str:
    """``offload_start`` when it is one of ``OFFLOAD_STARTS``; else a one-line error."""
    if offload_start not in OFFLOAD_STARTS:
        raise ValueError(f"unknown offload_start {offload_start!r}; choose one of {OFFLOAD_STARTS}")
    return offload_start


def offload_start_of(schedule: Schedule, offload_start: str | None = None) -> str:
    """When ``schedule``'s offloads may start: ``offload_start`` when given, else the device's rule
    for a schedule planned for a device budget (``device_budget_bytes``: it is to run on one), else
    papers/004's. An unknown rule is a one-line error."""
    if offload_start is None:
        offload_start = DEVICE_OFFLOAD_START if schedule.device_budget_bytes is not None else PAPER_OFFLOAD_START
    return checked_offload_start(offload_start)


def chosen_algorithms(schedule: Schedule, profile: Profile) -> dict[int, str]:
    """The algorithm's name of every stage ``schedule`` runs with an explicit choice (not the default)."""
    return {i: stage.algorithms[k].name for i, stage in enumerate(profile.stages) if (k := schedule.algorithm_of(i)) >= 0}


def op_index(ops: tuple[Op, ...]) -> dict[tuple[str, int, int], int]:
    """Map (kind, stage, sub_batch) to the position of that operation."""
    return {(op.kind, op.stage, op.sub_batch): k for k, op in enumerate(ops)}


# --------------------------------------------------------------------------- run


@dataclass(frozen=True)
class TimelineEvent:
    """One interval of work: a compute operation or a copy, on its stream."""

    label: str
    stream: Literal["compute", "d2h", "h2d", "copy"]
    start: float
    end: float


@dataclass(frozen=True)
class MemoryBlock:
    """One device allocation of a run: alive on [alloc, free); a block with ``alloc == free`` (an allocation
    freed at once) is alive for one event all the same (``harness.allocators.trace``, rule 3)."""

    id: int
    name: str
    size: int
    alloc: float
    free: float


RunStatus = Literal["ok", "infeasible", "oom", "error"]


@dataclass(frozen=True)
class Run:
    """The outcome of executing a schedule: times, memory, and what happened when.

    ``metrics``: the executor's other figures by name, numbers (counts and bytes as ints); those
    named as rows.csv columns fill them, the others go to its ``metrics`` column as JSON."""

    executor: str
    planner: str
    status: RunStatus
    message: str
    makespan: float
    compute_time: float
    peak_bytes: int
    moved_bytes: int
    timeline: tuple[TimelineEvent, ...] = ()
    trace: tuple[MemoryBlock, ...] = ()
    metrics: dict[str, float | int] = field(default_factory=dict, hash=False)

    @property
    def feasible(self) -> bool:
        return self.status == "ok"

    @property
    def idle_time(self) -> float:
        """Time the compute stream stood still."""
        return max(0.0, self.makespan - self.compute_time) if self.feasible else float("nan")


@dataclass(frozen=True)
class Placement:
    """Offsets for every block of a memory trace, as an allocator chose them."""

    allocator: str
    offsets: tuple[int, ...]
    arena_bytes: int
    max_live_bytes: int
    optimal: bool | None = None
    notes: str = ""
    #: a proved lower bound on the optimal arena (at least the max-live bytes), when the
    #: allocator computed one; None when it did not say (older files, heuristics)
    lower_bound_bytes: int | None = None

    @property
    def fragmentation(self) -> float:
        """Arena size over the max-live bytes (1.0 is perfect)."""
        return self.arena_bytes / self.max_live_bytes if self.max_live_bytes else 1.0

    @property
    def gap(self) -> float | None:
        """``(arena - lower bound) / arena``: how far from optimal at most (0.0 when proved
        optimal); None when no lower bound was reported."""
        if self.optimal:
            return 0.0
        if self.lower_bound_bytes is None:
            return None
        return (self.arena_bytes - self.lower_bound_bytes) / self.arena_bytes if self.arena_bytes else 0.0


# --------------------------------------------------------------------------- JSON

T = TypeVar("T")


@cache
def _adapter(cls: type) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(cls)


def to_dict(obj: Any) -> dict[str, Any]:
    """A JSON-ready dict of any dataclass of this module."""
    return _adapter(type(obj)).dump_python(obj, mode="json")


def from_dict(cls: type[T], data: Any, *, source: str = "") -> T:
    """Build ``cls`` from ``data``; errors name every offending field (and ``source``)."""
    try:
        return _adapter(cls).validate_python(data)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg'].removeprefix('Value error, ')}" for err in exc.errors()
        )
        where = f"{source}: " if source else ""
        raise ModelError(f"{where}invalid {cls.__name__}: {problems}") from None


def to_json(obj: Any, indent: int | None = 1) -> str:
    """Serialise a dataclass of this module to JSON (floats keep every bit: ``repr`` round trip)."""
    return json.dumps(to_dict(obj), indent=indent)


def from_json(cls: type[T], text: str, *, source: str = "") -> T:
    """Parse JSON text into ``cls`` with field-naming errors."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{source or 'input'}: not valid JSON: {exc}") from None
    return from_dict(cls, data, source=source)


def save(obj: Any, path: str | Path) -> None:
    """Write ``obj`` as JSON to ``path``, atomically (an interrupted run's profiles are never torn)."""
    from harness.files import write_text_atomic

    write_text_atomic(path, to_json(obj))


def load(cls: type[T], path: str | Path) -> T:
    """Read ``cls`` (a profile, a schedule) from the JSON file ``path``; ``ModelError`` names the file when it
    is not UTF-8 JSON of that shape."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        from harness.files import not_utf8

        raise ModelError(f"{path}: not valid JSON: {not_utf8(exc)}") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            json.loads(text)
        except json.JSONDecodeError:
            raise ModelError(f"{path}: a YAML file where a {cls.__name__.lower()} (JSON) was expected; a suite runs "
                             "with `membudget run`") from None
    return from_json(cls, text, source=str(path))
