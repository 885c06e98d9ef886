"""The random plan on each stack: a seed's local plan stays what it was, and the production stack
adds one platform fault per pipeline from its own generator (no cluster needed)."""

from __future__ import annotations

from collections import Counter

from fault_harness.cluster import ICEBERG_CONN_ID
from fault_harness.plans import describe_plan
from fault_harness.scenarios import AUDIT_POINTS, random_plan
from fault_harness.stacks import PROXIED_ICEBERG_CONN_ID

SEED, EPOCHS = 1783964432, 200


def _without_platform(plan: list[dict[str, object]]) -> list[dict[str, object]]:
    platform = {"kill_worker_of", "kill_catalog", "drop_commit_response"}
    return [
        {
            **p,
            "description": str(p["description"]).split(", platform fault")[0],
            "actions": [a for a in p["actions"] if a not in platform],  # type: ignore[attr-defined]
        }
        for p in plan
    ]


def test_the_production_plan_is_the_local_plan_plus_platform_faults() -> None:
    local = random_plan(SEED, EPOCHS)
    production = random_plan(SEED, EPOCHS, stack="production")
    assert describe_plan(local) == describe_plan(random_plan(SEED, EPOCHS, stack="local"))
    assert _without_platform(describe_plan(production)) == describe_plan(local)
    assert all(s.conn_id == ICEBERG_CONN_ID for s in local)


def test_every_platform_fault_is_drawn_and_only_a_dropped_response_goes_through_the_proxy() -> None:
    production = random_plan(SEED, EPOCHS, stack="production")
    kinds = Counter(s.description.rsplit("platform fault ", 1)[1].split(" ")[0] for s in production)
    assert set(kinds) == {"celery_worker", "catalog", "drop_response", "none"}, kinds
    for s in production:
        proxied = s.conn_id == PROXIED_ICEBERG_CONN_ID
        assert proxied == s.description.endswith("platform fault drop_response"), s.description
        assert not proxied or len(s.failed_hours) < s.epochs  # a commit must happen for its response to be lost


def test_some_append_pipelines_are_audited_and_every_other_draw_stays_as_it_was() -> None:
    plan = random_plan(SEED, EPOCHS)
    before = random_plan(SEED, EPOCHS, audits=False)
    audited = [s for s in plan if s.audited]
    assert 0 < len(audited) < len(plan) and not any(s.audited for s in before)
    assert all(s.mode == "append" for s in audited)
    assert any(s.bad_hours for s in audited)
    for s, was in zip(plan, before, strict=True):
        if not s.audited:
            assert describe_plan([s]) == describe_plan([was])
            continue
        assert (s.failed_hours, s.late_hours, s.sensor) == (was.failed_hours, was.late_hours, was.sensor)
        assert not s.bad_hours & s.failed_hours  # a bad hour is checkpointed: its audit runs and fails
        added = [r for r in s.rules if r not in was.rules]
        checkpointed = [i for i in range(s.epochs) if i not in s.failed_hours]
        assert sorted(r.epoch for r in added) == checkpointed  # one step of write, audit, publish each
        assert all(r.point in AUDIT_POINTS for r in added)
        assert all(r.point == "audit.committed" for r in added if r.epoch in s.bad_hours)
        assert "events.commit" not in s.description  # its commit is its publish
