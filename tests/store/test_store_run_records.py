"""The runs that persisted writes (``store.runs``, migration 0008): their logical date and data
interval, kept per (DAG, run id) for the views, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from alembic import command

from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.database import alembic_config, forget_applied
from airflow_provider_exactly_once.store.registry import RunDates

DAY = datetime(2024, 6, 1, tzinfo=UTC)
#: A ``dags test orders 2024-06-02`` run: its logical date is its interval's end.
TESTED = RunDates(DAY + timedelta(days=1), DAY, DAY + timedelta(days=1))
#: The scheduled run of the same day: its logical date is its interval's start.
SCHEDULED = RunDates(DAY, DAY, DAY + timedelta(days=1))


def _writes(store: SqlSinkStateStore) -> list[str]:
    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.split(None, 1)[0].upper() in {"INSERT", "UPDATE", "DELETE"}:
            seen.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", record)
    return seen


def test_a_run_is_recorded_once_and_read_back_by_dag_and_run(store: SqlSinkStateStore) -> None:
    store.runs.record("orders", "manual__2026-01-05T10:02:11+00:00", TESTED)
    store.runs.record("orders", "scheduled__2024-06-01T00:00:00+00:00", SCHEDULED)
    store.runs.record("other", "manual__2026-01-05T10:02:11+00:00", RunDates(None, None, None))

    found = store.runs.lookup(
        [
            ("orders", "manual__2026-01-05T10:02:11+00:00"),
            ("orders", "scheduled__2024-06-01T00:00:00+00:00"),
            ("other", "manual__2026-01-05T10:02:11+00:00"),
            ("orders", "never-recorded"),
            (None, "scheduled__2024-06-01T00:00:00+00:00"),
            ("orders", None),
        ]
    )
    assert found == {
        ("orders", "manual__2026-01-05T10:02:11+00:00"): TESTED,
        ("orders", "scheduled__2024-06-01T00:00:00+00:00"): SCHEDULED,
        ("other", "manual__2026-01-05T10:02:11+00:00"): RunDates(None, None, None),
    }
    assert store.runs.lookup([]) == {}


def test_recording_the_same_run_again_writes_nothing_and_a_new_run_of_that_id_replaces_it(
    store: SqlSinkStateStore,
) -> None:
    store.runs.record("orders", "manual__x", TESTED)
    writes = _writes(store)
    store.runs.record("orders", "manual__x", TESTED)  # a retried persist of the same run
    assert writes == []
    store.runs.record("orders", "manual__x", SCHEDULED)  # Airflow gave the id to another run since
    assert len(writes) == 1
    assert store.runs.lookup([("orders", "manual__x")]) == {("orders", "manual__x"): SCHEDULED}


def test_a_page_of_many_runs_is_looked_up_in_chunks(store: SqlSinkStateStore) -> None:
    for n in range(450):
        store.runs.record("orders", f"run-{n}", SCHEDULED)
    found = store.runs.lookup([("orders", f"run-{n}") for n in range(500)])
    assert len(found) == 450 and set(found.values()) == {SCHEDULED}


@pytest.mark.parametrize(
    ("dag_id", "run_id", "dates", "message"),
    [
        (None, "r", SCHEDULED, "needs the DAG id"),
        ("d" * 251, "r", SCHEDULED, "dag_id must be"),
        ("orders", "", SCHEDULED, "run_id must be"),
        ("orders", "r", RunDates(datetime(2024, 6, 1), None, None), "logical_date must be a timezone-aware"),
        ("orders", "r", RunDates(None, None, "2024-06-02"), "interval_end must be"),  # type: ignore[arg-type]
    ],
)
def test_bad_input_is_refused_naming_it(
    store: SqlSinkStateStore, dag_id: str | None, run_id: str, dates: RunDates, message: str
) -> None:
    with pytest.raises(InvalidPreCommit, match=message):
        store.runs.record(dag_id, run_id, dates)  # type: ignore[arg-type]


def test_the_migration_adds_the_table_and_its_downgrade_drops_it(fresh_url: str, engine: sa.Engine) -> None:
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0007")
    assert "dag_run_record" not in sa.inspect(engine).get_table_names()
    forget_applied()

    store = SqlSinkStateStore(fresh_url)  # upgrades to the head on first use
    try:
        store.runs.record("orders", "manual__x", TESTED)
        assert store.runs.lookup([("orders", "manual__x")]) == {("orders", "manual__x"): TESTED}
    finally:
        store.dispose()

    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0007")
    assert "dag_run_record" not in sa.inspect(engine).get_table_names()
    forget_applied()
    store = SqlSinkStateStore(fresh_url)  # and up again
    try:
        assert store.runs.lookup([("orders", "manual__x")]) == {}
    finally:
        store.dispose()
        forget_applied()
