"""One epoch written through Spark Connect: the task is the client of a long-running server.

The write is the epoch writer's own (``epoch_writer.run``) against a Connect session, so what
``spark-submit`` pays per epoch (a JVM, a SparkContext, the Python workers) the server pays once.
Each write opens a session of its own (``create``, not ``getOrCreate``): two tasks in one worker
process must not share the input view or the session settings. The contract: design.md, "Use, do
not rewrite" (Spark Connect); what the server must offer: docs/deployment.md.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import cast
from urllib.parse import urlparse

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.connect.client.retries import DefaultPolicy, RetryPolicyState
from pyspark.sql.connect.session import SparkSession as ConnectSession

from airflow_provider_exactly_once.core.errors import ExactlyOnceError, InvalidSinkConfig, SparkUnavailable
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.defaults import (
    CONFIG_SECTION,
    DEFAULT_SPARK_CONNECT_RETRY,
    SPARK_CONNECT_RETRY_OPTION,
)
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
#: The gRPC detail inside a Connect client's error text.
_DETAILS = re.compile(r'details = "([^"\n]*)"')
_RETRY_SECONDS = DEFAULT_SPARK_CONNECT_RETRY.total_seconds()


def write_through_connect(
    url: str, spec: EpochJobSpec, conf: Mapping[str, str] | None = None, *, retry_seconds: float = _RETRY_SECONDS
) -> PreCommit:
    """Write the epoch ``spec`` describes through the Connect server at ``url`` (``sc://...``) and
    return its pre-commit; a failed write has removed what it wrote before the error goes on."""
    with connect_session(url, {**SESSION_SETTINGS, **(conf or {})}, retry_seconds=retry_seconds) as spark:
        written: list[WriteLocation] = []
        return run(spark, spec, written)


class _RetriedWithin(DefaultPolicy):
    """PySpark's own retry policy (which errors, how the waits grow) for at most ``seconds`` per call."""

    def __init__(self, seconds: float) -> None:
        super().__init__(max_retries=None)
        self.seconds = seconds
        #: The failed attempts and the seconds of the last call given up on.
        self.gave_up: tuple[int, float] | None = None

    def to_state(self) -> RetryPolicyState:
        return _RetriesOfOneCall(self)


class _RetriesOfOneCall(RetryPolicyState):
    def __init__(self, policy: _RetriedWithin) -> None:
        super().__init__(policy)
        self._within = policy
        self._started = time.monotonic()
        self._failed = 0

    def next_attempt(self, exception: BaseException | None = None) -> int | None:
        self._failed += 1
        elapsed = time.monotonic() - self._started
        wait = super().next_attempt(exception)
        left = self._within.seconds - elapsed
        if wait is None or left <= 0:
            self._within.gave_up = (self._failed, elapsed)
            return None
        return int(min(wait, left * 1000))


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
def connect_session(
    url: str, settings: Mapping[str, str], *, retry_seconds: float = _RETRY_SECONDS
) -> Iterator[SparkSession]:
    """A new Connect session with ``settings``, its calls retried for ``retry_seconds`` at most,
    stopped on exit.

    PySpark marks a process that opened a Connect session as Connect-only, in its environment
    (``SPARK_CONNECT_MODE_ENABLED``), which every child process inherits: a ``spark-submit`` started
    later from the same process would build its driver as a Connect client and fail. The mark is
    taken back when the session stops, as the environment was.
    """
    before = {name: os.environ.get(name) for name in _CONNECT_MARKS}
    spark = SparkSession.builder.remote(url).create()
    retried = _RetriedWithin(retry_seconds)
    spark.client.set_retry_policies([retried])
    try:
        try:
            _configure(spark, settings)
        except PySparkException as exc:
            refusal = _not_opened(exc, url, retried)
            if refusal is None:
                raise
            # No session on the server to release, nor a server to wait for once more.
            cast(ConnectSession, spark).release_session_on_close = False
            raise refusal from None
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
    UI, a static SQL setting) is left to it, and named in the log. The first is the session's first
    call: a server that is down or refuses the credentials fails it (``_not_opened``)."""
    servers = []
    for key, value in settings.items():
        try:
            spark.conf.set(key, str(value))
        except PySparkException as exc:
            if exc.getCondition() in _SERVERS_SETTING:
                servers.append(key)
                continue
            if _status(exc) is not None:  # the call failed, not the setting
                raise
            raise InvalidSinkConfig(
                f"Spark Connect refused the session setting {key}={value!r}: {str(exc).splitlines()[0]}"
            ) from None
    if servers:
        log.warning("not applied to the Spark Connect session, being the server's to set: %s", ", ".join(servers))


def _status(exc: PySparkException) -> str | None:
    """The gRPC status of a call the server did not take (``UNAVAILABLE``, ``UNAUTHENTICATED``), or
    ``None`` for an answer the server gave (an error of Spark's)."""
    code = getattr(exc, "getGrpcStatusCode", lambda: None)()
    name = getattr(code, "name", None)
    return name if name in ("UNAVAILABLE", "UNAUTHENTICATED", "PERMISSION_DENIED") else None


def _not_opened(exc: PySparkException, url: str, retried: _RetriedWithin) -> ExactlyOnceError | None:
    """What to say when the session's first call failed because the server at ``url`` did not
    answer, or would not let the client in; ``None`` for any other failure."""
    status = _status(exc)
    address = urlparse(url).netloc or url.split("/;", 1)[0]  # never the parameters: the token is one
    found = _DETAILS.search(str(exc))
    detail = found.group(1) if found else str(exc).strip().splitlines()[0]
    if status in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return InvalidSinkConfig(
            f"the Spark Connect server at {address} refused the credentials ({status}: {detail}); give the "
            "connection the token the server expects (the Token, or password, field of the spark_connect "
            "connection), or none where the server asks for none"
        )
    if status == "UNAVAILABLE" and retried.gave_up is not None:
        attempts, seconds = retried.gave_up
        return SparkUnavailable(
            f"the Spark Connect server at {address} did not answer: {attempts} attempt(s) over {seconds:.1f} s "
            f"([{CONFIG_SECTION}] {SPARK_CONNECT_RETRY_OPTION} = {retried.seconds:g}), the last one: {detail}; "
            "nothing was written, and a retry of the task tries again"
        )
    return None
