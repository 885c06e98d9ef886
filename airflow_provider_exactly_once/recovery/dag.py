"""The recovery DAG: at scheduler start (see ``plugins``) and on a schedule, recover every sink.

    list_sinks ──► recover_sink[sink-a], recover_sink[sink-b], ...   (one mapped task per sink)

One mapped task per registered sink: a sink whose recovery fails shows as its own failed task, and
the others still run. ``max_active_runs=1`` keeps runs from overlapping, and each task holds the
sink's lock in the meta store, which also keeps out a manually triggered or zombie recovery. An
epoch operator committing the same sink meanwhile is safe without the lock: every step of the
coordinator is a compare-and-swap guarded by the sink's marker.

The schedule and the orphan grace period come from Airflow's configuration, so a deployment tunes
them without editing the DAG file::

    [exactly_once]
    recovery_schedule = */15 * * * *        # AIRFLOW__EXACTLY_ONCE__RECOVERY_SCHEDULE
    recovery_orphan_grace_seconds = 21600   # AIRFLOW__EXACTLY_ONCE__RECOVERY_ORPHAN_GRACE_SECONDS
    history_retention_days = 90             # AIRFLOW__EXACTLY_ONCE__HISTORY_RETENTION_DAYS
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from airflow_provider_exactly_once.defaults import (
    CONFIG_SECTION,
    DEFAULT_HISTORY_RETENTION,
    DEFAULT_LOCK_TTL,
    DEFAULT_ORPHAN_GRACE,
)
from airflow_provider_exactly_once.observability.assets import recovery_alias
from airflow_provider_exactly_once.recovery.operators import ListRegisteredSinksOperator, RecoverSinkOperator
from airflow_provider_exactly_once.runtime.assembly import configured_duration
from airflow_provider_exactly_once.version_compat import conf

DEFAULT_RECOVERY_DAG_ID = "exactly_once_recovery"
DEFAULT_RECOVERY_SCHEDULE = "*/15 * * * *"
#: ``schedule`` default of ``recovery_dag``: read ``[exactly_once] recovery_schedule``.
FROM_CONFIG = "from-config"
_START = datetime(2024, 1, 1, tzinfo=UTC)


def configured_schedule() -> str | None:
    """``[exactly_once] recovery_schedule`` (env ``AIRFLOW__EXACTLY_ONCE__RECOVERY_SCHEDULE``); ``none``
    leaves only the run the scheduler's start triggers."""
    value = str(conf.get(CONFIG_SECTION, "recovery_schedule", fallback=DEFAULT_RECOVERY_SCHEDULE)).strip()
    return None if value.lower() in ("", "none", "null") else value


def configured_orphan_grace() -> timedelta:
    """``[exactly_once] recovery_orphan_grace_seconds``; 0 removes an unknown write location at once."""
    return configured_duration("recovery_orphan_grace_seconds", DEFAULT_ORPHAN_GRACE, "seconds", zero_allowed=True)


def configured_history_retention() -> timedelta:
    """``[exactly_once] history_retention_days``."""
    return configured_duration("history_retention_days", DEFAULT_HISTORY_RETENTION, "days")


def recovery_dag(
    dag_id: str = DEFAULT_RECOVERY_DAG_ID,
    *,
    schedule: Any = FROM_CONFIG,
    meta_conn_id: str | None = None,
    orphan_grace: timedelta | None = None,
    lock_ttl: timedelta = DEFAULT_LOCK_TTL,
    history_retention: timedelta | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """Build the recovery DAG (one per meta store; the scheduler-start trigger runs ``dag_id``).

    :param schedule: any Airflow schedule; by default ``[exactly_once] recovery_schedule``, every 15 minutes.
    :param meta_conn_id: the meta store; by default ``[exactly_once] meta_conn_id``, read when the tasks run.
    :param orphan_grace: by default ``[exactly_once] recovery_orphan_grace_seconds``, 6 hours.
    :param history_retention: how long each sink's epoch history is kept; by default
        ``[exactly_once] history_retention_days``, 90 days.
    :param dag_kwargs: passed to ``DAG`` (tags, default_args, ...).
    """
    dag_options: dict[str, Any] = {
        "start_date": _START,
        "catchup": False,
        "max_active_runs": 1,
        # The safety net must run without anyone unpausing it first.
        "is_paused_upon_creation": False,
        "tags": ["exactly-once", "recovery"],
        "doc_md": __doc__,
        "default_args": {"retries": 1, "retry_delay": timedelta(minutes=1)},
        **dag_kwargs,
    }
    with DAG(
        dag_id,
        schedule=configured_schedule() if schedule == FROM_CONFIG else schedule,
        **dag_options,
    ) as dag:
        sinks = ListRegisteredSinksOperator(task_id="list_sinks", meta_conn_id=meta_conn_id)
        RecoverSinkOperator.partial(
            task_id="recover_sink",
            meta_conn_id=meta_conn_id,
            orphan_grace=configured_orphan_grace() if orphan_grace is None else orphan_grace,
            lock_ttl=lock_ttl,
            history_retention=configured_history_retention() if history_retention is None else history_retention,
            map_index_template="{{ task.sink_id }}",
            # Epochs recovery commits wake the DAGs scheduled on their tables, as the commit task's would.
            outlets=[recovery_alias()],
        ).expand(sink_id=sinks.output)
    return dag
