"""What the previous release's ``eo-sink --json`` and the UI's /api showed of each view, held as
literals: the views of this one, built from the same values, show the same bytes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

from airflow_provider_exactly_once.operations.views import (
    ActionResult,
    CheckpointView,
    EpochView,
    FailureView,
    HistoryView,
    ReservationView,
    RevisionView,
    RunCheck,
    SinkSummary,
    StaleRunView,
    TableView,
)

#: ``json.dumps`` of each view's ``to_dict()`` (``to_dict(base_url)`` where it took one) in the previous release.
SHOWN = {
    "table": (
        '{"name": "shop.orders", "files": 2, "rows": 11, "bytes": 2048, "snapshot": "123", "table_uuid": "u-1'
        '", "changes": {"inserted": 1, "updated": 2, "deleted": 0, "deletes_of_absent_keys": 0, "files_rewrit'
        'ten": 1}}'
    ),
    "failure": (
        '{"at": "2024-06-01T12:30:05.123456+00:00", "step": "write failed on try 2: boom", "dag_id": "d", "ru'
        'n_id": "r", "task_id": "g.write", "try_number": 2, "log_url": "http://af/log"}'
    ),
    "reservation": (
        '{"table": "up.t", "after_snapshot_id": 1, "to_snapshot_id": 5, "range": "(1, 5]", "position": 3, "ru'
        'n_id": "r", "reserved_at": "2024-06-01T12:30:05.123456+00:00", "read_again_by": [{"epoch": 7, "statu'
        's": "Aborted"}, {"epoch": 8, "status": "Reserved"}]}'
    ),
    "revision": (
        '{"revision": 1, "write_id": "w1", "status": "Committed", "generation": "g1", "dag_id": "d", "run_id"'
        ': "r", "try_number": 1, "rows": 5, "files": 1, "committed": {"shop.orders": "9"}, "reason": null, "c'
        'reated_at": "2024-06-01T12:30:05.123456+00:00", "updated_at": "2024-06-01T12:30:00+00:00", "logical_'
        'date": "2024-06-01T12:30:05.123456+00:00"}'
    ),
    "epoch": (
        '{"sink_id": "orders", "epoch": 1717200000000, "status": "Committed", "write_id": "w2", "dag_id": "d"'
        ', "run_id": "r", "try_number": 1, "created_at": "2024-06-01T12:30:05.123456+00:00", "updated_at": "2'
        '024-06-01T12:30:00+00:00", "age_seconds": 12.346, "commit_decided_at": "2024-06-01T12:30:00+00:00", '
        '"rows": 11, "files": 2, "bytes": 2048, "files_state": "visible", "tables": [{"name": "shop.orders", '
        '"files": 2, "rows": 11, "bytes": 2048, "snapshot": "123", "table_uuid": "u-1", "changes": {"inserted'
        '": 1, "updated": 2, "deleted": 0, "deletes_of_absent_keys": 0, "files_rewritten": 1}}], "error": nul'
        'l, "warning": "w", "consumed": "(1, 5]", "unreadable": null, "pending_cleanups": 1, "interval_start"'
        ': "2024-06-01T12:30:05.123456+00:00", "interval_end": "2024-06-01T12:30:00+00:00", "logical_date": "'
        '2024-06-01T12:30:05.123456+00:00", "written": true, "revision": 1, "replacing_write_id": null, "gene'
        'ration": "g2", "revisions": [{"revision": 1, "write_id": "w1", "status": "Committed", "generation": '
        '"g1", "dag_id": "d", "run_id": "r", "try_number": 1, "rows": 5, "files": 1, "committed": {"shop.orde'
        'rs": "9"}, "reason": null, "created_at": "2024-06-01T12:30:05.123456+00:00", "updated_at": "2024-06-'
        '01T12:30:00+00:00", "logical_date": "2024-06-01T12:30:05.123456+00:00"}], "reservation": {"table": "'
        'up.t", "after_snapshot_id": 1, "to_snapshot_id": 5, "range": "(1, 5]", "position": 3, "run_id": "r",'
        ' "reserved_at": "2024-06-01T12:30:05.123456+00:00", "read_again_by": [{"epoch": 7, "status": "Aborte'
        'd"}, {"epoch": 8, "status": "Reserved"}]}, "cause": {"at": "2024-06-01T12:30:05.123456+00:00", "step'
        '": "write failed on try 2: boom", "dag_id": "d", "run_id": "r", "task_id": "g.write", "try_number": '
        '2, "log_url": "http://af/log"}}'
    ),
    "epoch_aborted": (
        '{"sink_id": "orders", "epoch": 2, "status": "Aborted", "write_id": "w3", "dag_id": null, "run_id": n'
        'ull, "try_number": null, "created_at": "2024-06-01T12:30:05.123456+00:00", "updated_at": "2024-06-01'
        'T12:30:05.123456+00:00", "age_seconds": 0.0, "commit_decided_at": null, "rows": 0, "files": 0, "byte'
        's": 0, "files_state": null, "tables": [], "error": "e", "warning": null, "consumed": null, "unreadab'
        'le": null, "pending_cleanups": 0, "interval_start": null, "interval_end": null, "logical_date": null'
        ', "written": true, "revision": 0, "replacing_write_id": null, "generation": null, "revisions": [], "'
        'reservation": null, "cause": null}'
    ),
    "sink": (
        '{"sink_id": "orders", "kind": "iceberg", "tables": ["shop.orders"], "root": null, "registered": true'
        ', "checkpoint": "markers", "counts": {"pending": 1, "committed": 2, "aborted": 3}, "oldest_pending_c'
        'reated_at": "2024-06-01T12:30:00+00:00", "pending_cleanups": 4, "reserved": 1}'
    ),
    "history": (
        '{"at": "2024-06-01T12:30:05.123456+00:00", "event": "committed", "write_id": "w", "status": "Committ'
        'ed", "revision": 0, "actor": "task", "actor_name": "d.g.commit", "dag_id": "d", "run_id": "r", "try_'
        'number": 1, "run_type": "scheduled", "clear_number": 0, "reason": "ok", "logical_date": "2024-06-01T'
        '12:30:05.123456+00:00", "interval_start": "2024-06-01T12:30:05.123456+00:00", "interval_end": "2024-'
        '06-01T12:30:00+00:00", "step": null, "task_id": null, "log_url": null}'
    ),
    "checkpoint": (
        '{"sink_id": "orders", "epoch": 3, "status": "COMPLETED", "detail": null, "source": "snapshot_range",'
        ' "meaning": "range reserved"}'
    ),
    "action": (
        '{"action": "commit", "sink_id": "orders", "epoch": 3, "dry_run": true, "outcome": "would commit", "d'
        'etail": "write w: 1 file(s)", "files_deleted": 0, "ok": true, "report": {"a": ["x"], "b": {"c": 1}}}'
    ),
    "stale": (
        '{"sink_id": "orders", "epoch": 3, "status": "Pending", "dag_id": "d", "run_id": "manual__1", "run_st'
        'ate": "running", "last_activity": "2024-06-01T12:30:05.123456+00:00", "idle_seconds": 3600.123, "hol'
        'ds_back": "the next epoch", "interval_start": "2024-06-01T12:30:05.123456+00:00", "interval_end": "2'
        '024-06-01T12:30:00+00:00", "logical_date": null, "fail_run": {"ui": "Mark as failed", "method": "PAT'
        'CH", "url": "http://af/api/v2/dags/d/dagRuns/manual__1", "body": {"state": "failed"}}, "then": "eo-s'
        'ink abort orders 3", "advice": "sink orders epoch 3 (Pending): run manual__1 of DAG d is \'running\' i'
        "n Airflow, but no task of it is alive or did anything since 2024-06-01T12:30:05.123456+00:00; it wil"
        "l never finish by itself. Fail the run: the Airflow UI's 'Mark as failed' on the run, or PATCH http:"
        '//af/api/v2/dags/d/dagRuns/manual__1 {\\"state\\": \\"failed\\"}. Then settle the epoch, as the next epo'
        'ch: eo-sink abort orders 3"}'
    ),
    "stale_nourl": (
        '{"sink_id": "orders", "epoch": 3, "status": "Pending", "dag_id": "d", "run_id": "manual__1", "run_st'
        'ate": "running", "last_activity": "2024-06-01T12:30:05.123456+00:00", "idle_seconds": 3600.123, "hol'
        'ds_back": "the next epoch", "interval_start": "2024-06-01T12:30:05.123456+00:00", "interval_end": "2'
        '024-06-01T12:30:00+00:00", "logical_date": null, "fail_run": {"ui": "Mark as failed", "method": "PAT'
        'CH", "url": "$AIRFLOW_URL/api/v2/dags/d/dagRuns/manual__1", "body": {"state": "failed"}}, "then": "e'
        'o-sink abort orders 3", "advice": "sink orders epoch 3 (Pending): run manual__1 of DAG d is \'running'
        "' in Airflow, but no task of it is alive or did anything since 2024-06-01T12:30:05.123456+00:00; it "
        "will never finish by itself. Fail the run: the Airflow UI's 'Mark as failed' on the run, or PATCH $A"
        'IRFLOW_URL/api/v2/dags/d/dagRuns/manual__1 {\\"state\\": \\"failed\\"}. Then settle the epoch, as the ne'
        'xt epoch: eo-sink abort orders 3"}'
    ),
    "check": (
        '{"threshold_minutes": 90.0, "stale_runs": [{"sink_id": "orders", "epoch": 3, "status": "Pending", "d'
        'ag_id": "d", "run_id": "manual__1", "run_state": "running", "last_activity": "2024-06-01T12:30:05.12'
        '3456+00:00", "idle_seconds": 3600.123, "holds_back": "the next epoch", "interval_start": "2024-06-01'
        'T12:30:05.123456+00:00", "interval_end": "2024-06-01T12:30:00+00:00", "logical_date": null, "fail_ru'
        'n": {"ui": "Mark as failed", "method": "PATCH", "url": "http://af/api/v2/dags/d/dagRuns/manual__1", '
        '"body": {"state": "failed"}}, "then": "eo-sink abort orders 3", "advice": "sink orders epoch 3 (Pend'
        "ing): run manual__1 of DAG d is 'running' in Airflow, but no task of it is alive or did anything sin"
        "ce 2024-06-01T12:30:05.123456+00:00; it will never finish by itself. Fail the run: the Airflow UI's "
        '\'Mark as failed\' on the run, or PATCH http://af/api/v2/dags/d/dagRuns/manual__1 {\\"state\\": \\"failed'
        '\\"}. Then settle the epoch, as the next epoch: eo-sink abort orders 3"}], "runs_not_checked": null}'
    ),
    "check_nourl": (
        '{"threshold_minutes": 90.0, "stale_runs": [{"sink_id": "orders", "epoch": 3, "status": "Pending", "d'
        'ag_id": "d", "run_id": "manual__1", "run_state": "running", "last_activity": "2024-06-01T12:30:05.12'
        '3456+00:00", "idle_seconds": 3600.123, "holds_back": "the next epoch", "interval_start": "2024-06-01'
        'T12:30:05.123456+00:00", "interval_end": "2024-06-01T12:30:00+00:00", "logical_date": null, "fail_ru'
        'n": {"ui": "Mark as failed", "method": "PATCH", "url": "$AIRFLOW_URL/api/v2/dags/d/dagRuns/manual__1'
        '", "body": {"state": "failed"}}, "then": "eo-sink abort orders 3", "advice": "sink orders epoch 3 (P'
        "ending): run manual__1 of DAG d is 'running' in Airflow, but no task of it is alive or did anything "
        "since 2024-06-01T12:30:05.123456+00:00; it will never finish by itself. Fail the run: the Airflow UI"
        "'s 'Mark as failed' on the run, or PATCH $AIRFLOW_URL/api/v2/dags/d/dagRuns/manual__1 {\\\"state\\\": \\\""
        'failed\\"}. Then settle the epoch, as the next epoch: eo-sink abort orders 3"}], "runs_not_checked": '
        "null}"
    ),
}


def test_every_view_shows_the_bytes_the_previous_release_showed() -> None:
    T = datetime(2024, 6, 1, 12, 30, 5, 123456, tzinfo=UTC)
    T2 = datetime(2024, 6, 1, 14, 30, tzinfo=timezone(timedelta(hours=2)))
    table = TableView(
        name="shop.orders",
        files=2,
        rows=11,
        bytes=2048,
        snapshot="123",
        table_uuid="u-1",
        changes={"inserted": 1, "updated": 2, "deleted": 0, "deletes_of_absent_keys": 0, "files_rewritten": 1},
    )
    failure = FailureView(
        at=T,
        step="write failed on try 2: boom",
        dag_id="d",
        run_id="r",
        task_id="g.write",
        try_number=2,
        log_url="http://af/log",
    )
    res = ReservationView(
        table="up.t",
        after_snapshot_id=1,
        to_snapshot_id=5,
        range="(1, 5]",
        position=3,
        run_id="r",
        reserved_at=T,
        read_again_by=((7, "Aborted"), (8, "Reserved")),
    )
    rev = RevisionView(
        revision=1,
        write_id="w1",
        status="Committed",
        generation="g1",
        dag_id="d",
        run_id="r",
        try_number=1,
        rows=5,
        files=1,
        committed={"shop.orders": "9"},
        reason=None,
        created_at=T,
        updated_at=T2,
        logical_date=T,
    )
    ev = EpochView(
        sink_id="orders",
        epoch=1717200000000,
        status="Committed",
        write_id="w2",
        dag_id="d",
        run_id="r",
        try_number=1,
        created_at=T,
        updated_at=T2,
        age_seconds=12.34567,
        commit_decided_at=T2,
        rows=11,
        files=2,
        bytes=2048,
        tables=(table,),
        error=None,
        warning="w",
        pending_cleanups=1,
        interval_start=T,
        interval_end=T2,
        logical_date=T,
        revision=1,
        replacing_write_id=None,
        generation="g2",
        revisions=(rev,),
        consumed="(1, 5]",
        unreadable=None,
        reservation=res,
        cause=failure,
    )
    ev2 = EpochView(
        sink_id="orders",
        epoch=2,
        status="Aborted",
        write_id="w3",
        dag_id=None,
        run_id=None,
        try_number=None,
        created_at=T,
        updated_at=T,
        age_seconds=0.0,
        commit_decided_at=None,
        rows=0,
        files=0,
        bytes=0,
        tables=(),
        error="e",
    )
    summ = SinkSummary(
        sink_id="orders",
        kind="iceberg",
        tables=("shop.orders",),
        root=None,
        registered=True,
        checkpoint="markers",
        pending=1,
        committed=2,
        aborted=3,
        oldest_pending_created_at=T2,
        pending_cleanups=4,
        reserved=1,
    )
    hist = HistoryView(
        at=T,
        event="committed",
        write_id="w",
        status="Committed",
        revision=0,
        actor="task",
        actor_name="d.g.commit",
        dag_id="d",
        run_id="r",
        try_number=1,
        run_type="scheduled",
        clear_number=0,
        reason="ok",
        logical_date=T,
        interval_start=T,
        interval_end=T2,
        step=None,
        task_id=None,
        log_url=None,
    )
    chk = CheckpointView(sink_id="orders", epoch=3, status="COMPLETED", detail=None, source="snapshot_range")
    act = ActionResult(
        action="commit",
        sink_id="orders",
        epoch=3,
        dry_run=True,
        outcome="would commit",
        detail="write w: 1 file(s)",
        files_deleted=0,
        ok=True,
        report={"a": ["x"], "b": {"c": 1}},
    )
    stale = StaleRunView(
        sink_id="orders",
        epoch=3,
        status="Pending",
        dag_id="d",
        run_id="manual__1",
        run_state="running",
        last_activity=T,
        idle_seconds=3600.12345,
        holds_back="the next epoch",
        then="eo-sink abort orders 3",
        interval_start=T,
        interval_end=T2,
        logical_date=None,
    )
    check = RunCheck(threshold=timedelta(minutes=90), stale=(stale,), not_checked=None)
    out = {
        "table": table.model_dump(mode="json"),
        "failure": failure.model_dump(mode="json"),
        "reservation": res.model_dump(mode="json"),
        "revision": rev.model_dump(mode="json"),
        "epoch": ev.model_dump(mode="json"),
        "epoch_aborted": ev2.model_dump(mode="json"),
        "sink": summ.model_dump(mode="json"),
        "history": hist.model_dump(mode="json"),
        "checkpoint": chk.model_dump(mode="json"),
        "action": act.model_dump(mode="json"),
        "stale": stale.model_dump(mode="json", context={"base_url": "http://af"}),
        "stale_nourl": stale.model_dump(mode="json"),
        "check": check.model_dump(mode="json", context={"base_url": "http://af"}),
        "check_nourl": check.model_dump(mode="json"),
    }
    for name, shown in SHOWN.items():
        assert json.dumps(out[name]) == shown, name
