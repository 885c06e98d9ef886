"""Defaults every layer agrees on, named once; no imports, so the light modules (the views,
``eo-sink --url``, the package root) can use them without loading Airflow."""

from __future__ import annotations

from datetime import timedelta

#: The meta store connection used when a task, the recovery DAG or ``eo-sink`` names none.
DEFAULT_META_CONN_ID = "exactly_once_default"
#: How old a write location must be before the orphan clean-up may delete it: longer than any
#: write task can take between writing its files and persisting them (docs/operations.md).
DEFAULT_ORPHAN_GRACE = timedelta(hours=6)
#: How long an epoch's history rows are kept (``[exactly_once] history_retention_days``): the
#: recovery DAG deletes older ones, never an epoch's own row.
DEFAULT_HISTORY_RETENTION = timedelta(days=90)
#: How long a recovery holds a sink's lock at most; a killed recovery task blocks the next one this long.
DEFAULT_LOCK_TTL = timedelta(hours=1)
#: How long a write through Spark Connect retries a server that does not answer, per call
#: (``[exactly_once] spark_connect_retry_seconds``): PySpark's own retries wait ten minutes and more.
DEFAULT_SPARK_CONNECT_RETRY = timedelta(seconds=60)
SPARK_CONNECT_RETRY_OPTION = "spark_connect_retry_seconds"
#: The ``airflow.cfg`` section of the package's options (declared in ``get_provider_info``).
CONFIG_SECTION = "exactly_once"
#: How long an unsettled epoch's DAG run may show no live task before ``eo-sink status`` and the
#: sink page say it will never finish (``[exactly_once] stale_run_minutes``, ``operations.stale_runs``).
DEFAULT_STALE_RUN = timedelta(minutes=60)
