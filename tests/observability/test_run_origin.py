"""What a commit says of its run (``observability.run_origin``), from the fields the Task SDK's run
context carries (``DagRun.run_type``, ``clear_number``, ``triggering_user_name``, the try), read
from Airflow's own runtime model so that a renamed field fails here rather than in a downstream DAG."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

from airflow.sdk.api.datamodels._generated import DagRun, DagRunState, DagRunType

from airflow_provider_exactly_once.observability.run_origin import COMMIT_TASK, RECOVERY, RunOrigin

NOW = dt.datetime(2026, 12, 3, tzinfo=dt.UTC)


def dag_run(run_type: DagRunType, clear_number: int, user: str | None) -> DagRun:
    return DagRun(
        dag_id="d",
        run_id="r",
        logical_date=NOW,
        data_interval_start=NOW,
        data_interval_end=NOW,
        run_after=NOW,
        start_date=NOW,
        end_date=None,
        clear_number=clear_number,
        run_type=run_type,
        state=DagRunState.RUNNING,
        triggering_user_name=user,
        consumed_asset_events=[],
        partition_key=None,
    )


def test_a_backfill_cleared_twice_by_a_user_says_so() -> None:
    context = {"dag_run": dag_run(DagRunType.BACKFILL, 2, "alice"), "ti": SimpleNamespace(try_number=3)}
    assert RunOrigin.of(context).model_dump(mode="json") == {
        "committed_by": COMMIT_TASK,
        "run_type": "backfill",
        "clear_number": 2,
        "triggering_user": "alice",
        "try_number": 3,
    }


def test_a_scheduled_run_never_cleared() -> None:
    origin = RunOrigin.of({"dag_run": dag_run(DagRunType.SCHEDULED, 0, None), "ti": SimpleNamespace(try_number=1)})
    assert (origin.run_type, origin.clear_number, origin.triggering_user) == ("scheduled", 0, None)


def test_recovery_names_itself_and_no_run_of_its_own() -> None:
    context = {"dag_run": dag_run(DagRunType.SCHEDULED, 1, "bob"), "ti": SimpleNamespace(try_number=2)}
    assert RunOrigin.of(context, committed_by=RECOVERY) == RunOrigin(committed_by=RECOVERY)
