"""The data model: lossless JSON round trips and errors that name the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings

from harness.model import (
    MemoryBlock, ModelError, Placement, Profile, Run, Schedule, Stage, TimelineEvent, Transfer,
    from_dict, from_json, to_json, training_ops,
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
    assert profile.at_batch(2) is small
    half = profile.at_batch(4)
    assert half.stages[0].saved_bytes == 100 and half.stages[0].fwd_time == 1.0
    assert half.weight_bytes == 5 and half.output_bytes == 16
    assert "scaled" in half.notes["derived_from"]


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


def test_a_fraction_is_not_a_byte_count() -> None:
    with pytest.raises(ValueError, match="50%"):
        parse_bytes("0.5")
    assert parse_bytes("1.5KiB") == 1536
