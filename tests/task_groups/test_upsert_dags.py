"""An upsert sink's task group says, when the DAG is parsed, that its epochs must run one at a time."""

from __future__ import annotations

import datetime as dt
import warnings

import pytest
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from airflow_provider_exactly_once.checkpoints.config import MarkerFileCheckpoint
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from airflow_provider_exactly_once.task_groups import exactly_once_epoch

UPSERT = IcebergSinkConfig("cdc", ("ns.accounts",), mode="upsert", key=("id",))
APPEND = IcebergSinkConfig("events", ("ns.events",))


def build(sink: IcebergSinkConfig, **dag_kwargs: object) -> None:
    with DAG(f"d_{sink.sink_id}", schedule=None, start_date=dt.datetime(2024, 1, 1), **dag_kwargs):  # type: ignore[arg-type]
        write = PythonOperator(task_id="write", python_callable=lambda: None)
        exactly_once_epoch(write, sink=sink, checkpoint=MarkerFileCheckpoint(path_template="/x/{epoch}"))


def test_an_upsert_dag_running_several_epochs_at_once_is_warned_about() -> None:
    with pytest.warns(UserWarning, match=r"sink 'cdc' is an upsert sink.*runs up to 3 epochs.*max_active_runs=1"):
        build(UPSERT, max_active_runs=3)


@pytest.mark.parametrize(("sink", "runs"), [(UPSERT, 1), (APPEND, 3)])
def test_one_epoch_at_a_time_or_an_append_sink_is_not(sink: IcebergSinkConfig, runs: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        build(sink, max_active_runs=runs)
