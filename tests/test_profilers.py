"""Profilers: chain extraction, the analytic and measured profilers, the file profiler, the command.

The central check is that the two profilers agree exactly on every size of the chain on
the CPU (they share the instrumented iteration, run on ``meta`` by one and on real
tensors by the other), and that the saved bytes are neither double counted nor lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from harness.model import STAGE_KINDS, Profile, from_json, to_json  # noqa: E402
from harness.plugins import registry  # noqa: E402
from harness.lazy import resolve  # noqa: E402
from harness.commands import profile_command  # noqa: E402
from harness.profilers import ProfilingError, devices  # noqa: E402
from harness.profilers.analytic import AnalyticProfiler  # noqa: E402
from harness.profilers.devices import Efficiency, calibrate  # noqa: E402
from harness.profilers.file import FileProfiler  # noqa: E402
from harness.chain.graph import Graph, trace  # noqa: E402
from harness.profilers.measured import LINK_SIZES, TorchProfiler, host_link, link_sizes  # noqa: E402
from harness.chain.stages import plan_stages, storage_bytes, storage_key  # noqa: E402
from harness.protocols import Profiler, Workload  # noqa: E402

QUICK = TorchProfiler(warmup=0, repeats=1, algorithms=False)


def analytic(model: str, batch: int = 2, size=(3, 32, 32), device: str = "V100-PCIe") -> Profile:
    return AnalyticProfiler().profile(Workload(model, batch, tuple(size), device))


def sizes(p: Profile) -> list:
    """Everything about a profile that must not depend on the device or on timing."""
    return [(s.name, s.kind, s.input_bytes, s.saved_bytes, s.grad_bytes, s.output_saved_bytes) for s in p.stages] + [
        ("output", p.output_bytes), ("weights", p.weight_bytes)]


def liveness_workspaces(p: Profile) -> list:
    """Workspaces without the modelled convolution workspace (that of the memory-optimal algorithm)."""
    return [(s.algorithms[0] if s.algorithms and s.algorithms[0].name == "implicit_gemm" else s).fwd_workspace
            for s in p.stages]


# --------------------------------------------------------------------------- registry


def test_builtin_profilers_are_registered():
    for name in ("analytic", "torch", "file"):
        profiler = registry().profiler(name)
        # Python >= 3.12 checks protocols with getattr_static: judge the object the lazy entry stands for
        assert isinstance(resolve(profiler), Profiler)
        assert profiler.name == name and profiler.description


# --------------------------------------------------------------------------- chain extraction


def test_tiny_cnn_chain_is_cut_where_one_tensor_is_live():
    p = analytic("builtin:tiny-cnn")
    assert [(s.name, s.kind) for s in p.stages] == [
        ("conv1", "conv"),
        ("bn1..relu1", "norm"),  # the in-place ReLU joins the BatchNorm whose output it modifies
        ("pool1", "pool"),
        ("block", "block"),  # the residual block (a non-linear part) is one virtual stage
        ("block.relu_1", "act"),
        ("conv2", "conv"),
        ("relu2", "act"),
        ("pool2", "pool"),
        ("fc", "linear"),  # the flatten (a view of pool2's output) joins the layer that consumes it
    ]
    assert p.stages[-2].input_bytes == 2 * 16 * 16 * 16 * 4  # relu2's output
    assert p.stages[-1].input_bytes == 2 * 16 * 2 * 2 * 4  # pool2's output, flattened by fc's stage
    assert p.output_bytes == 2 * 10 * 4
    assert p.stages[0].input_bytes == 2 * 3 * 32 * 32 * 4
    assert p.stages[0].grad_bytes == 0  # the data needs no gradient


def test_a_stage_never_outputs_the_memory_of_its_input():
    model, x = registry().model_factory("torchvision:resnet18").build(Workload("torchvision:resnet18", 2, (3, 32, 32)), "meta")
    graph = Graph(trace(model, x))
    plan = plan_stages(graph, x)
    assert all(s.first <= s.last for s in plan.stages)
    assert [s.name for s in plan.stages][:3] == ["conv1", "bn1..relu", "maxpool"]
    assert plan.stages[-1].name == "fc"  # avgpool -> flatten -> fc: the view joins fc
    assert all(b.input == a.output for a, b in zip(plan.stages, plan.stages[1:]))


class _Dense(torch.nn.Module):
    """A DenseNet-style block as torchvision writes it: layer k concatenates all earlier features."""

    def __init__(self, layers: int = 3, width: int = 4, grow: int = 2, write_in_place: bool = False):
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(width + k * grow, grow, 3, padding=1) for k in range(layers))
        self.write_in_place = write_in_place

    def forward(self, x):
        features = [x]
        for conv in self.convs:
            new = conv(torch.cat(features, 1))
            features.append(new)
            if self.write_in_place:
                new.mul_(2)  # after it was concatenated: cat(features) must see the new value
        return torch.cat(features, 1).sum(dim=(2, 3))


def _cats(graph: Graph) -> list:
    return [n for n in graph.nodes if n.op == "call_function" and n.target is torch.cat]


def test_growing_concatenations_become_a_chain_that_computes_the_same():
    torch.manual_seed(0)
    model, x = _Dense(), torch.randn(2, 4, 8, 8)
    graph = Graph(trace(model, x))
    cats = _cats(graph)
    assert len(cats) == 4  # one per layer and the block's output
    for before, after in zip(cats, cats[1:]):
        assert after.args[0][0] is before and len(after.args[0]) == 2  # cat([previous cat, new piece])
    assert torch.equal(graph.gm(x), model(x))
    plan = plan_stages(graph, x)
    # the one live tensor between two layers is the concatenation: one stage per layer
    assert [s.kind for s in plan.stages] == ["conv", "conv", "conv", "other"]
    assert [s.name for s in plan.stages][:3] == ["convs.0", "convs.1", "convs.2"]


def test_concatenations_of_pieces_written_in_place_stay_as_they_are():
    torch.manual_seed(0)
    model, x = _Dense(write_in_place=True), torch.randn(2, 4, 8, 8)
    graph = Graph(trace(model, x))
    # only the unwritten input may be taken from an earlier concatenation (the copy cat([x]))
    cats = _cats(graph)
    assert [len(n.args[0]) for n in cats] == [1, 2, 3, 4]
    assert all(a.target is not torch.cat or a is cats[0] for n in cats for a in n.args[0])
    assert any(a is cats[0] for a in cats[1].args[0])
    assert torch.equal(graph.gm(x), model(x))
    # every piece stays live to the end: the three layers are one stage (then the sum)
    assert [s.kind for s in plan_stages(graph, x).stages] == ["block", "other"]


class _WritesThroughAModuleView(torch.nn.Module):
    """Writes into a concatenation's piece through a view a module returns (nn.Flatten)."""

    def __init__(self):
        super().__init__()
        self.flat = torch.nn.Flatten(0)

    def forward(self, x):
        a, b = x * 2, x * 3
        p = torch.cat([a, b], 1)
        self.flat(a).mul_(10)
        return torch.cat([a, b, x * 4], 1) + p.sum()


