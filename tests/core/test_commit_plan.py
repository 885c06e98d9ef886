"""CommitPlan: a commit as a value, unprepared or prepared, and what a committer may take from it."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.core.ports import CommitPlan, ReplacedWrite
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite

SINK, EPOCH = "orders", 1_717_200_000_000
AT = datetime(2024, 6, 1, tzinfo=UTC)


def write(*tables: str, epoch: int = EPOCH) -> PreCommit:
    write_id = str(uuid.uuid4())
    return PreCommit(
        sink_id=SINK,
        epoch=epoch,
        write_id=write_id,
        tables=[TableWrite(table=t, location=f"/lake/{t}/_eo/{write_id}") for t in tables or ("db.t",)],
    )


def replaced(pre: PreCommit) -> ReplacedWrite:
    return ReplacedWrite(pre.write_id, pre, {"db.t": "1"}, None, 0, AT)


def test_an_unprepared_plan_is_a_plan_with_nothing_to_reuse() -> None:
    pre = write()
    plan = CommitPlan(pre)
    assert plan.replaces is None and plan.prepared == {} and plan.prepared_at is None
    assert plan.fresh_state(object(), 60) == {}
    revision = CommitPlan(pre, replaced(write()))
    assert revision.replaces is not None and revision.prepared == {}


def test_prepared_state_goes_only_to_its_own_committer_and_only_while_fresh() -> None:
    pre, mine, other = write("db.a", "db.b"), object(), object()
    plan = CommitPlan(pre, None, {"db.a": "state a"}, prepared_at=time.monotonic(), prepared_by=mine)
    assert plan.fresh_state(mine, 60) == {"db.a": "state a"}
    assert plan.fresh_state(other, 60) == {}
    assert plan.fresh_state(mine, -1) == {}
    stale = dataclasses.replace(plan, prepared_at=time.monotonic() - 61)
    assert stale.fresh_state(mine, 60) == {}


def test_the_prepared_state_cannot_be_changed_afterwards() -> None:
    source = {"db.t": "state"}
    plan = CommitPlan(write(), None, source, prepared_at=time.monotonic(), prepared_by=object())
    source["db.t"] = "changed"
    assert plan.prepared == {"db.t": "state"}
    with pytest.raises(TypeError):
        plan.prepared["db.t"] = "changed"  # type: ignore[index]


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda pre: CommitPlan(pre, replaced(pre)), "only replace another write of the same epoch"),
        (lambda pre: CommitPlan(pre, replaced(write(epoch=EPOCH + 1))), "only replace another write of the same epoch"),
        (lambda pre: CommitPlan(pre, None, {"db.t": 1}), "needs prepared_at and prepared_by"),
        (lambda pre: CommitPlan(pre, None, {"db.t": 1}, prepared_at=1.0), "needs prepared_at and prepared_by"),
        (
            lambda pre: CommitPlan(pre, None, {"db.other": 1}, prepared_at=1.0, prepared_by=object()),
            r"other tables \['db.other'\]",
        ),
    ],
)
def test_a_plan_that_cannot_belong_to_its_write_is_refused(
    build: Callable[[PreCommit], CommitPlan], match: str
) -> None:
    with pytest.raises(InvalidPreCommit, match=match):
        build(write())
