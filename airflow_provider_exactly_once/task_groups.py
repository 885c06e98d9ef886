"""One epoch of one sink as a task group: write -> persist -> wait for checkpoint -> commit, or abort.

    write ──► persist ──► wait ──► commit
      │          │          │
      └──────────┴──────────┴──(one failed)──► abort

The abort runs when the write, the persist or the wait failed (a failed or timed-out checkpoint
fails the wait without retries; any other failure of the wait, a lost worker above all, is retried,
because an abort while the checkpoint is still pending would drop an epoch that may yet complete).
A commit failure never leads to an abort: the commit is retried, and once the checkpoint completed
the coordinator refuses aborts anyway. When the epoch is aborted
the commit is left ``upstream_failed``, so the DAG run ends failed and the UI shows it; clearing
the run writes the epoch again with a new write, which re-opens the Aborted epoch.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator, TaskGroup, TriggerRule, XComArg

from airflow_provider_exactly_once.checkpoints.config import CheckpointConfig
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.defaults import DEFAULT_META_CONN_ID
from airflow_provider_exactly_once.operators.epoch import (
    AbortEpochOperator,
    CommitEpochOperator,
    PersistPendingOperator,
)
from airflow_provider_exactly_once.runtime.assembly import as_checkpoint, as_sink
from airflow_provider_exactly_once.sensors.checkpoint import CheckpointSensor
from airflow_provider_exactly_once.sinks.config import SinkConfig


def exactly_once_epoch(
    write: BaseOperator | XComArg,
    *,
    sink: SinkConfig | Mapping[str, Any],
    checkpoint: CheckpointConfig | Mapping[str, Any],
    meta_conn_id: str = DEFAULT_META_CONN_ID,
    group_id: str | None = None,
    sensor_kwargs: Mapping[str, Any] | None = None,
    commit_retries: int = 8,
    commit_retry_delay: timedelta = timedelta(seconds=15),
) -> TaskGroup:
    """Wire the epoch's steps after ``write`` (an operator, or a ``@task`` call's result).

    The write must return the pre-commit metadata of the run's epoch (``epoch_for_context``).
    ``sensor_kwargs`` go to ``CheckpointSensor`` (``deferrable``, ``mode``, ``poke_interval``,
    ``timeout``...). Persist, commit and abort are retried ``commit_retries`` times with
    exponential backoff from ``commit_retry_delay``: all three are idempotent, and a transient
    fault in the meta store or the catalog must not leave a completed epoch uncommitted. The
    sensor gets the same retries unless ``sensor_kwargs`` names its own: only a failed checkpoint
    and a timeout end the wait for good (Airflow never retries those), so a retry only answers a
    lost worker or a transient error, which must not abort an epoch whose checkpoint is pending.
    Task ids inside the group: ``persist``, ``wait_for_checkpoint``, ``commit``, ``abort``.
    """
    write_op = getattr(write, "operator", None) if isinstance(write, XComArg) else write
    if not isinstance(write_op, BaseOperator):
        raise InvalidSinkConfig(f"write must be an operator or a task's output, got {type(write).__name__}")
    sink_cfg = as_sink(sink)
    checkpoint_cfg = as_checkpoint(checkpoint)
    if commit_retries < 0:
        raise InvalidSinkConfig(f"commit_retries must not be negative, got {commit_retries}")
    group_id = group_id or "exactly_once_" + re.sub(r"[^\w-]", "_", sink_cfg.sink_id)
    _warn_if_upserts_overlap(sink_cfg, write_op)
    common: dict[str, Any] = {"sink": sink_cfg, "meta_conn_id": meta_conn_id}
    retried: dict[str, Any] = {
        "retries": commit_retries,
        "retry_delay": commit_retry_delay,
        "retry_exponential_backoff": True,
    }

    with TaskGroup(group_id=group_id, dag=write_op.dag) as group:
        # Persist is retried like commit and abort: it is idempotent, and a persist that failed on a
        # transient fault (the meta store restarting) would otherwise fail the run into its abort,
        # dropping an epoch whose checkpoint may have completed (the fault harness's meta-store outage).
        persist = PersistPendingOperator(
            task_id="persist", write_task_id=write_op.task_id, checkpoint=checkpoint_cfg, **common, **retried
        )
        # The group's retries unless the author gave others (found by the harness's kill_sensor_wait).
        wait = CheckpointSensor(
            task_id="wait_for_checkpoint",
            sink=sink_cfg,
            checkpoint=checkpoint_cfg,
            meta_conn_id=meta_conn_id,
            **{**retried, **dict(sensor_kwargs or {})},
        )
        commit = CommitEpochOperator(
            task_id="commit", checkpoint=checkpoint_cfg, write_task_id=write_op.task_id, **common, **retried
        )
        abort = AbortEpochOperator(
            task_id="abort",
            checkpoint=checkpoint_cfg,
            write_task_id=write_op.task_id,
            trigger_rule=TriggerRule.ONE_FAILED,
            **common,
            **retried,
        )
        persist >> wait >> commit
        [persist, wait] >> abort
    write_op >> persist
    write_op >> abort
    return group


def _warn_if_upserts_overlap(sink: SinkConfig, write_op: BaseOperator) -> None:
    """An upsert epoch written while an earlier one is not yet committed has not seen its rows, and
    its commit is refused whenever their key ranges overlap (design.md D14): said when the DAG is
    parsed, where the author can still set ``max_active_runs=1``."""
    if getattr(sink, "mode", "append") != "upsert" or write_op.dag is None:
        return
    runs = write_op.dag.max_active_runs
    if runs != 1:
        warnings.warn(
            f"sink {sink.sink_id!r} is an upsert sink, and DAG {write_op.dag.dag_id!r} runs up to {runs} epochs at "
            "once: an epoch written before the previous one committed conflicts with it (UpsertConflict) and must "
            "be cleared to write it again. Give the DAG max_active_runs=1.",
            UserWarning,
            stacklevel=3,
        )
