"""Device specifications for the analytic profiler, and the efficiency factors it applies.

Each ``DeviceSpec`` gives peak arithmetic throughput per dtype (FLOP/s, a multiply-add
counting 2, the convention of ``torch.utils.flop_counter``), device memory bandwidth,
host-link bandwidth (bytes/s of pinned copies between host and device), memory size and
a per-kernel launch latency, with the source of the numbers. Peak figures are the
vendors' datasheet values at base/boost clocks as stated; host links are measured
values where a paper of this project measured one (papers/004 section 6.1 for the
V100-PCIe), else the typical pinned-copy rate of the PCIe generation.

``Efficiency`` holds the fraction of the roofline each stage kind reaches (cuDNN
convolutions do not run at peak). The defaults are rough and documented; a measured
profile calibrates them (``calibrate``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import Mapping

from harness.model import STAGE_KINDS, Profile

DEFAULT_DEVICE = "V100-PCIe"  # the analytic profiler's device when none is named

GB = 1e9
GiB = 2**30
TFLOPS = 1e12

# Typical pinned cudaMemcpy rate on PCIe 3.0 x16 (12.8 of 15.75 GB/s), papers/001 section 2.
PCIE3_PINNED = 12.8 * GB
# PCIe 4.0 and 5.0 x16 nominal 31.5 and 63 GB/s; the same ~80% efficiency is assumed.
PCIE4_PINNED = 25.0 * GB
PCIE5_PINNED = 50.0 * GB


@dataclass(frozen=True)
class DeviceSpec:
    """A device's roofline parameters and where they come from."""

    name: str
    peak_flops: Mapping[str, float]
    memory_bandwidth: float
    host_bandwidth: float
    memory: int
    launch_latency: float
    source: str
    aliases: tuple[str, ...] = ()

    def flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype`` (float32 when the dtype has no faster path listed)."""
        return self.peak_flops.get(dtype, self.peak_flops["float32"])


def _spec(name: str, fp32: float, bandwidth: float, host: float, memory: int, source: str,
          fp16: float | None = None, bf16: float | None = None, latency: float = 5e-6,
          aliases: tuple[str, ...] = ()) -> DeviceSpec:
    flops = {"float32": fp32 * TFLOPS, "float16": (fp16 or fp32) * TFLOPS, "bfloat16": (bf16 or fp32) * TFLOPS}
    return DeviceSpec(name, flops, bandwidth * GB, host, memory, latency, source, aliases)


SPECS: tuple[DeviceSpec, ...] = (
    _spec("K40m", 4.29, 288, PCIE3_PINNED, 12 * GiB,
          "NVIDIA Tesla K40 board specification (BD-06902-001): 2880 CUDA cores at 745 MHz base, "
          "288 GB/s GDDR5, 12 GB; PCIe 3.0 x16 (host link: typical pinned rate, papers/001 section 2). "
          "The GPU of moDNN's experiments (papers/000 section V).", aliases=("k40", "tesla-k40m")),
    _spec("GTX-970", 3.49, 224, PCIE3_PINNED, 4 * GiB,
          "NVIDIA GeForce GTX 970 specifications: 1664 CUDA cores at 1050 MHz base, 224 GB/s, 4 GB "
          "(3.5 GB fast segment); PCIe 3.0 x16.", aliases=("gtx970", "gtx 970")),
    _spec("TitanX-Maxwell", 6.14, 336.5, PCIE3_PINNED, 12 * GiB,
          "NVIDIA GeForce GTX TITAN X (Maxwell GM200) specifications: 3072 CUDA cores at 1000 MHz base, "
          "336.5 GB/s, 12 GB; PCIe 3.0 x16. The GPU of vDNN (papers/001).",
          aliases=("titan-x", "titanx", "titan x", "titan-x-maxwell")),
    _spec("P100", 9.3, 732, PCIE3_PINNED, 16 * GiB,
          "NVIDIA Tesla P100 PCIe 16 GB datasheet: 9.3 TFLOP/s FP32, 18.7 FP16, 732 GB/s HBM2; PCIe 3.0 x16.",
          fp16=18.7, aliases=("p100-pcie", "tesla-p100")),
    _spec("V100-PCIe", 14.0, 900, 12.2 * GB, 16 * GiB,
          "NVIDIA Tesla V100 PCIe 16 GB datasheet: 14 TFLOP/s FP32, 112 tensor FP16, 900 GB/s HBM2; "
          "host link 12.2 GB/s as measured with PyTorch in papers/004 section 6.1 (which reports "
          "15.75 GB usable memory).", fp16=112.0, aliases=("v100", "tesla-v100", "v100-pcie-16gb")),
    _spec("A100", 19.5, 2039, PCIE4_PINNED, 80 * GiB,
          "NVIDIA A100 80 GB SXM datasheet: 19.5 TFLOP/s FP32 (156 TF32, not PyTorch's matmul default), "
          "312 FP16/BF16 tensor, 2039 GB/s HBM2e; PCIe 4.0 x16 host link.",
          fp16=312.0, bf16=312.0, aliases=("a100-sxm4-80gb", "a100-80gb")),
    _spec("H100", 67.0, 3350, PCIE5_PINNED, 80 * GiB,
          "NVIDIA H100 SXM5 80 GB datasheet: 67 TFLOP/s FP32, 989 dense FP16/BF16 tensor, 3.35 TB/s HBM3; "
          "PCIe 5.0 x16 host link.", fp16=989.0, bf16=989.0, aliases=("h100-sxm", "h100-80gb")),
    _spec("H200", 67.0, 4800, PCIE5_PINNED, 141 * GiB,
          "NVIDIA H200 SXM 141 GB datasheet: 67 TFLOP/s FP32, 989 dense FP16/BF16 tensor, 4.8 TB/s HBM3e; "
          "PCIe 5.0 x16 host link.", fp16=989.0, bf16=989.0, aliases=("h200-sxm", "h200-141gb")),
    _spec("cpu", 1.0, 50, 10 * GB, 64 * GiB,
          "A generic server CPU, not a measurement: 16 AVX2 cores at 2 GHz with two 8-wide FP32 FMA units "
          "(1 TFLOP/s), 50 GB/s DRAM, 10 GB/s memcpy as the 'host link', 64 GiB. Calibrate it with a "
          "measured profile of this machine.", latency=2e-6, aliases=("host",)),
)


class DeviceFileError(KeyError):
    """A device file that cannot be read as a ``DeviceSpec``: one line saying why."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


