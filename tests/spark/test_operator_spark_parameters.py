"""``SparkPreCommitOperator`` takes ``SparkSubmitOperator``'s parameters and runs that operator in its task.

It does not subclass it (importing the Spark provider's operator costs every DAG parse about 0.4 s),
so these check what subclassing gave for free: the same parameters and templates as the
installed provider, ``default_args`` reaching them, the rendered values handed over, and the kill.
"""

from __future__ import annotations

import datetime as dt
import inspect
import logging
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.operators._common import execute_nested
from airflow_provider_exactly_once.operators.spark_precommit import (
    SPARK_SUBMIT_OTHER_PARAMETERS,
    SPARK_SUBMIT_TEMPLATE_FIELDS,
    SparkPreCommitOperator,
)
from airflow_provider_exactly_once.sinks.config import FileSinkConfig
from airflow_provider_exactly_once.version_compat import spark_submit_has_durable

FILES = {"sink": FileSinkConfig(sink_id="s", root="/x"), "input": {"kind": "sql", "query": "select 1"}}


def test_the_installed_providers_parameters_and_templates_are_all_taken() -> None:
    """A parameter or template the installed Spark provider adds must be added here, or it is lost."""
    ours = {*SPARK_SUBMIT_TEMPLATE_FIELDS, *SPARK_SUBMIT_OTHER_PARAMETERS}
    theirs = set(inspect.signature(SparkSubmitOperator.__init__).parameters) - {"self", "kwargs"}
    assert theirs - ours == {"application_args", "durable"}  # the job spec, and this operator's own durable
    assert set(SparkSubmitOperator.template_fields) - set(SPARK_SUBMIT_TEMPLATE_FIELDS) == {"application_args"}
    assert set(SparkPreCommitOperator.template_fields) >= set(SPARK_SUBMIT_TEMPLATE_FIELDS)


def test_parameters_and_default_args_reach_the_spark_submit_operator(tmp_path: Path) -> None:
    with DAG(
        "d",
        schedule=None,
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        default_args={"conn_id": "spark_from_defaults", "executor_memory": "2g", "driver_memory": "1g"},
    ):
        op = SparkPreCommitOperator(
            task_id="w",
            driver_memory="3g",  # given beats default_args, as for the provider's operator
            conf={"spark.app.tag": "{{ ds }}"},
            total_executor_cores=2,
            **FILES,  # type: ignore[arg-type]
        )
    assert op.conn_id == "spark_from_defaults"
    assert op.spark_submit_kwargs == {"executor_memory": "2g", "driver_memory": "3g", "total_executor_cores": 2}
    op.render_template_fields({"ds": "2024-01-02"})  # type: ignore[arg-type]

    submit = op._spark_submit(tmp_path / "job.json")

    assert isinstance(submit, SparkSubmitOperator) and submit.task_id == "w"
    assert submit.conf == {"spark.app.tag": "2024-01-02"}  # rendered in this task, handed over rendered
    assert submit.application == op.application and submit.application_args == [str(tmp_path / "job.json")]
    assert submit.name == "exactly-once-s"
    hook = submit._get_hook()
    assert hook._conn_id == "spark_from_defaults" and hook._executor_memory == "2g"
    assert hook._driver_memory == "3g" and hook._total_executor_cores == 2
    if spark_submit_has_durable():
        assert submit.durable is False  # a retry is a new write, never a re-attach to the old driver


def test_application_args_and_unknown_parameters_are_refused_when_the_dag_is_parsed() -> None:
    with pytest.raises(InvalidSinkConfig, match="application_args is the epoch writer's job spec"):
        SparkPreCommitOperator(task_id="w", application_args=["x"], **FILES)  # type: ignore[arg-type]
    with pytest.raises(Exception, match="executor_memry"):  # Airflow's own refusal of an unknown argument
        SparkPreCommitOperator(task_id="w", executor_memry="1g", **FILES)  # type: ignore[arg-type]


def test_a_killed_task_kills_its_spark_submit(tmp_path: Path) -> None:
    op = SparkPreCommitOperator(task_id="w", **FILES)  # type: ignore[arg-type]
    op.on_kill()  # before the submit: nothing to kill, no error
    killed: list[str] = []

    class Submit:
        def on_kill(self) -> None:
            killed.append("spark-submit")

    op._submit = Submit()  # type: ignore[assignment]
    op.on_kill()
    assert killed == ["spark-submit"]


def test_an_operator_run_inside_a_task_logs_no_outside_the_task_runner_warning(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Airflow's guard warns when an operator's execute is called outside its task runner; calling it
    plainly shows the guard is on, and ``execute_nested`` does not trip it."""
    from airflow.providers.standard.operators.python import PythonOperator

    inner = PythonOperator(task_id="inner", python_callable=lambda: "done")
    context: Any = {"ti": None, "params": {}}
    warning = "cannot be called outside of the Task Runner"

    def logged() -> str:  # the SDK logs through structlog to the console, or through logging
        captured = capsys.readouterr()
        text = captured.out + captured.err + caplog.text
        caplog.clear()
        return text

    with caplog.at_level(logging.WARNING):
        inner.execute(context)
        assert warning in logged()
        assert execute_nested(inner, context) == "done"
        assert warning not in logged()
