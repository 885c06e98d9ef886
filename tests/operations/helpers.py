"""Building sinks and epochs for the operations and CLI suites, and reading their whole state back."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, update

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint, SnapshotRangeCheckpoint
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import Actor, ActorKind, acting
from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.runtime.run_epochs import reserved_range
from airflow_provider_exactly_once.sinks.config import SinkConfig
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.models import InputRange, PendingSinkState
from tests.support.airflow_world import TABLE, World
from tests.support.pipeline import write_location_exists


def ops_world(tmp: Path, monkeypatch: pytest.MonkeyPatch, meta_url: str) -> World:
    world = World.create(tmp, monkeypatch, meta_url=meta_url)
    register(world, world.iceberg_sink())
    return world


def register(world: World, sink: SinkConfig) -> None:
    """As the epoch operators register a sink on first use."""
    world.pipeline.store.registry.register_sink(
        sink.sink_id, sink.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json")
    )


def dead_catalog(monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    """A connection to a PostgreSQL catalog on a port nothing listens on, its password planted."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conn_id = f"iceberg_down_{uuid.uuid4().hex[:8]}"
    uri = f"postgresql+psycopg2://eo:Planted-pw@127.0.0.1:{port}/catalog"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "iceberg", "extra": {"type": "sql", "uri": uri}})
    )
    return conn_id, port


def coordinator(world: World) -> TwoPhaseCommitCoordinator:
    """A coordinator of the world's Iceberg sink, to drive epochs into the states a test needs."""
    return world.pipeline.coordinator(world.sink_id, world.pipeline.iceberg_committer())


def write(world: World, epoch: int, rows: int = 5) -> PreCommit:
    return world.pipeline.write_iceberg(world.sink_id, epoch, [TABLE], rows)


@dataclass(frozen=True)
class State:
    """Everything an action could change: rows, open clean-ups, snapshots, and which writes' files exist."""

    rows: dict[int, tuple[str, str, Any, Any]]
    cleanups: list[tuple[int, str]]
    snapshots: list[int]
    files: dict[str, bool]


def state(world: World, sink_id: str, epochs: list[int], writes: list[PreCommit]) -> State:
    store = world.pipeline.store
    rows = {}
    for epoch in epochs:
        row = store.get(sink_id, epoch)
        if row is not None:
            rows[epoch] = (row.status.value, row.write_id, row.commit_decided_at, row.updated_at)
    table = world.pipeline.catalog.load_table(world.table)
    return State(
        rows=rows,
        cleanups=sorted((t.id, t.write_id) for t in store.cleanups(sink_id)),
        snapshots=sorted(s.snapshot_id for s in table.snapshots()),
        files={w.write_id: write_location_exists(w) for w in writes},
    )


# -- incremental epochs and failed tasks ----------------------------------------------------------------

UPSTREAM = "bronze.orders"
#: The DAG of the incremental pipeline the epochs below are written by.
SILVER_DAG = "silver_orders"


def task_actor(task_id: str, run_id: str, try_number: int = 1, dag_id: str = SILVER_DAG) -> Actor:
    """A task of the epoch group, as it names itself in the epoch's history (``core.epochs``)."""
    return Actor(ActorKind.TASK, name=f"{dag_id}.{task_id}", dag_id=dag_id, run_id=run_id, try_number=try_number)


def fail(
    world: World, epoch: int, task_id: str, run_id: str, reason: str, *, try_number: int = 1, final: bool = True
) -> None:
    """What the epoch group's failure callback keeps of a failed try (design.md D22)."""
    with acting(task_actor(task_id, run_id, try_number)):
        assert world.pipeline.store.history.record_failure(world.sink_id, epoch, reason, final=final)


def incremental(world: World) -> None:
    """The world's sink registered as an incremental input's, its checkpoint the reserved range."""
    register_checkpoint(world, world.iceberg_sink(), SnapshotRangeCheckpoint())


def register_checkpoint(world: World, sink: SinkConfig, checkpoint: MetaStoreCheckpoint) -> None:
    world.pipeline.store.registry.register_sink(
        sink.sink_id, sink.model_dump(mode="json"), checkpoint.model_dump(mode="json")
    )


def reserve(world: World, epoch: int, upstream_at: int, run_id: str) -> SnapshotRange:
    """The range the write operator reserves for the epoch (``runtime.run_epochs``)."""
    return reserved_range(world.pipeline.store, world.sink_id, epoch, UPSTREAM, lambda: upstream_at, run_id=run_id)


def persist_range(world: World, epoch: int, reserved: SnapshotRange, run_id: str) -> PreCommit:
    """A write of the epoch's range persisted by its run's persist task."""
    written = write(world, epoch)
    pre = PreCommit.model_validate({**written.model_dump(), "source_positions": reserved.positions(records=5)})
    with acting(task_actor("persist", run_id)):
        coordinator(world).persist(pre, run_id=run_id, try_number=1, dag_id=SILVER_DAG)
    return pre


def age_rows(store: SqlSinkStateStore, sink_id: str, epoch: int, by: timedelta) -> None:
    """Move the epoch's row and reservation back in time, as if written ``by`` ago."""
    moved = {PendingSinkState: ("created_at", "updated_at"), InputRange: ("reserved_at",)}
    with store.engine.begin() as connection:
        for model, columns in moved.items():
            key = (model.sink_id == sink_id, model.epoch == epoch)
            for column in columns:
                for (at,) in connection.execute(select(getattr(model, column)).where(*key)).all():
                    connection.execute(update(model).where(*key).values({column: at - by}))


# -- runs in Airflow's metadata database ----------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """A task instance of a run: its state and when it last did anything (its start, its heartbeat
    when running, its update)."""

    task_id: str
    state: str | None
    at: datetime


def airflow_run(dag_id: str, run_id: str, state: str, tasks: Sequence[Task]) -> None:
    """A DAG run and its task instances in Airflow's metadata database, made through its ORM as the
    scheduler leaves them (a killed ``dags test``: the run ``running``, a task ``running`` whose
    heartbeat stopped). Needs the ``airflow_home`` fixture (the database created)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    first = min((t.at for t in tasks), default=datetime.now(UTC))
    with create_session() as session:
        run = DagRun(dag_id=dag_id, run_id=run_id, run_type="manual", state=state, run_after=first, start_date=first)
        session.add(run)
        session.flush()
        for task in tasks:
            session.execute(
                insert(TaskInstance).values(
                    task_id=task.task_id,
                    dag_id=dag_id,
                    run_id=run_id,
                    map_index=-1,
                    try_number=1,
                    state=task.state,
                    pool="default_pool",
                    start_date=task.at,
                    last_heartbeat_at=task.at if task.state == "running" else None,
                    updated_at=task.at,
                )
            )
