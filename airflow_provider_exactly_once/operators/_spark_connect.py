"""The write's other path: a Spark connection of type ``spark_connect`` makes the write task a Spark
Connect client (``spark.connect_write``) instead of a ``spark-submit``; nothing else of the write
changes, so choosing the path is choosing the connection.

A Connect session takes SQL settings only: ``conf`` becomes the session's configuration, and what
shapes a driver and its executors (``executor_memory``, ``jars``, ``deploy_mode``, a ``conf`` key such
as ``spark.driver.memory``) is the server's. Those are not applied, and the task's log names them:
the same DAG runs on either kind of connection, as switching one is meant to be the only change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.defaults import DEFAULT_SPARK_CONNECT_RETRY, SPARK_CONNECT_RETRY_OPTION
from airflow_provider_exactly_once.version_compat import AirflowNotFoundException

#: The Spark provider's connection type for Spark Connect (its ``SparkConnectHook``).
CONNECT_CONN_TYPE = "spark_connect"
#: Settings that mean nothing to a Connect session but are harmless to have: the application is the
#: writer's own, and the name only labels a ``spark-submit``.
_IGNORED = frozenset({"application", "name", "conf", "conn_id"})


def connect_url(conn_id: str) -> str | None:
    """The ``sc://`` URL of the connection when it is a Spark Connect one, else ``None`` (its token,
    if any, is in the URL: never log it)."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    hook = SparkConnectHook(conn_id)
    try:
        conn_type = hook.get_connection(conn_id).conn_type
    except AirflowNotFoundException:  # the Spark provider's hook then submits to its default master
        return None
    if conn_type != CONNECT_CONN_TYPE:
        return None
    try:
        return hook.get_connection_url()
    except ValueError as exc:  # a path in the host, which the provider refuses
        raise InvalidSinkConfig(f"Spark Connect connection {conn_id!r}: {exc}") from None


def connect_settings(given: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The session settings of a Connect write (``conf``), and the ``spark-submit`` settings given
    that a Connect session has no place for."""
    ignored = sorted(name for name, value in given.items() if value not in (None, False) and name not in _IGNORED)
    return {str(key): str(value) for key, value in (given.get("conf") or {}).items()}, ignored


def connect_retry_seconds() -> float:
    """How long each call of a Connect write retries a server that does not answer:
    ``[exactly_once] spark_connect_retry_seconds``, a minute by default, read when the task runs."""
    from airflow_provider_exactly_once.runtime.assembly import configured_duration

    return configured_duration(SPARK_CONNECT_RETRY_OPTION, DEFAULT_SPARK_CONNECT_RETRY, "seconds").total_seconds()
