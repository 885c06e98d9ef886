"""One epoch of one sink as a task group: write -> persist -> wait for checkpoint -> commit, or abort.

    write ──► persist ──► wait ──► commit ──(failed)──► rewrite_1 ──► persist_1 ──► wait_1 ──► commit_1 ──► ...
      │          │          │                        (upsert sinks only, ``rewrites`` times)
      └──────────┴──────────┴──(one failed)──► abort

The abort runs when the write, the persist or the wait failed (a failed or timed-out checkpoint
fails the wait without retries; any other failure of the wait, a lost worker above all, is retried,
because an abort while the checkpoint is still pending would drop an epoch that may yet complete).
A commit failure never leads to an abort: the commit is retried, and once the checkpoint completed
the coordinator refuses aborts anyway. When the epoch is aborted
the commit is left ``upstream_failed``, so the DAG run ends failed and the UI shows it; clearing
the run writes the epoch again with a new write, which re-opens the Aborted epoch.

An upsert sink's commit can meet another writer's change to the files it rewrote
(``UpsertConflict``), which no retry of the commit can absorb: the group then writes the epoch
again, up to ``rewrites`` times (``operators.rewrite``). When the commit succeeds those tasks are
skipped; the run fails only when the last of them fails.
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
    rewrites: int = 2,
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
    Task ids inside the group: ``persist``, ``wait_for_checkpoint``, ``commit``, ``abort``; for an
    upsert sink also ``rewrite_N``, ``persist_N``, ``wait_N`` and ``commit_N`` for N up to
    ``rewrites``: how many times the epoch is written again when another writer changed the files
    it rewrote (0: never; the run then fails and clearing it writes the epoch again).
    """
    write_op = getattr(write, "operator", None) if isinstance(write, XComArg) else write
    if not isinstance(write_op, BaseOperator):
        raise InvalidSinkConfig(f"write must be an operator or a task's output, got {type(write).__name__}")
    sink_cfg = as_sink(sink)
    checkpoint_cfg = as_checkpoint(checkpoint)
    if commit_retries < 0:
        raise InvalidSinkConfig(f"commit_retries must not be negative, got {commit_retries}")
    if rewrites < 0:
        raise InvalidSinkConfig(f"rewrites must not be negative, got {rewrites}")
    upsert = getattr(sink_cfg, "mode", "append") == "upsert"
    if upsert and rewrites and not getattr(write_op, "allow_nested_operators", True):
        raise InvalidSinkConfig(
            f"task {write_op.task_id}: a rewrite runs the write task's operator inside its own task, which "
            "allow_nested_operators=False forbids; allow it, or give exactly_once_epoch rewrites=0"
        )
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
        if upsert:
            sensing = {**retried, **dict(sensor_kwargs or {})}
            _rewrite_chain(commit, write_op, checkpoint_cfg, rewrites, common, retried, sensing)
    write_op >> persist
    write_op >> abort
    return group


def _rewrite_chain(
    commit: BaseOperator,
    write_op: BaseOperator,
    checkpoint: CheckpointConfig,
    rewrites: int,
    common: Mapping[str, Any],
    retried: Mapping[str, Any],
    sensing: Mapping[str, Any],
) -> None:
    """``commit -> rewrite_1 -> persist_1 -> wait_1 -> commit_1 -> rewrite_2 ...``: the bounded loop
    of an upsert epoch whose write conflicted, unrolled because Airflow runs no task twice in a run.

    A rewrite runs when the commit before it failed or could not run (``ONE_FAILED``: a persist
    that met the conflict leaves the commit ``upstream_failed``); it runs the write task's operator,
    so it takes that task's queue, pool, retries and timeout. Its wait costs one look when the
    checkpoint completed already, and waits as the first did when a persist's conflict came early.
    """
    # Only upsert sinks have the loop: an append sink's DAG file does not pay for its operator.
    from airflow_provider_exactly_once.operators.rewrite import RewriteEpochOperator

    previous = commit
    earlier: list[str] = []
    for n in range(1, rewrites + 1):
        rewrite = RewriteEpochOperator(
            task_id=f"rewrite_{n}",
            checkpoint=checkpoint,
            write_task_id=write_op.task_id,
            earlier_rewrite_task_ids=list(earlier),
            trigger_rule=TriggerRule.ONE_FAILED,
            queue=write_op.queue,
            pool=write_op.pool,
            retries=write_op.retries,
            retry_delay=write_op.retry_delay,
            execution_timeout=write_op.execution_timeout,
            **common,
        )
        persist = PersistPendingOperator(
            task_id=f"persist_{n}", write_task_id=rewrite.task_id, checkpoint=checkpoint, **common, **retried
        )
        wait = CheckpointSensor(task_id=f"wait_{n}", checkpoint=checkpoint, **common, **sensing)
        commit_n = CommitEpochOperator(
            task_id=f"commit_{n}", checkpoint=checkpoint, write_task_id=rewrite.task_id, **common, **retried
        )
        previous >> rewrite >> persist >> wait >> commit_n
        previous = commit_n
        earlier.append(rewrite.task_id)


def _warn_if_upserts_overlap(sink: SinkConfig, write_op: BaseOperator) -> None:
    """An upsert epoch written while an earlier one is not yet committed has not seen its rows, and
    meets a conflict whenever their key ranges overlap, costing a rewrite (design.md D14): said when
    the DAG is parsed, where the author can still set ``max_active_runs=1``."""
    if getattr(sink, "mode", "append") != "upsert" or write_op.dag is None:
        return
    runs = write_op.dag.max_active_runs
    if runs != 1:
        warnings.warn(
            f"sink {sink.sink_id!r} is an upsert sink, and DAG {write_op.dag.dag_id!r} runs up to {runs} epochs at "
            "once: an epoch written before the previous one committed conflicts with it (UpsertConflict) and is "
            "written again, or fails once its rewrites are used up. Give the DAG max_active_runs=1.",
            UserWarning,
            stacklevel=3,
        )
