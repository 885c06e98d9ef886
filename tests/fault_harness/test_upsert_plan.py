"""Upsert pipelines in the random plans and among the named scenarios (no cluster needed): one
pipeline in each five is an upsert pipeline, every other pipeline's plan is what it was before
upsert pipelines were added, and an upsert pipeline keeps its pipeline's faults, runs one epoch at
a time, is never reprocessed, and pauses the persist of the hour it compacts under. The plans are
drawn without audited pipelines (``audits=False``): those are ``test_random_plan``'s."""

from __future__ import annotations

import pytest

from fault_harness.plans import Scenario, describe_plan
from fault_harness.scenarios import UPSERT_EVERY, named_scenarios, random_plan
from fault_harness.upsert_actions import COMPACTION_POINT
from tests.fault_harness.test_fault_harness_random import CI_PER_PIPELINE, CI_RANDOM_EPOCHS, CI_SEED

SEED, EPOCHS = 1783964432, 200


def _compacted(s: Scenario) -> list[int]:
    return [r.epoch for r in s.rules if r.point == COMPACTION_POINT and r.mode == "pause"]


def test_one_pipeline_in_each_five_is_an_upsert_pipeline_and_the_others_are_unchanged() -> None:
    plan = random_plan(SEED, EPOCHS, audits=False)
    before = random_plan(SEED, EPOCHS, upserts=False, audits=False)
    assert len(plan) == len(before) == 20
    for block in range(0, len(plan), UPSERT_EVERY):
        assert sum(s.mode == "upsert" for s in plan[block : block + UPSERT_EVERY]) == 1
    assert all(s.mode == "append" for s in before)
    for s, was in zip(describe_plan(plan), describe_plan(before), strict=True):
        if s["mode"] == "append":
            assert s == was
    assert (
        random_plan(SEED, EPOCHS, stack="production", audits=False)[3].mode == plan[3].mode
    )  # the same pipelines on both stacks


def test_an_upsert_pipeline_keeps_its_faults_runs_one_epoch_at_a_time_and_is_never_reprocessed() -> None:
    plan, before = random_plan(SEED, EPOCHS, audits=False), random_plan(SEED, EPOCHS, upserts=False, audits=False)
    upserts = [(s, was) for s, was in zip(plan, before, strict=True) if s.mode == "upsert"]
    assert len(upserts) == 4
    for s, was in upserts:
        assert (s.max_active_runs, s.writer) == (1, "light")
        assert (s.epochs, s.sensor, s.failed_hours, s.late_hours) == (
            was.epochs,
            was.sensor,
            was.failed_hours,
            was.late_hours,
        )
        compacted = _compacted(s)
        assert [r for r in s.rules if r.epoch not in compacted or r.mode != "pause"] == list(was.rules)
        names = describe_plan([s])[0]["actions"]
        assert not any(str(a).startswith("reprocess") for a in names), names
        assert ("concurrent_compaction" in names) == bool(compacted), (names, compacted)
        if compacted:  # first, so that a kill at the same point lands after the pause, not instead of it
            assert (s.rules[0].point, s.rules[0].try_number) == (COMPACTION_POINT, None)
        for k in compacted:  # a checkpointed hour after a checkpointed one: the table has a file to compact
            assert k >= 1 and k not in s.failed_hours and any(i not in s.failed_hours for i in range(k))
        assert s.description.split(": ", 1)[1].startswith("upsert, ")
    assert any(_compacted(s) for s, _ in upserts) and not all(_compacted(s) for s, _ in upserts)


def test_the_ci_random_run_holds_an_upsert_pipeline_with_a_compaction_beside_a_reprocessing_one() -> None:
    plan = random_plan(CI_SEED, CI_RANDOM_EPOCHS, per_pipeline=CI_PER_PIPELINE, audits=False)
    assert [s.mode for s in plan] == ["append", "upsert"]
    actions = [describe_plan([s])[0]["actions"] for s in plan]
    assert any(str(a).startswith("reprocess") for a in actions[0]), actions
    assert _compacted(plan[1]) and "concurrent_compaction" in actions[1], actions


def test_the_named_upsert_scenarios() -> None:
    upserts = {n: s for n, s in named_scenarios().items() if s.mode == "upsert"}
    assert set(upserts) == {"upsert_kill_commit", "upsert_failed_hour", "upsert_compaction", "upsert_kill_connect"}
    assert all(s.max_active_runs == 1 for s in upserts.values())
    assert {n: s.writer for n, s in upserts.items() if s.writer != "light"} == {"upsert_kill_connect": "connect"}
    points = {r.point for r in upserts["upsert_kill_commit"].rules}
    assert {"commit.decided", "commit.visible"} <= points
    assert _compacted(upserts["upsert_compaction"]) == [1]


def test_an_upsert_scenario_must_run_one_epoch_at_a_time() -> None:
    with pytest.raises(ValueError, match="max_active_runs=1"):
        Scenario("overlapping", mode="upsert")
    with pytest.raises(ValueError, match="append, upsert or incremental"):
        Scenario("unknown", mode="merge")
    with pytest.raises(ValueError, match="max_active_runs=1"):
        Scenario("overlapping_ranges", epochs=3, mode="incremental")
    with pytest.raises(ValueError, match="at least 3 epochs"):
        Scenario("too_short", epochs=2, mode="incremental", max_active_runs=1)
    with pytest.raises(ValueError, match="the light writer has none"):
        Scenario("paused", write_pause_s=0.5)
    with pytest.raises(ValueError, match="audited pipeline is an append"):
        Scenario("audited_upsert", mode="upsert", max_active_runs=1, audited=True)
    with pytest.raises(ValueError, match="bad hours"):
        Scenario("bad_unaudited", bad_hours=frozenset({0}))
    with pytest.raises(ValueError, match="bad hours"):
        Scenario("bad_and_failed", audited=True, bad_hours=frozenset({0}), failed_hours=frozenset({0}))
