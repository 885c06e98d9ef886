"""``dag_id`` on each epoch row (migration 0003): written by persist and by the abort of an unpersisted
write, kept across a replacing write's run, absent on rows from before the migration, and recorded
by the epoch operators of a real DAG run."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus, epoch_from_interval_start
from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.operations import SinkOperations
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.database import HEAD_REVISION, alembic_config, current_revision, forget_applied
from tests.operations.helpers import coordinator, write
from tests.recovery.helpers import E1, E2
from tests.support.airflow_world import World, run


def test_persist_replace_and_tombstone_record_the_dag(world: World) -> None:
    coord = coordinator(world)
    store = world.pipeline.store
    first, second = write(world, E1), write(world, E1)
    coord.persist(first, run_id="run-a", dag_id="dag_a")
    assert store.get(world.sink_id, E1).dag_id == "dag_a"  # type: ignore[union-attr]
    coord.persist(second, run_id="run-b", dag_id="dag_b")  # a clear of the run, or a rerun from another DAG
    row = store.get(world.sink_id, E1)
    assert row is not None and (row.write_id, row.run_id, row.dag_id) == (second.write_id, "run-b", "dag_b")

    never_persisted = write(world, E2)
    result = coord.abort(world.sink_id, E2, reason="write failed", write=never_persisted, dag_id="dag_c")
    assert result.record is not None and result.record.status is EpochStatus.ABORTED
    assert store.get(world.sink_id, E2).dag_id == "dag_c"  # type: ignore[union-attr]

    coord.persist(write(world, E2 + 1))  # outside Airflow: no DAG
    assert store.get(world.sink_id, E2 + 1).dag_id is None  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", ["", "x" * 251, 5])
def test_a_bad_dag_id_is_refused_by_name(world: World, bad: object) -> None:
    with pytest.raises(InvalidPreCommit, match="dag_id must be None or a non-empty string"):
        world.pipeline.store.insert_pending(write(world, E1), run_id=None, try_number=None, dag_id=bad)  # type: ignore[arg-type]
    assert world.pipeline.store.get(world.sink_id, E1) is None


@pytest.mark.parametrize("backend", ["sqlite"])
def test_rows_from_before_migration_0003_keep_everything_and_have_no_dag(tmp_path: Path, backend: str) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    pre = PreCommit(
        sink_id="old-sink",
        epoch=7,
        write_id=str(uuid.uuid4()),
        tables=[TableWrite(table="ns.events", location=f"{tmp_path}/w")],
    )
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0002")
        connection.execute(
            sa.text(
                "INSERT INTO pending_sink_state (sink_id, epoch, status, write_id, metadata, run_id, created_at, "
                "updated_at) VALUES ('old-sink', 7, 'Pending', :w, :m, 'run-7', '2025-01-01 00:00:00.000', "
                "'2025-01-01 00:00:00.000')"
            ),
            {"w": pre.write_id, "m": pre.to_json()},
        )
    engine.dispose()
    forget_applied()
    store = SqlSinkStateStore(url)  # upgrades to the head on first use
    try:
        with store.engine.connect() as connection:
            assert current_revision(connection) == HEAD_REVISION
        row = store.get("old-sink", 7)
        assert row is not None and (row.write_id, row.run_id, row.dag_id) == (pre.write_id, "run-7", None)
        assert [v.epoch for v in SinkOperations(store).epochs(sink_id="old-sink", status="Pending")] == [7]
    finally:
        store.dispose()


@pytest.fixture
def dag_world(airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    w = World.create(tmp_path, monkeypatch, meta_url=f"sqlite:///{tmp_path / 'meta.db'}")
    yield w
    w.dispose()


def test_the_epoch_operators_of_a_dag_run_record_its_dag(dag_world: World) -> None:
    from tests.task_groups.test_epoch_dags import epoch_dag

    world = dag_world
    day = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
    epoch = epoch_from_interval_start(day)
    world.mark(epoch, CheckpointStatus.COMPLETED)
    dag = epoch_dag(world, world.iceberg_sink())

    dr = run(dag, day)

    assert dr.state == "success"
    view = SinkOperations(world.pipeline.store).epoch(world.sink_id, epoch)
    assert (view.status, view.dag_id, view.run_id) == ("Committed", dag.dag_id, dr.run_id)
