"""Crash leftovers on real sinks, and reading a recovery DAG run back."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig, SinkConfig
from tests.support.airflow_world import TABLE, World
from tests.support.pipeline import local_path

BASE = 1_700_000_000_000
HOUR_MS = 3_600_000
E0, E1, E2, E3, E4, E5 = (BASE + n * HOUR_MS for n in range(6))


def age_files(pre: PreCommit, hours: float) -> None:
    """Backdate every file of the write (what a write location looks like hours after a crash)."""
    stamp = time.time() - hours * 3600
    for table in pre.tables:
        for root, _, files in os.walk(local_path(table.location)):
            for name in files:
                os.utime(os.path.join(root, name), (stamp, stamp))


def exists(pre: PreCommit) -> bool:
    return all(Path(local_path(t.location)).exists() for t in pre.tables)


@dataclass
class Leftovers:
    """What a crash left on one sink: the writes by role."""

    sink: SinkConfig
    committed: PreCommit  # E0, committed before the crash
    pending_completed: PreCommit  # E1, Pending, checkpoint COMPLETED
    pending_failed: PreCommit  # E2, Pending, checkpoint FAILED
    aborted_with_files: PreCommit  # E3, Aborted, its clean-up never ran
    old_orphan: PreCommit  # E4, written 7 hours ago, never persisted
    young_orphan: PreCommit  # E5, written just now, never persisted (a write still in flight)


def leave_crash(world: World, sink: SinkConfig) -> Leftovers:
    """Drive a real coordinator up to the crash points, then register the sink as the operators do."""
    pipeline = world.pipeline
    if isinstance(sink, IcebergSinkConfig):
        committer: Any = pipeline.iceberg_committer()

        def write(epoch: int) -> PreCommit:
            return pipeline.write_iceberg(sink.sink_id, epoch, [TABLE])
    else:
        assert isinstance(sink, FileSinkConfig)
        committer = pipeline.file_committer(Path(sink.root))

        def write(epoch: int) -> PreCommit:
            return pipeline.write_files(sink.sink_id, epoch, Path(sink.root))

    coordinator = pipeline.coordinator(sink.sink_id, committer)
    store = pipeline.store
    writes = [write(e) for e in (E0, E1, E2, E3, E4, E5)]
    w0, w1, w2, w3, w4, w5 = writes
    for pre in (w0, w1, w2, w3):
        coordinator.persist(pre)
    for pre in writes[:5]:
        age_files(pre, 7)  # known writes are never orphans, however old (persist adds a manifest)
    pipeline.checkpoint(sink.sink_id, E0, CheckpointStatus.COMPLETED)
    coordinator.commit(sink.sink_id, E0)
    pipeline.checkpoint(sink.sink_id, E1, CheckpointStatus.COMPLETED)
    pipeline.checkpoint(sink.sink_id, E2, CheckpointStatus.FAILED)
    store.mark_aborted(sink.sink_id, E3, write_id=w3.write_id, reason="crash before the clean-up ran")
    store.registry.register_sink(
        sink.sink_id, sink.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json")
    )
    return Leftovers(sink, w0, w1, w2, w3, w4, w5)


def mapped_tis(dag_id: str, run_id: str, task_id: str) -> dict[str, tuple[str | None, int]]:
    """rendered map index (the sink id) -> (state, map index) of a mapped task's instances."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id
            )
        ).all()
        return {str(ti.rendered_map_index): (None if ti.state is None else str(ti.state), ti.map_index) for ti in tis}


def mapped_xcom(dag_id: str, run_id: str, task_id: str, map_index: int) -> Any:
    import json

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        value = session.scalar(
            select(XComModel.value).where(
                XComModel.dag_id == dag_id,
                XComModel.run_id == run_id,
                XComModel.task_id == task_id,
                XComModel.map_index == map_index,
                XComModel.key == "return_value",
            )
        )
    return None if value is None else (json.loads(value) if isinstance(value, str) else value)


GRACE = timedelta(hours=6)
