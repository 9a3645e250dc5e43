"""The data model: lossless JSON round trips and errors that name the field."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from harness.model import (
    Algorithm, MemoryBlock, ModelError, Placement, Profile, Run, Schedule, Stage, TimelineEvent, Transfer,
    from_dict, from_json, load, to_json, training_ops,
)
from harness.testing import chains
from harness.units import format_bytes, parse_bytes


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(profile=chains())
def test_profile_json_round_trip_is_lossless(profile: Profile) -> None:
    assert from_json(Profile, to_json(profile)) == profile


def test_schedule_run_and_placement_round_trip() -> None:
    schedule = Schedule("p", 123, training_ops(3, 2), (Transfer(1, "offload", 1, "start", 2, 1, 7),),
                        algorithms=(0, -1, 1), sub_batches=2, options={"slots": 500}, notes="n")
    run = Run("simulate", "p", "ok", "", 1.25, 1.0, 100, 7,
              timeline=(TimelineEvent("F0", "compute", 0.0, 0.1),),
              trace=(MemoryBlock(0, "x0", 10, 0.0, 0.1 + 0.2),), metrics={"stall_s": 0.5})
    placement = Placement("bestfit", (0, 16), 32, 30, optimal=True)
    for obj in (schedule, run, placement):
        assert from_json(type(obj), to_json(obj)) == obj
    assert from_json(Run, to_json(run)).trace[0].free == 0.1 + 0.2  # every bit of a float survives


def test_schedule_duplex_round_trip_and_older_files() -> None:
    """The copy-engine layout survives JSON; a schedule written before the field existed reads as
    one shared engine."""
    schedule = Schedule("p", 123, training_ops(2), duplex=True)
    assert from_json(Schedule, to_json(schedule)) == schedule
    old = json.loads(to_json(replace(schedule, duplex=False)))
    del old["duplex"]
    assert from_json(Schedule, json.dumps(old)).duplex is False


def test_placement_lower_bound_round_trip_and_older_files() -> None:
    """``lower_bound_bytes`` survives JSON; a placement written before the field existed still reads."""
    p = Placement("minisearch", (0, 16), 32, 30, optimal=False, notes="n", lower_bound_bytes=31)
    assert from_json(Placement, to_json(p)) == p
    assert p.gap == (32 - 31) / 32
    old = json.loads(to_json(Placement("bestfit", (0, 16), 32, 30)))
    del old["lower_bound_bytes"]
    back = from_json(Placement, json.dumps(old))
    assert back.lower_bound_bytes is None and back.gap is None
    assert Placement("x", (0,), 8, 8, optimal=True).gap == 0.0


def test_malformed_profile_names_every_bad_field() -> None:
    stage = Stage("a", "conv", 1.0, 1.0, 1, 1, 1)
    profile = Profile("m", 1, (3,), "d", 1, 1.0, 1.0, 0, 0, (stage, stage))
    data = json.loads(to_json(profile))
    data["stages"][0]["saved_bytes"] = -5
    data["stages"][1]["kind"] = "convolution"
    del data["d2h_bandwidth"]
    with pytest.raises(ModelError) as err:
        from_dict(Profile, data, source="p.json")
    text = str(err.value)
    assert "p.json" in text
    assert "stages.0: saved_bytes must be >= 0" in text
    assert "stages.1.kind" in text
    assert "d2h_bandwidth" in text
    with pytest.raises(ModelError, match="not valid JSON"):
        from_json(Profile, "{", source="p.json")


def test_profile_needs_stages_and_positive_bandwidth() -> None:
    stage = Stage("a", "conv", 1.0, 1.0, 1, 1, 1)
    with pytest.raises(ValueError, match="at least one stage"):
        Profile("m", 1, (3,), "d", 1, 1.0, 1.0, 0, 0, ())
    with pytest.raises(ValueError, match="bandwidth"):
        Profile("m", 1, (3,), "d", 1, 0.0, 1.0, 0, 0, (stage,))


def test_at_batch_prefers_a_measured_variant_and_else_scales() -> None:
    stage = Stage("a", "conv", 2.0, 4.0, 100, 200, 100, 10, 20)
    small = Profile("m", 2, (3,), "d", 1, 1.0, 1.0, 5, 8, (Stage("a", "conv", 1.5, 3.0, 25, 50, 25),), measured=True)
    profile = Profile("m", 8, (3,), "d", 1, 1.0, 1.0, 5, 32, (stage,), variants=(small,))
    assert profile.at_batch(2) == small
    double = profile.at_batch(16)  # above every measured batch: this profile scaled linearly
    assert double.stages[0].saved_bytes == 400 and double.stages[0].fwd_time == 4.0
    assert double.weight_bytes == 5 and double.output_bytes == 64 and not double.measured
    assert double.notes["derived_from"] == "batch 8, scaled linearly"
    one = profile.at_batch(1)  # below every measured batch: the same rule
    assert one.stages[0].fwd_time == 0.25 and "scaled" in one.notes["derived_from"]


def test_at_batch_keeps_the_device_host_link_for_every_batch() -> None:
    """Each measured variant measured the host link again; the device has one link."""
    stage = Stage("a", "conv", 2.0, 4.0, 100, 200, 100)
    noisy = Profile("m", 2, (3,), "d", 1, 0.5, 0.6, 5, 8, (Stage("a", "conv", 1.5, 3.0, 25, 50, 25),), measured=True)
    other = Profile("m", 4, (3,), "d", 1, 0.7, 0.8, 5, 16, (Stage("a", "conv", 1.6, 3.2, 50, 100, 50),), measured=True)
    profile = Profile("m", 8, (3,), "d", 1, 1.0, 2.0, 5, 32, (stage,), variants=(noisy, other))
    for batch in (1, 2, 3, 4, 6, 16):
        p = profile.at_batch(batch)
        assert (p.d2h_bandwidth, p.h2d_bandwidth) == (1.0, 2.0), batch
    assert profile.at_batch(2).stages == noisy.stages


def test_at_batch_interpolates_between_the_two_nearest_measured_batches() -> None:
    def at(batch: int, fwd: float, bwd: float, ws: int, algorithms=()) -> Profile:
        s = Stage("a", "conv", fwd, bwd, 10 * batch, 20 * batch + 4, 10 * batch, ws, 0, algorithms)
        return Profile("m", batch, (3,), "d", 1, 1.0, 1.0, 5, 4 * batch, (s,), measured=True)

    b2, b6 = at(2, 1.0, 2.0, 100), at(6, 2.0, 3.0, 300)
    profile = replace(at(10, 10.0, 20.0, 900), variants=(b6, b2))  # variants in any order
    four = profile.at_batch(4)
    s = four.stages[0]
    assert s.fwd_time == pytest.approx(1.5) and s.bwd_time == pytest.approx(2.5)  # not 4/10 of batch 10's
    assert s.fwd_workspace == 200
    assert (s.input_bytes, s.saved_bytes, s.grad_bytes, four.output_bytes) == (40, 84, 40, 16)  # affine: exact
    assert four.notes["derived_from"].startswith("batches 2 and 6") and not four.measured and not four.variants
    eight = profile.at_batch(8).stages[0]  # between the last variant and the profile itself
    assert eight.fwd_time == pytest.approx(6.0) and eight.fwd_workspace == 600


def test_at_batch_interpolates_algorithms_only_when_both_neighbours_list_them() -> None:
    def at(batch: int, algorithms) -> Profile:
        s = Stage("a", "conv", 1.0 * batch, 1.0 * batch, batch, batch, batch, 0, 0, algorithms)
        return Profile("m", batch, (3,), "d", 1, 1.0, 1.0, 0, batch, (s,))

    fast = lambda b, t, ws: Algorithm("fast", t, t, ws, ws)  # noqa: E731
    lo, hi = at(2, (fast(2, 1.0, 10),)), at(4, (fast(4, 3.0, 30),))
    alg = replace(hi, variants=(lo,)).at_batch(3).stages[0].algorithms
    assert alg == (Algorithm("fast", 2.0, 2.0, 20, 20),)
    other = at(4, (Algorithm("other", 3.0, 3.0, 30, 30),))
    mixed = replace(other, variants=(lo,))  # names differ: the nearer neighbour's, scaled linearly
    assert mixed.at_batch(3).stages[0].algorithms == (Algorithm("fast", 1.5, 1.5, 15, 15),)  # halfway: the lower
    assert mixed.at_batch(4).stages[0].algorithms == other.stages[0].algorithms


def test_at_batch_does_not_interpolate_between_different_chains() -> None:
    one = Profile("m", 2, (3,), "d", 1, 1.0, 1.0, 0, 2, (Stage("x", "conv", 9.0, 9.0, 2, 2, 2),))
    profile = Profile("m", 4, (3,), "d", 1, 1.0, 1.0, 0, 4, (Stage("a", "conv", 4.0, 4.0, 4, 4, 4),), variants=(one,))
    three = profile.at_batch(3)
    assert three.stages[0].name == "a" and three.stages[0].fwd_time == 3.0
    assert "scaled" in three.notes["derived_from"]


SCALING = Path(__file__).resolve().parents[1] / "results" / "profiles"


@pytest.fixture(scope="module")
def vgg16_h100() -> Profile:
    """VGG-16 at batch 256 measured on an H100 with variants at 1..192 (results/profiles)."""
    path = SCALING / "vgg16-b256-h100-scaling.json"
    assert path.exists(), f"{path} is committed: the H100 scaling check needs it"
    return load(Profile, path)


def test_at_batch_on_measured_scaling_data(vgg16_h100: Profile) -> None:
    p = vgg16_h100
    measured = sorted([p.batch_size, *(v.batch_size for v in p.variants)])
    for v in p.variants:
        assert p.at_batch(v.batch_size).stages == v.stages  # exact at a measured batch
    for lo, hi in zip(measured, measured[1:]):
        if hi - lo < 2:
            continue
        mid = p.at_batch((lo + hi) // 2)
        a, b = p.at_batch(lo), p.at_batch(hi)
        assert mid.notes["derived_from"].startswith(f"batches {lo} and {hi}")
        for s, x, y in zip(mid.stages, a.stages, b.stages):  # every figure between the neighbours'
            for k in ("fwd_time", "bwd_time", "flops", "saved_bytes", "fwd_workspace", "bwd_workspace"):
                assert min(getattr(x, k), getattr(y, k)) <= getattr(s, k) <= max(getattr(x, k), getattr(y, k))
    # the data: per-sample time falls with the batch; interpolation keeps it falling at every batch,
    # where linear scaling from batch 256 would make it flat
    per_sample = [p.at_batch(b).compute_time / b for b in range(1, p.batch_size + 1)]
    assert all(x >= y for x, y in zip(per_sample, per_sample[1:]))
    assert per_sample[2] > 2 * per_sample[-1]  # batch 3 runs well below batch 256's efficiency
    # the activations of the measured variants are linear in the batch, so interpolated ones agree with them
    for b in (3, 100, 200):
        scaled = p.at_batch(b).stages
        for s, base in zip(scaled, p.stages):
            assert abs(s.input_bytes - base.input_bytes * b / p.batch_size) <= 1


def test_training_ops_order() -> None:
    labels = [op.label for op in training_ops(2, 2)]
    assert labels == ["F0", "F1", "B1", "B0", "F0/1", "F1/1", "B1/1", "B0/1"]


@pytest.mark.parametrize("text,expected", [
    ("512MiB", 512 * 2**20), ("4GiB", 4 * 2**30), ("1.5GB", 1_500_000_000), ("1e3", 1000), (2048, 2048),
])
def test_parse_bytes(text, expected) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["4 parsecs", "-1GiB", "", -3])
def test_parse_bytes_rejects_nonsense(bad) -> None:
    with pytest.raises(ValueError):
        parse_bytes(bad)


def test_format_bytes() -> None:
    assert format_bytes(1536 * 2**20) == "1.50 GiB"
    assert format_bytes(12) == "12 B"


def test_non_finite_figures_are_refused_not_simulated_forever() -> None:
    stage = Stage("a", "conv", 1.0, 1.0, 1, 1, 1)
    data = json.loads(to_json(Profile("m", 1, (3,), "d", 1, 1.0, 1.0, 0, 0, (stage,))))
    data["stages"][0]["fwd_time"] = float("nan")
    with pytest.raises(ModelError, match="fwd_time must be a finite number"):
        from_dict(Profile, data)
    data["stages"][0]["fwd_time"] = 1.0
    data["h2d_bandwidth"] = float("inf")
    with pytest.raises(ModelError, match="finite"):
        from_dict(Profile, data)


@pytest.mark.parametrize("size, says", [(2**63, "got 9223372036854775808"), (2**1100, "got a 332-digit number")])
def test_a_size_beyond_the_simulator_s_integers_is_refused_in_one_line(size, says) -> None:
    """2**63 bytes overflowed the simulator's int64 arrays (an OverflowError traceback); 2**1100 broke
    the finiteness check itself."""
    stage = Stage("a", "conv", 1.0, 1.0, 1, 1, 1)
    data = json.loads(to_json(Profile("m", 1, (3,), "d", 1, 1.0, 1.0, 0, 0, (stage,))))
    data["stages"][0]["saved_bytes"] = size
    with pytest.raises(ModelError, match=f"stages.0: saved_bytes must be at most 2\\*\\*50 bytes \\(1 PiB\\), {says}$"):
        from_dict(Profile, data)
    data["stages"][0]["saved_bytes"] = 2**50  # the largest allowed
    assert from_dict(Profile, data).stages[0].saved_bytes == 2**50


def test_sizes_that_add_up_past_what_the_simulator_counts_exactly_are_refused() -> None:
    """Sizes of 2**50 bytes adding up past 2**53: the simulator's peak came out a byte under the trace's, so a
    keep-all schedule at the reported peak was a byte over its budget (found by a QA fuzzer). 2**53 bytes in
    all is refused; a byte less is a profile."""
    stage = Stage("a", "conv", 1.0, 1.0, 2**50, 2**50, 2**50)
    data = json.loads(to_json(Profile("m", 1, (3,), "d", 1, 1.0, 1.0, 2**50, 0, (stage,))))
    data["stages"] = [dict(data["stages"][0]) for _ in range(2)]
    data["output_bytes"] = 2**49  # counted twice: the output and its gradient
    with pytest.raises(ModelError, match=rf"the sizes add up to {2**53} bytes, 2\*\*53 \(8 PiB\) or more"):
        from_dict(Profile, data)  # weights, output twice and two stages: 8 * 2**50
    data["weight_bytes"] -= 1
    assert from_dict(Profile, data).n_stages == 2


def test_a_fraction_is_not_a_byte_count() -> None:
    with pytest.raises(ValueError, match="50%"):
        parse_bytes("0.5")
    assert parse_bytes("1.5KiB") == 1536