def test_a_piece_written_through_a_module_view_is_not_taken_from_an_earlier_concatenation():
    model, x = _WritesThroughAModuleView(), torch.randn(2, 3)
    expected = model(x)
    gm = trace(model, x)
    assert torch.equal(gm(x), expected)
    assert all(len(n.args[0]) == (2 if i == 0 else 3) for i, n in enumerate(_cats(Graph(gm))))


def test_densenet_is_cut_after_every_dense_layer():
    # papers/004 section 6.1: its chains came from sequential models, where a dense layer
    # returns cat([x, new]); the stage boundary is the concatenation of all earlier features
    model, x = registry().model_factory("torchvision:densenet121").build(
        Workload("torchvision:densenet121", 2, (3, 64, 64)), "meta")
    plan = plan_stages(Graph(trace(model, x)), x)
    dense = [s.name for s in plan.stages if ".denselayer" in s.name]
    assert len(dense) == 6 + 12 + 24 + 16 == len(set(dense))
    assert dense[:2] == ["features.denseblock1.denselayer1", "features.denseblock1.denselayer2"]
    p = {s.name: s for s in analytic("torchvision:densenet121", size=(3, 64, 64)).stages}
    growth = 2 * 32 * 16 * 16 * 4  # batch 2, 32 new channels at 16x16 in block 1
    for k in range(1, 6):
        a, b = (p[f"features.denseblock1.denselayer{j}"] for j in (k, k + 1))
        assert b.input_bytes - a.input_bytes == growth