# a device file's fields: (key, meaning); the first five are required
DEVICE_FILE_FIELDS = (
    ("name", "the name rows and profiles carry, e.g. A10"),
    ("memory", "the card's memory: bytes, or a text such as 24GiB"),
    ("fp32_tflops", "peak FP32 TFLOP/s"),
    ("memory_bandwidth_gbs", "device memory bandwidth, GB/s"),
    ("host_link_gbs", "pinned host<->device copy rate, GB/s (PCIe 4.0 x16: about 25)"),
    ("fp16_tflops", "peak FP16 TFLOP/s (absent or null: FP32's)"),
    ("bf16_tflops", "peak BF16 TFLOP/s (absent or null: FP32's)"),
    ("launch_latency_s", "per-kernel launch latency, seconds (absent or null: 5e-6)"),
    ("source", "where the numbers come from (absent or null: the file's path)"),
)
_REQUIRED = 5


def from_file(path: str) -> DeviceSpec:
    """The ``DeviceSpec`` a JSON file describes (``DEVICE_FILE_FIELDS``): a card the table does not list."""
    from harness.plugins import close_names
    from harness.units import parse_bytes

    def bad(why: str) -> DeviceFileError:
        return DeviceFileError(f"device file {path}: {why}")

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise bad("no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"not a JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise bad("must hold one JSON object of " + ", ".join(k for k, _ in DEVICE_FILE_FIELDS))
    known = [k for k, _ in DEVICE_FILE_FIELDS]
    for key in data:
        if key not in known:
            near = close_names(key, known, 1)
            raise bad(f"unknown field {key!r}" + (f"; did you mean {near[0]!r}?" if near else
                                                  f"; the fields are {', '.join(known)}"))
    missing = [k for k in known[:_REQUIRED] if data.get(k) is None]
    if missing:
        raise bad(f"missing {', '.join(missing)} ("
                  + "; ".join(f"{k}: {m}" for k, m in DEVICE_FILE_FIELDS if k in missing) + ")")
    numbers = {}
    for key in ("fp32_tflops", "memory_bandwidth_gbs", "host_link_gbs", "fp16_tflops", "bf16_tflops",
                "launch_latency_s"):
        value = data.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e30:
            raise bad(f"{key} must be a positive number (below 1e30), got {value!r}")
        numbers[key] = float(value)
    if isinstance(data["memory"], bool) or not isinstance(data["memory"], (str, int, float)):
        raise bad(f"memory must be bytes or a text such as 24GiB, got {data['memory']!r}")
    try:
        memory = parse_bytes(data["memory"])
    except (TypeError, ValueError) as exc:
        raise bad(f"memory: {exc}") from None
    if memory < 2**20:  # "memory": 24 is 24 bytes: no card
        raise bad(f"memory must be at least 1 MiB, got {data['memory']!r} (a number is bytes: write \"24GiB\")")
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise bad("name must be a text, e.g. \"A10\"")
    return _spec(name.strip(), numbers["fp32_tflops"], numbers["memory_bandwidth_gbs"],
                 numbers["host_link_gbs"] * GB, memory, str(data.get("source") or f"described in {path}"),
                 fp16=numbers.get("fp16_tflops"), bf16=numbers.get("bf16_tflops"),
                 latency=numbers.get("launch_latency_s", 5e-6))


def spec(name: str) -> DeviceSpec:
    """The spec called ``name`` (case-insensitive, aliases accepted), or the one a ``.json`` file describes
    (``from_file``); ``KeyError`` lists the choices."""
    if name.strip().lower().endswith(".json"):
        return from_file(name.strip())
    wanted = name.strip().lower()
    for s in SPECS:
        if wanted == s.name.lower() or wanted in s.aliases:
            return s
    raise KeyError(f"no device spec {name!r}; known: {', '.join(s.name for s in SPECS)}, or a JSON file describing "
                   "the card (docs/cli.md, 'A device of your own')")


def match_gpu(device_name: str) -> DeviceSpec | None:
    """The spec of a GPU from its driver name (``torch.cuda.get_device_name()``), if listed."""
    text = device_name.upper()
    for token, name in (("H200", "H200"), ("H100", "H100"), ("A100", "A100"), ("V100", "V100-PCIe"),
                        ("P100", "P100"), ("K40", "K40m"), ("TITAN X", "TitanX-Maxwell"), ("970", "GTX-970")):
        if token in text:
            return spec(name)
    return None


def torch_device_refusal(name: str) -> str | None:
    """Why the torch profiler cannot measure on ``name`` (a suite is checked with it before any case
    runs, the profiler before it measures); None for ``cpu`` or ``cuda``, with an index or without."""
    if re.fullmatch(r"(cpu|cuda)(:[0-9]+)?", name):
        return None
    return (f"the torch profiler measures on cpu or cuda (cuda:1, ...), not {name!r}; "
            "device specs such as V100-PCIe are for the analytic profiler")


def names() -> list[str]:
    """The names of every device spec."""
    return [s.name for s in SPECS]


def summary(device: DeviceSpec) -> str:
    """One line: memory, FP32 peak, memory and host bandwidth, aliases (``membudget list --kind device``)."""
    line = (f"{device.memory / GiB:g} GiB, {device.flops_for('float32') / TFLOPS:g} TFLOP/s FP32 "
            f"({device.flops_for('float16') / TFLOPS:g} FP16, {device.flops_for('bfloat16') / TFLOPS:g} BF16), "
            f"{device.memory_bandwidth / GB:g} GB/s memory, {device.host_bandwidth / GB:g} GB/s host link")
    return line + (f"; aliases {', '.join(device.aliases)}" if device.aliases else "")


# --------------------------------------------------------------------------- efficiency

# Fraction of the roofline each stage kind reaches. Rough defaults: cuDNN convolutions and
# cuBLAS GEMMs reach about half to two thirds of FP32 peak in training (ResNet-50 at about
# 9 TFLOP/s on a 15.7 TFLOP/s V100), memory-bound kernels about two thirds of DRAM bandwidth.
DEFAULT_EFFICIENCY: dict[str, float] = {
    "conv": 0.55, "linear": 0.7, "attention": 0.5, "block": 0.55, "embedding": 0.5,
    "norm": 0.6, "pool": 0.6, "act": 0.7, "other": 0.6,
}

# The memory-optimal convolution algorithm (implicit GEMM, no workspace; moDNN's baseline,
# papers/000 section IV.A) is modelled as this much slower than the default (fastest) one.
# An assumption of this model, not a measurement: cuDNN's zero-workspace algorithms are
# commonly 1.2-2x slower than the fastest ones.
IMPLICIT_GEMM_SLOWDOWN = 1.3


@dataclass(frozen=True)
class Efficiency:
    """Per-kind fractions of the roofline (0 < f <= 1, any value accepted from calibration)."""

    factors: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_EFFICIENCY))

    def __post_init__(self) -> None:
        for kind, f in self.factors.items():
            if not f > 0:
                raise ValueError(f"efficiency of {kind!r} must be > 0, got {f}")

    def of(self, kind: str) -> float:
        """The factor for ``kind`` (that of ``other`` for a kind not listed)."""
        return self.factors.get(kind, self.factors.get("other", DEFAULT_EFFICIENCY["other"]))

    def to_json(self) -> str:
        """The factors as a JSON object."""
        return json.dumps(dict(self.factors), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Efficiency:
        """Factors from a JSON object; missing kinds keep their defaults."""
        return cls({**DEFAULT_EFFICIENCY, **json.loads(text)})


def calibrate(analytic: Profile, measured: Profile, efficiency: Efficiency | None = None) -> Efficiency:
    """Efficiency factors that make ``analytic`` match ``measured`` kind by kind.

    Both profiles must be of the same workload (same stages). For each kind the factor
    is scaled by (analytic time of that kind) / (measured time of that kind), forward and
    backward together; kinds absent from the chain keep their factor. Launch latency is
    not separated out, so the fit is exact where kernels are not latency-bound.
    """
    efficiency = efficiency or Efficiency()
    if [(s.name, s.kind) for s in analytic.stages] != [(s.name, s.kind) for s in measured.stages]:
        raise ValueError("calibrate needs two profiles of the same chain (stage names and kinds differ)")
    totals: dict[str, list[float]] = {}
    for a, m in zip(analytic.stages, measured.stages):
        t = totals.setdefault(a.kind, [0.0, 0.0])
        t[0] += a.fwd_time + a.bwd_time
        t[1] += m.fwd_time + m.bwd_time
    factors = dict(efficiency.factors)
    for kind, (est, real) in totals.items():
        if est > 0 and real > 0:
            factors[kind] = efficiency.of(kind) * est / real
    return replace(efficiency, factors=factors)


assert set(DEFAULT_EFFICIENCY) <= set(STAGE_KINDS)
