"""The private parts of Airflow and its Spark provider that ``upstream_private`` reaches into, each
asserted as the installed upstream has it: an upgrade that renames or reshapes one fails here,
naming it, rather than in a task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextvars import ContextVar

import pytest

from airflow_provider_exactly_once.upstream_private import executor_safeguard_tracker, spark_binary_of


def test_the_sdk_guards_execute_with_a_context_variable_on_executor_safeguard() -> None:
    from airflow.sdk.bases.operator import ExecutorSafeguard

    assert isinstance(ExecutorSafeguard.tracker, ContextVar)
    assert executor_safeguard_tracker() is ExecutorSafeguard.tracker


def test_the_spark_submit_hook_keeps_the_resolved_binary_in_its_connection_dict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    conn = {"conn_type": "spark", "host": "local", "extra": {"spark-binary": "spark3-submit"}}
    monkeypatch.setenv("AIRFLOW_CONN_EO_FENCE_SPARK", json.dumps(conn))
    submit = SparkSubmitOperator(task_id="write", application="job.py", conn_id="eo_fence_spark")
    assert submit._get_hook()._connection["spark_binary"] == "spark3-submit"
    assert spark_binary_of(submit) == "spark3-submit"


def test_airflow_imports_its_models_from_a_mapper_listener_that_can_be_set_aside() -> None:
    """Airflow's ORM set-up listens for the first mapper configuration with ``import_all_models``;
    the set-aside removes exactly that listener and puts it back (in a fresh process: the
    listener is process-wide)."""
    code = """
from sqlalchemy import create_engine, event
from sqlalchemy.orm import Mapper
from airflow.models import import_all_models
from airflow.utils.orm_event_handlers import setup_event_handlers
from airflow_provider_exactly_once.upstream_private import airflow_model_import_set_aside

if not event.contains(Mapper, "before_configured", import_all_models):
    setup_event_handlers(create_engine("sqlite://"))
assert event.contains(Mapper, "before_configured", import_all_models), "the listener is not import_all_models"
with airflow_model_import_set_aside():
    assert not event.contains(Mapper, "before_configured", import_all_models), "not set aside"
assert event.contains(Mapper, "before_configured", import_all_models), "not put back"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_outside_a_task_the_sdk_reads_airflows_database_only_in_a_server_process() -> None:
    """The Task SDK chooses its secrets chain by ``_AIRFLOW_PROCESS_CONTEXT``: without it, outside a
    task, no metastore backend (a connection made in the UI is not found); inside
    ``as_airflow_server_process``, the metastore backend is searched."""
    from airflow.sdk.execution_time.supervisor import ensure_secrets_backend_loaded

    from airflow_provider_exactly_once.upstream_private import AIRFLOW_PROCESS_CONTEXT, as_airflow_server_process

    def chain() -> list[str]:
        return [type(backend).__name__ for backend in ensure_secrets_backend_loaded()]

    assert AIRFLOW_PROCESS_CONTEXT == "_AIRFLOW_PROCESS_CONTEXT"
    if "_AIRFLOW_PROCESS_CONTEXT" not in os.environ:
        assert "MetastoreBackend" not in chain()
    with as_airflow_server_process():
        assert "MetastoreBackend" in chain()