def _unsplit_saved_bytes(name: str, size, device: str) -> int:
    """Bytes autograd saves in one forward of the whole model, deduplicated by storage, weights excluded."""
    model, x = registry().model_factory(name).build(Workload(name, 2, tuple(size)), device)
    weights = {storage_key(t) for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def pack(t):
        if storage_key(t) not in weights:
            saved[storage_key(t)] = storage_bytes(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    del out
    return sum(saved.values())


@pytest.mark.parametrize("name,device", [("builtin:tiny-cnn", "cpu"), ("builtin:mlp", "cpu"),
                                         ("torchvision:resnet18", "cpu"), ("torchvision:densenet121", "meta"),
                                         ("torchvision:googlenet", "meta"), ("torchvision:swin_v2_t", "meta")])
def test_saved_bytes_are_counted_once_and_all_of_them(name, device):
    # ATTRIBUTION RULE: the per-stage saved bytes add up to what the unsplit model saves. Swin-V2 saves
    # its continuous position bias, an MLP's output made from parameters alone: stage data, not a constant.
    size = (3, 64, 64) if "googlenet" in name else (3, 32, 32)
    p = analytic(name, size=size)
    assert sum(s.saved_bytes for s in p.stages) == _unsplit_saved_bytes(name, size, device)


def test_a_saved_boundary_tensor_belongs_to_the_later_stage():
    p = {s.name: s for s in analytic("builtin:mlp").stages}
    # act1's ReLU saves its output, which fc2 saves as its input too: counted once, in fc2
    assert p["act1"].saved_bytes == 0
    assert p["fc2"].saved_bytes == p["fc2"].input_bytes == 2 * 64 * 4


def test_untraceable_models_raise_a_profiling_error():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1

    with pytest.raises(ProfilingError, match="cannot trace"):
        trace(DataDependent(), torch.empty(2, 3, device="meta"))


def test_models_with_two_outputs_are_refused():
    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.a(x), self.b(x)

    x = torch.empty(2, 3, device="meta")
    with pytest.raises(ProfilingError, match="returns 2 values"):
        plan_stages(Graph(trace(TwoHeads().to("meta"), x)), x)


# --------------------------------------------------------------------------- analytic vs measured


@pytest.mark.parametrize("name", ["torchvision:resnet18", "torchvision:vgg11", "torchvision:densenet121",
                                  "torchvision:mobilenet_v2", "torchvision:vit_b_16", "builtin:tiny-cnn",
                                  "builtin:mlp"])
def test_analytic_and_measured_profiles_agree_exactly_on_sizes_on_cpu(name):
    workload = Workload(name, 2, (3, 32, 32), "cpu")
    measured = QUICK.profile(workload)
    estimated = AnalyticProfiler().profile(replace(workload, device="V100-PCIe"))
    assert sizes(measured) == sizes(estimated)
    assert [s.flops for s in measured.stages] == [s.flops for s in estimated.stages]
    # on the CPU both estimate temporaries by liveness; the analytic default adds an im2col buffer
    assert [s.fwd_workspace for s in measured.stages] == liveness_workspaces(estimated)


def test_transformers_gpt2_profiles_agree():
    pytest.importorskip("transformers")
    workload = Workload("transformers:tiny-gpt2", 2, (16,), "cpu")
    measured = QUICK.profile(workload)
    estimated = AnalyticProfiler().profile(replace(workload, device="A100"))
    assert sizes(measured) == sizes(estimated)
    assert sum(s.kind == "block" for s in estimated.stages) == 4  # 2 layers, each 2 residual halves


def test_flops_add_up_to_the_flop_counter_of_a_whole_iteration():
    from torch.utils.flop_counter import FlopCounterMode

    name = "torchvision:resnet18"
    model, x = registry().model_factory(name).build(Workload(name, 2, (3, 64, 64)), "meta")
    with FlopCounterMode(display=False) as counter:
        out = model(x)
        out.backward(torch.empty_like(out))
    p = analytic(name, size=(3, 64, 64))
    assert sum(s.flops for s in p.stages) == counter.get_total_flops()


# --------------------------------------------------------------------------- analytic


def test_analytic_profile_of_resnet152_at_1000px_batch_256_allocates_nothing():
    # VmHWM is this process's own peak; ru_maxrss would include the pytest process it was forked from
    code = (
        "import re, resource\n"
        "from harness.commands import profile_command\n"
        "p = profile_command('torchvision:resnet152', 'analytic', 'V100-PCIe', 256, (3, 1000, 1000))\n"
        "try:\n"
        "    peak = int(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)) * 1024\n"
        "except OSError:\n"
        "    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024\n"
        "print(p.stages[0].input_bytes, sum(s.saved_bytes for s in p.stages), peak)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    input_bytes, saved, peak_rss = (int(v) for v in out.stdout.split())
    assert input_bytes == 256 * 3 * 1000 * 1000 * 4  # 3.07 GB of images...
    assert saved > 500e9  # ...and over half a terabyte of activations...
    assert peak_rss < 3e9  # ...while the whole process never held 3 GB


def test_analytic_times_come_from_the_device_roofline():
    slow, fast = analytic("torchvision:resnet18", 32, device="K40m"), analytic("torchvision:resnet18", 32, device="H100")
    assert sizes(slow) == sizes(fast)
    assert slow.compute_time > fast.compute_time > 0
    spec = devices.spec("K40m")
    for s in slow.stages:
        assert s.fwd_time > 0 and s.bwd_time > 0
        assert s.fwd_time + s.bwd_time >= s.flops / spec.flops_for("float32")  # efficiency <= 1
    assert slow.device == "K40m" and slow.d2h_bandwidth == spec.host_bandwidth
    assert slow.device_memory == 12 * 2**30


def test_conv_stages_offer_a_memory_optimal_algorithm_first():
    p = analytic("torchvision:vgg11", 8)
    conv = [s for s in p.stages if s.kind == "conv"]
    assert conv and all(len(s.algorithms) == 2 for s in conv)
    for s in conv:
        optimal, default = s.algorithms
        assert optimal.fwd_workspace < default.fwd_workspace == s.fwd_workspace
        assert optimal.fwd_time > default.fwd_time == s.fwd_time
    assert all(not s.algorithms for s in p.stages if s.kind in ("pool", "linear"))


def test_profiles_survive_json():
    p = analytic("torchvision:resnet18")
    assert from_json(Profile, to_json(p)) == p
    assert all(s.kind in STAGE_KINDS for s in p.stages)


def test_analytic_variants_are_profiled_at_other_batches():
    p = AnalyticProfiler(variant_batches=(1, 4)).profile(Workload("builtin:mlp", 2, (3, 8, 8), "A100"))
    assert [v.batch_size for v in p.variants] == [1, 4]
    assert p.at_batch(4).stages[0].input_bytes == 2 * p.stages[0].input_bytes


def test_unknown_device_specs_are_refused_with_the_list():
    with pytest.raises(ProfilingError, match="V100-PCIe"):
        analytic("builtin:mlp", device="TPU-v9")


# --------------------------------------------------------------------------- device specs and calibration


@pytest.mark.parametrize("name", ["K40m", "GTX 970", "Titan X", "P100", "V100-PCIe", "A100", "H100", "H200", "cpu"])
def test_device_specs_cover_the_papers_gpus(name):
    spec = devices.spec(name)
    assert spec.flops_for("float32") > 1e12 or spec.name == "cpu"
    assert spec.memory_bandwidth > 0 and spec.host_bandwidth > 0 and spec.memory > 0
    assert spec.flops_for("float16") >= spec.flops_for("float32")
    assert len(spec.source) > 40


def test_v100_host_link_is_the_one_measured_in_papers_004():
    assert devices.spec("V100-PCIe").host_bandwidth == 12.2e9
    assert devices.match_gpu("Tesla V100-PCIE-16GB").name == "V100-PCIe"
    assert devices.match_gpu("NVIDIA H100 80GB HBM3").name == "H100"
    with pytest.raises(KeyError, match="H200"):
        devices.spec("B200")


def test_calibration_scales_each_kind_to_the_measured_times():
    est = analytic("builtin:tiny-cnn", device="cpu")
    measured = replace(est, stages=tuple(replace(s, fwd_time=3 * s.fwd_time, bwd_time=3 * s.bwd_time)
                                         for s in est.stages))
    eff = Efficiency()
    fitted = calibrate(est, measured, eff)
    for kind in {s.kind for s in est.stages}:
        assert fitted.of(kind) == pytest.approx(eff.of(kind) / 3)
    assert fitted.of("attention") == eff.of("attention")  # not in this chain: unchanged
    assert Efficiency.from_json(fitted.to_json()) == fitted
    with pytest.raises(ValueError, match="same chain"):
        calibrate(est, analytic("builtin:mlp", device="cpu"))


def test_a_calibrated_profiler_is_slower_where_the_device_is_slower():
    est = analytic("builtin:tiny-cnn", device="cpu")
    half = Efficiency({k: v / 2 for k, v in Efficiency().factors.items()})
    slower = AnalyticProfiler(efficiency=half).profile(Workload("builtin:tiny-cnn", 2, (3, 32, 32), "cpu"))
    assert slower.compute_time > est.compute_time


# --------------------------------------------------------------------------- measured


def test_measured_profile_on_cpu():
    profiler = TorchProfiler(warmup=1, repeats=3, variant_batches=(1,))
    p = profiler.profile(Workload("builtin:tiny-cnn", 4, (3, 32, 32), "cpu"))
    assert p.measured and p.profiler == "torch" and p.device == "cpu"
    assert all(s.fwd_time > 0 and s.bwd_time > 0 for s in p.stages)
    assert p.d2h_bandwidth > 0 and p.h2d_bandwidth > 0
    assert "at the sizes the stages save" in p.notes["host_link"] and "MiB: " in p.notes["host_link"]
    assert [v.batch_size for v in p.variants] == [1] and p.variants[0].measured
    assert p.at_batch(1).stages == p.variants[0].stages
    conv = [s for s in p.stages if s.kind in ("conv", "block")]
    expected = {"onednn", "native"} if torch.backends.mkldnn.is_available() else {"native"}
    for s in conv:
        assert {a.name for a in s.algorithms} == expected
        assert s.algorithms[0].fwd_workspace == min(a.fwd_workspace for a in s.algorithms)
    assert from_json(Profile, to_json(p)) == p


def test_every_timed_backward_assigns_the_gradients_as_the_executors_iteration_does():
    """The torch executor drops the parameters' gradients before every iteration, so its B_s assigns
    them; the profiler times B_s the same way in every repeat, not onto the last repeat's gradients
    (one addition per parameter more: one difference of method behind the H200's ResNet-50 keep-all
    backwards running 4.6% faster than their profile said, docs/gpu.md)."""
    from harness.chain.extract import extract
    from harness.profilers.measured import StageRunner, Timer

    chain = extract(Workload("builtin:tiny-cnn", 2, (3, 32, 32), "cpu"), "cpu")
    runner = StageRunner(chain)
    before, after = [], []

    class Watching(Timer):
        def __call__(self, fn):
            before.append(all(p.grad is None for p in runner.params))
            seconds = super().__call__(fn)
            after.append(any(p.grad is not None for p in runner.params))
            return seconds

    stage = next(s for s, span in enumerate(chain.plan.stages) if span.kind == "conv")
    TorchProfiler(warmup=1, repeats=3)._times(runner, stage, Watching(torch.device("cpu")))
    assert len(before) == 2 * (1 + 3)  # a forward and a backward per run
    assert all(after[1::2]), "the backward gave the stage's parameters gradients"
    assert all(before[1::2]), "a timed backward found the last run's gradients"
    assert all(p.grad is None for p in runner.params)


def test_the_host_link_is_timed_at_the_sizes_the_stages_save():
    stages = analytic("builtin:tiny-cnn").stages
    mib = 1 << 20
    saving = [replace(stages[0], saved_bytes=b) for b in (0, 40 * mib, 10 * mib, 30 * mib, 5 << 30, 20 * mib)]
    # the quartiles and the largest of 10, 20, 30, 40 MiB and 5 GiB (the stage saving nothing left out),
    # the largest clipped to 1 GiB
    assert link_sizes(tuple(saving)) == (20 * mib, 30 * mib, 40 * mib, 1 << 30)
    assert link_sizes(tuple(replace(s, saved_bytes=1000) for s in stages)) == (mib,)  # at least 1 MiB
    assert link_sizes(tuple(replace(s, saved_bytes=0) for s in stages)) == LINK_SIZES


def test_the_host_link_rate_is_that_of_all_the_sizes_together_not_the_best_one():
    link = host_link(torch.device("cpu"), (1 << 20, 8 << 20), repeats=2)
    sizes = [size for size, _, _ in link.per_size]
    assert sizes == [1 << 20, 8 << 20]
    for way, rates in ((link.d2h, [d for _, d, _ in link.per_size]), (link.h2d, [h for _, _, h in link.per_size])):
        # bytes over seconds: the harmonic mean weighted by size, below the best size's rate
        assert way == pytest.approx(sum(sizes) / sum(s / r for s, r in zip(sizes, rates)), rel=1e-9)
        assert min(rates) <= way <= max(rates)
    assert link.describe().startswith("1 MiB: ") and "; 8 MiB: " in link.describe()


def test_measured_profiler_refuses_devices_it_cannot_use():
    with pytest.raises(ProfilingError, match="cpu or cuda"):
        QUICK.profile(Workload("builtin:mlp", 2, (3, 8, 8), "V100-PCIe"))
    if not torch.cuda.is_available():
        with pytest.raises(ProfilingError, match="no CUDA GPU"):
            QUICK.profile(Workload("builtin:mlp", 2, (3, 8, 8), "cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_measured_profile_on_cuda():
    p = TorchProfiler(warmup=1, repeats=3).profile(Workload("builtin:tiny-cnn", 8, (3, 32, 32), "cuda"))
    est = analytic("builtin:tiny-cnn", 8)
    assert [(s.input_bytes, s.grad_bytes) for s in p.stages] == [(s.input_bytes, s.grad_bytes) for s in est.stages]
    assert all(s.fwd_time > 0 and s.fwd_workspace >= 0 for s in p.stages)
    assert p.d2h_bandwidth > 1e9 and p.device_memory > 0
    assert any(s.algorithms for s in p.stages)


# --------------------------------------------------------------------------- file profiler and command


def test_profile_command_writes_what_the_file_profiler_reads(tmp_path):
    path = tmp_path / "profiles" / "tiny.json"
    written = profile_command("builtin:tiny-cnn", "analytic", "P100", 4, output=path)
    assert json.loads(path.read_text())["model"] == "builtin:tiny-cnn"
    read = FileProfiler().profile(Workload(str(path), 4))
    assert read == written
    scaled = registry().profiler("file").profile(Workload("file:" + str(path), 8))
    assert scaled.batch_size == 8 and "derived_from" in scaled.notes
    assert scaled.stages[0].input_bytes == 2 * written.stages[0].input_bytes


def test_file_profiler_errors_name_the_file(tmp_path):
    with pytest.raises(ProfilingError, match="not a file"):
        FileProfiler().profile(Workload(str(tmp_path / "missing.json"), 1))
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "x"}')
    with pytest.raises(ProfilingError, match="bad.json"):
        FileProfiler().profile(Workload(str(bad), 1))


def test_profile_command_passes_options_to_the_profiler(tmp_path):
    p = profile_command("builtin:mlp", "torch", "cpu", 2, (3, 8, 8), tmp_path / "p.json", repeats=1, warmup=0)
    assert p.measured and "median of 1 runs" in p.notes["times"]
    with pytest.raises(ProfilingError, match="does not take"):
        profile_command("builtin:mlp", "torch", "cpu", 2, (3, 8, 8), repetitions=3)


def test_a_card_the_table_does_not_list_is_described_in_a_json_file(tmp_path):
    """QA: an engineer with an A10 had no way to profile for it. A device file gives the roofline's
    numbers: the profile carries its name, memory and host link, and a card with twice the FP32 peak and
    memory bandwidth runs every stage in no more time; the bundled example is a valid file."""
    example = Path(__file__).resolve().parents[1] / "suites" / "devices" / "nvidia-a10.json"
    a10 = devices.spec(str(example))
    assert a10.name == "A10" and a10.memory == 24 * 2**30 and a10.flops_for("bfloat16") == 125e12
    card = {"name": "Card", "memory": "24GiB", "fp32_tflops": 10, "memory_bandwidth_gbs": 500, "host_link_gbs": 20}
    slow, fast = tmp_path / "slow.json", tmp_path / "fast.json"
    slow.write_text(json.dumps(card))
    fast.write_text(json.dumps({**card, "fp32_tflops": 20, "memory_bandwidth_gbs": 1000}))
    p_slow, p_fast = analytic("builtin:tiny-cnn", device=str(slow)), analytic("builtin:tiny-cnn", device=str(fast))
    assert p_slow.device == "Card" and p_slow.device_memory == 24 * 2**30 and p_slow.h2d_bandwidth == 20e9
    assert sizes(p_slow) == sizes(p_fast)
    assert all(f.fwd_time <= s.fwd_time and f.bwd_time <= s.bwd_time for s, f in zip(p_slow.stages, p_fast.stages))
    assert p_fast.compute_time < p_slow.compute_time


@pytest.mark.parametrize("text,needle", [
    ('{"name": "x", "memory": "1GiB", "fp32_tflop": 1}', "unknown field 'fp32_tflop'; did you mean 'fp32_tflops'?"),
    ('{"name": "x", "memory": "1GiB", "fp32_tflops": 1}', "missing memory_bandwidth_gbs, host_link_gbs ("),
    ('{"name": "x", "memory": "1GiB", "fp32_tflops": 0, "memory_bandwidth_gbs": 1, "host_link_gbs": 1}',
     "fp32_tflops must be a positive number (below 1e30), got 0"),
    ('{"name": "x", "memory": "lots", "fp32_tflops": 1, "memory_bandwidth_gbs": 1, "host_link_gbs": 1}', "memory: "),
    ('[1, 2]', "must hold one JSON object of name, memory"),
    ('{"name": "x", "memory": 24, "fp32_tflops": 1, "memory_bandwidth_gbs": 1, "host_link_gbs": 1}',
     'memory must be at least 1 MiB, got 24 (a number is bytes: write "24GiB")'),
    ('{"name": "x", "memory": "1GiB", "fp32_tflops": null, "memory_bandwidth_gbs": 1, "host_link_gbs": 1}',
     "missing fp32_tflops ("),
    ('{"name": "x", "memory": [1], "fp32_tflops": 1, "memory_bandwidth_gbs": 1, "host_link_gbs": 1}',
     "memory must be bytes or a text such as 24GiB, got [1]"),
    ('{"name": "x", "memory": "1GiB", "fp32_tflops": 1e308, "memory_bandwidth_gbs": 1, "host_link_gbs": 1}',
     "fp32_tflops must be a positive number (below 1e30)"),
    ('{"name": ', "not a JSON file"),
])
def test_a_device_file_that_is_wrong_says_so_in_one_line(tmp_path, text, needle):
    path = tmp_path / "card.json"
    path.write_text(text)
    with pytest.raises(ProfilingError) as err:
        analytic("builtin:tiny-cnn", device=str(path))
    assert f"device file {path}: " in str(err.value) and needle in str(err.value) and "\n" not in str(err.value)


def test_the_op_counter_counts_no_traffic_for_operations_that_launch_no_kernel():
    """QA found GPT-2's attention blocks costed 15% above their traffic: ``_unsafe_view`` (the reshape
    after a batched matmul) and ``_assert_tensor_metadata`` (a check a traced graph keeps) moved no
    bytes on a GPU, yet the roofline counted their arguments and results, and a launch each."""
    from harness.profilers.instrument import OpCounter

    a, b = torch.empty(8, 16, 32, device="meta"), torch.empty(32, 64, device="meta")
    with OpCounter() as counter:
        out = torch.matmul(a, b)  # mm on the flattened input, then _unsafe_view back to 3-D
        torch.ops.aten._assert_tensor_metadata(out, dtype=out.dtype)
    assert counter.stats.n_ops == 1
    assert counter.stats.nbytes == [4.0 * (8 * 16 * 32 + 32 * 64 + 8 * 16 * 64)]
    assert counter.stats.total_flops == 2 * 8 * 16 * 32 * 64
