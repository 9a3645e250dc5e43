"""A recorded CUDA allocation sequence (results/traces/h100) served from minisearch's plan.

The CPU half of running planned offsets for real (issue #18): papers/003 sections 4.1-4.3
through ``membudget_bestfit.ProfileGuidedSession`` with ``minisearch`` as its planner. The
session profiles the first iteration of the recorded sequence, plans it, and must then
answer every request of a repeated iteration from the plan (no pool, no re-plan), with
no two live planned blocks sharing an address; requests between ``interrupt()`` and
``resume()`` (a non-hot part) go to the pool without disturbing the plan; a departure
from the recording (a request larger than planned) is served by the pool and re-planned
at the end of that iteration, after which the plan serves everything again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.allocators.trace import read_csv
from membudget_bestfit import BestFit, ProfileGuidedSession
from membudget_minisearch import MiniSearch

ROOT = Path(__file__).resolve().parents[3]
H100 = sorted((ROOT / "results" / "traces" / "h100").glob("trace-*.csv"))


def recorded_events(path):
    """The trace as the allocation/free sequence it was recorded from (time order)."""
    t = read_csv(path)
    events = [(int(t.lower[i]), 1, i) for i in range(len(t))] + [(int(t.upper[i]), 0, i) for i in range(len(t))]
    events.sort()
    return [("alloc" if kind else "free", i, int(t.size[i])) for _, kind, i in events]


def play(session, events, *, bigger=None, nonhot_at=None):
    """One iteration; returns the served allocations. ``bigger``: (block, extra bytes) asked
    for instead of the recorded size; ``nonhot_at``: an event index after which an
    unmonitored request is made and freed."""
    session.begin_iteration()
    live, served, planned_live = {}, [], {}
    for step, (kind, i, size) in enumerate(events):
        if kind == "alloc":
            if bigger is not None and bigger[0] == i:
                size += bigger[1]
            a = session.malloc(size)
            live[i] = a
            served.append(a)
            if a.region == "plan" and a.size:
                for b in planned_live.values():
                    assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset
                planned_live[i] = a
        else:
            session.free(live.pop(i))
            planned_live.pop(i, None)
        if nonhot_at == step:
            with session.unmonitored():
                extra = session.malloc(64 << 20)
                assert extra.region == "pool" and extra.index is None
                session.free(extra)
    session.end_iteration()
    return served


@pytest.mark.parametrize("path", H100, ids=lambda p: p.stem)
def test_recorded_sequence_served_from_the_plan(path):
    events = recorded_events(path)
    session = ProfileGuidedSession(MiniSearch(time_limit=None, node_limit=20_000))
    first = play(session, events)
    assert all(a.region == "pool" for a in first) and session.stats.optimizations == 1
    plan = session.plan
    assert plan.allocator == "minisearch" and plan.lower_bound_bytes is not None
    assert plan.arena_bytes <= BestFit().place(session.profile_trace()).arena_bytes
    # a repeated iteration: every request from the plan, nothing re-planned
    second = play(session, events, nonhot_at=len(events) // 3)
    assert all(a.region == "plan" for a in second)
    assert session.stats.optimizations == 1 and session.arena_bytes == plan.arena_bytes
    assert session.stats.unmonitored == 1
    # a departure: one request larger than recorded -> pool now, re-plan at the end
    big = max(range(len(second)), key=lambda k: second[k].size)
    block = [i for kind, i, _ in events if kind == "alloc"][big]
    third = play(session, events, bigger=(block, 1 << 20))
    assert third[big].region == "pool" and session.stats.reoptimizations == 1
    assert any("planned" in r for r in session.stats.reasons)
    fourth = play(session, events, bigger=(block, 1 << 20))
    assert all(a.region == "plan" for a in fourth) and session.stats.reoptimizations == 1
