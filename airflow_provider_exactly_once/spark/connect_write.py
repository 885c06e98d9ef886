"""One epoch written through Spark Connect: the task is the client of a long-running server.

The write is the epoch writer's own (``epoch_writer.run``), run in the task's process against a
Connect session instead of in a ``spark-submit`` driver: the same code, which uses nothing Connect
lacks (no RDDs, no ``sparkContext``, no JVM gateway; ``spread`` hands lists to the executors). What
``spark-submit`` pays per epoch (a JVM, a SparkContext, the executors' Python workers) the server
pays once.

Each write opens a session of its own (``create``, not ``getOrCreate``): two tasks in one worker
process must not share the input view or the session settings, and stopping it releases what it
cached on the server. Only the settings below and the author's ``conf`` go into the session's
configuration, which the server may log (a ``conf`` key only the server can set, such as
``spark.driver.memory``, is left to it and named in the task's log); the catalog's and the store's properties travel inside the
tasks' functions, as they do in a ``spark-submit`` job spec.

The server's Python workers import this package (their interpreter is the server's
``spark.pyspark.python``), and the write location must be reachable from both ends: the server
writes the files, the task describes a few of them and the commit reads them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from pyspark.sql import SparkSession

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.spark.epoch_writer import SESSION_SETTINGS, WriteLocation, run
from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec

log = logging.getLogger(__name__)

#: Spark's conditions for a setting a session cannot change.
_SERVERS_SETTING = frozenset({"CANNOT_MODIFY_CONFIG", "CANNOT_MODIFY_STATIC_CONFIG"})
#: What PySpark sets in the environment of a process that opened a Connect session.
_CONNECT_MARKS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
#: In a Connect client's error: the server no longer has the session (it restarted, or another
#: server answers at its address), or it stopped answering for longer than the client retries.
_SERVER_LOST = ("INVALID_HANDLE.SESSION_NOT_FOUND", "INVALID_HANDLE.SESSION_CHANGED", "StatusCode.UNAVAILABLE")


def write_through_connect(url: str, spec: EpochJobSpec, conf: Mapping[str, str] | None = None) -> PreCommit:
    """Write the epoch ``spec`` describes through the Connect server at ``url`` (``sc://...``) and
    return its pre-commit; a failed write has removed what it wrote before the error goes on."""
    with connect_session(url, {**SESSION_SETTINGS, **(conf or {})}) as spark:
        written: list[WriteLocation] = []
        return run(spark, spec, written)


def server_lost(exc: BaseException) -> bool:
    """Whether the write failed because its server went away under it rather than on the epoch:
    what the write put down can never be committed, and only a new write (a retry) can finish it.

    The server's own errors reach the client as ``SparkConnectGrpcException`` (or a subclass); a
    bare ``SparkConnectException``, often without a message, is the client's when the stream broke."""
    from pyspark.errors.exceptions.connect import SparkConnectException

    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return any(type(e) is SparkConnectException or any(m in str(e) for m in _SERVER_LOST) for e in chain)


@contextmanager
def connect_session(url: str, settings: Mapping[str, str]) -> Iterator[SparkSession]:
    """A new Connect session with ``settings``, stopped on exit.

    PySpark marks a process that opened a Connect session as Connect-only, in its environment
    (``SPARK_CONNECT_MODE_ENABLED``), which every child process inherits: a ``spark-submit`` started
    later from the same process would build its driver as a Connect client and fail. The mark is
    taken back when the session stops, as the environment was.
    """
    before = {name: os.environ.get(name) for name in _CONNECT_MARKS}
    spark = SparkSession.builder.remote(url).create()
    try:
        _configure(spark, settings)
        yield spark
    finally:
        try:
            spark.stop()
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _configure(spark: SparkSession, settings: Mapping[str, str]) -> None:
    """Set each setting on the session; one that only the server can set (a driver's memory, the
    UI, a static SQL setting) is left to it, and named in the log."""
    from pyspark.errors import PySparkException

    servers = []
    for key, value in settings.items():
        try:
            spark.conf.set(key, str(value))
        except PySparkException as exc:
            if exc.getCondition() in _SERVERS_SETTING:
                servers.append(key)
                continue
            raise InvalidSinkConfig(
                f"Spark Connect refused the session setting {key}={value!r}: {str(exc).splitlines()[0]}"
            ) from None
    if servers:
        log.warning("not applied to the Spark Connect session, being the server's to set: %s", ", ".join(servers))
