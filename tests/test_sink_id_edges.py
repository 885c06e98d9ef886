"""A sink id is checked where it enters the package, and trusted below: the edges that take one
as a task's argument refuse a bad one, naming it, before a store or a checkpoint source sees it.
The CLI, the UI, sink configs and pre-commits have theirs beside their other input checks."""

from __future__ import annotations

import re

import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.errors import InvalidIdentifier
from airflow_provider_exactly_once.operators import MarkCheckpointOperator
from airflow_provider_exactly_once.recovery.operators import RecoverSinkOperator
from airflow_provider_exactly_once.sensors.checkpoint import CheckpointSensor
from airflow_provider_exactly_once.version_compat import AirflowFailException

UNSAFE = re.escape("sink_id '../etc' has characters unsafe in a path")


def test_the_checkpoint_sensor_refuses_a_bad_sink_id_when_the_dag_is_parsed() -> None:
    with pytest.raises(InvalidIdentifier, match=UNSAFE):
        CheckpointSensor(task_id="wait", sink_id="../etc", checkpoint=MetaStoreCheckpoint())


def test_mark_checkpoint_refuses_a_bad_rendered_sink_id_without_retries() -> None:
    operator = MarkCheckpointOperator(task_id="mark", sink_id="../etc", meta_conn_id="no_such_connection")
    with pytest.raises(AirflowFailException, match=f"InvalidIdentifier: {UNSAFE}"):
        operator.execute({})  # refused before the meta store's connection is looked up


def test_recover_sink_refuses_a_bad_rendered_sink_id_without_retries() -> None:
    operator = RecoverSinkOperator(task_id="recover", sink_id="../etc", meta_conn_id="no_such_connection")
    with pytest.raises(AirflowFailException, match=f"InvalidIdentifier: {UNSAFE}"):
        operator.execute({})  # refused before the meta store is opened
