"""Helpers to run real DAGs with ``dag.test()`` against a real meta store, catalog and Parquet files."""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_exactly_once.checkpoints.config import CheckpointConfig, MetaStoreCheckpoint
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.runtime.assembly import run_epoch
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig, SinkConfig
from tests.support.pipeline import Pipeline

TABLE = "events"


@dataclass
class World:
    """One sink: its meta store and Iceberg catalog, reached by tasks through Airflow connections."""

    pipeline: Pipeline
    meta_conn_id: str
    iceberg_conn_id: str
    sink_id: str
    tmp: Path
    writes: list[PreCommit] = field(default_factory=list)

    @classmethod
    def create(
        cls, tmp: Path, monkeypatch: pytest.MonkeyPatch, *, meta_url: str, catalog_url: str | None = None
    ) -> World:
        suffix = uuid.uuid4().hex[:8]
        meta_conn_id, iceberg_conn_id = f"eo_meta_{suffix}", f"iceberg_{suffix}"
        warehouse = tmp / "warehouse"
        warehouse.mkdir()
        catalog_url = catalog_url or f"sqlite:///{tmp / 'catalog.db'}"
        # The catalog is named after its connection: IcebergHook loads it under the connection id.
        pipeline = Pipeline(
            meta_url=meta_url,
            catalog_url=catalog_url,
            warehouse=warehouse,
            catalog_name=iceberg_conn_id,
            namespace=f"ns_{suffix}",
        )
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{meta_conn_id.upper()}", json.dumps({"conn_type": "exactly_once_meta", "host": meta_url})
        )
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{iceberg_conn_id.upper()}",
            json.dumps(
                {
                    "conn_type": "iceberg",
                    "extra": {"type": "sql", "uri": catalog_url, "warehouse": f"file://{warehouse}"},
                }
            ),
        )
        pipeline.create_table(TABLE)
        return cls(pipeline, meta_conn_id, iceberg_conn_id, f"sink-{suffix}", tmp)

    # -- configs -----------------------------------------------------------------------------------

    @property
    def table(self) -> str:
        return f"{self.pipeline.namespace}.{TABLE}"

    def iceberg_sink(self) -> IcebergSinkConfig:
        return IcebergSinkConfig(self.sink_id, (self.table,), iceberg_conn_id=self.iceberg_conn_id)

    def file_sink(self) -> FileSinkConfig:
        return FileSinkConfig(self.sink_id, str(self.tmp / "files"))

    def checkpoint(self) -> CheckpointConfig:
        return MetaStoreCheckpoint()

    def mark(self, epoch: int, status: CheckpointStatus) -> None:
        self.pipeline.store.checkpoints.set_checkpoint(self.sink_id, epoch, status)

    # -- the write task's body ----------------------------------------------------------------------

    def writer(
        self, sink: SinkConfig, *, rows: int = 5, fail_tries: tuple[int, ...] = (), compressed: bool = False
    ) -> Callable[..., Any]:
        """The python callable of a write task: real Parquet files, the run's epoch, the PreCommit.

        ``fail_tries``: tries that write their files and then fail (their files are left behind,
        as a crashed Spark job leaves them).
        """

        def write(**context: Any) -> Any:
            epoch = run_epoch(context, self.sink_id, self.meta_conn_id)
            if isinstance(sink, IcebergSinkConfig):
                pre = self.pipeline.write_iceberg(self.sink_id, epoch, [TABLE], rows)
            else:
                pre = self.pipeline.write_files(self.sink_id, epoch, Path(sink.root), rows)
            self.writes.append(pre)
            if context["ti"].try_number in fail_tries:
                raise RuntimeError(f"write try {context['ti'].try_number} fails on purpose after writing its files")
            return pre.to_compressed() if compressed else pre.model_dump(mode="json")

        return write

    # -- reading back -------------------------------------------------------------------------------

    def rows(self) -> list[tuple[int, int, str]]:
        return sorted((r["id"], r["epoch"], r["write_id"]) for r in self.pipeline.rows(TABLE))

    def markers(self) -> dict[int, list[str]]:
        return self.pipeline.marker_snapshots(TABLE, self.sink_id)

    def dispose(self) -> None:
        self.pipeline.dispose()


# -- running DAGs ------------------------------------------------------------------------------------


def register(dag: Any) -> None:
    """Write the DAG's serialized form to Airflow's DB, as the DAG processor would for a file.

    ``dag.test()`` needs the DAG serialized; a DAG built inside a test is in no DAG file.
    """
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    # ``files_parsed`` is Airflow 3.1.6's; before, every parse result counted as the whole bundle.
    since_3_1_6 = "files_parsed" in inspect.signature(update_dag_parsing_results_in_db).parameters
    with create_session() as session:
        update_dag_parsing_results_in_db(
            "dags-folder",
            None,
            [LazyDeserializedDAG.from_dag(dag)],
            {},
            None,
            set(),
            session=session,
            **({"files_parsed": set()} if since_3_1_6 else {}),
        )


def run(dag: Any, logical_date: datetime | None) -> Any:
    """One DAG run through ``dag.test()``; a second call for the same logical date reruns the interval."""
    register(dag)
    return dag.test(logical_date=logical_date)


def ti_states(dag_id: str, run_id: str) -> dict[str, tuple[str | None, int]]:
    """task id -> (state, try number) of a run's task instances."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        ).all()
        return {ti.task_id: (None if ti.state is None else str(ti.state), ti.try_number) for ti in tis}


def xcom(dag_id: str, run_id: str, task_id: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        value = session.scalar(
            select(XComModel.value).where(
                XComModel.dag_id == dag_id,
                XComModel.run_id == run_id,
                XComModel.task_id == task_id,
                XComModel.key == "return_value",
            )
        )
    return None if value is None else (json.loads(value) if isinstance(value, str) else value)


def clear_and_resume(dag: Any, run_id: str, task_ids: list[str]) -> Any:
    """Clear some task instances of a finished run (as the UI's "Clear" does) and run them again.

    ``dag.test()`` always starts a fresh run, so this is its scheduling loop for an existing run.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance, clear_task_instances
    from airflow.sdk import DagRunState, TaskInstanceState
    from airflow.sdk.definitions.dag import _run_task

    from airflow_provider_exactly_once.version_compat import AIRFLOW_V_3_2_PLUS

    if AIRFLOW_V_3_2_PLUS:
        from airflow.serialization.serialized_objects import DagSerialization
    else:  # 3.1: the same two calls on SerializedDAG
        from airflow.serialization.serialized_objects import SerializedDAG as DagSerialization
    from airflow.utils.session import create_session
    from sqlalchemy import select

    scheduler_dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id.in_(task_ids)
            )
        ).all()
        assert sorted(ti.task_id for ti in tis) == sorted(task_ids)
        clear_task_instances(list(tis), session, dag_run_state=DagRunState.RUNNING)
    with create_session() as session:
        dr = session.scalar(select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id))
        dr.dag = scheduler_dag
        while dr.state == DagRunState.RUNNING:
            session.expire_all()
            schedulable, _ = dr.update_state(session=session)
            for ti in schedulable:
                if ti.state != TaskInstanceState.UP_FOR_RESCHEDULE:
                    ti.try_number += 1
                ti.state = TaskInstanceState.SCHEDULED
            session.commit()
            scheduled = [ti for ti in dr.get_task_instances(session=session) if ti.state == TaskInstanceState.SCHEDULED]
            for ti in scheduled:
                _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
        return dr
