"""The recovery DAG's two tasks: list the registered sinks, recover one sink (mapped per sink)."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_exactly_once.core.epochs import ActorKind, EpochStatus, acting, check_sink_id
from airflow_provider_exactly_once.core.errors import SinkLocked
from airflow_provider_exactly_once.defaults import DEFAULT_HISTORY_RETENTION, DEFAULT_LOCK_TTL, DEFAULT_ORPHAN_GRACE
from airflow_provider_exactly_once.observability.assets import emit_committed, recovery_alias
from airflow_provider_exactly_once.observability.run_origin import RECOVERY, task_actor
from airflow_provider_exactly_once.operators._common import airflow_errors
from airflow_provider_exactly_once.runtime.assembly import open_meta_store
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from airflow_provider_exactly_once.version_compat import AirflowFailException, AirflowSkipException

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_exactly_once.store import SqlSinkStateStore


class ListRegisteredSinksOperator(BaseOperator):
    """Every sink of the meta store's registry: what the recovery task is mapped over.

    :return: the sink ids, sorted.
    """

    ui_color = "#fdf2e0"

    def __init__(self, *, meta_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.meta_conn_id = meta_conn_id

    def execute(self, context: Context) -> list[str]:
        with airflow_errors():
            store = open_meta_store(self.meta_conn_id)
            try:
                sinks = [sink_id for sink_id, _, _ in store.registry.registered_sinks()]
            finally:
                store.dispose()
        self.log.info("%d registered sink(s): %s", len(sinks), sinks)
        return sinks


class RecoverSinkOperator(BaseOperator):
    """Recover one sink (``recovery.sink.recover_sink``): its half-done epochs and orphaned writes.

    Skipped when another recovery holds the sink's lock (it is doing the same work); failed, without
    retries, when any epoch or orphan of the sink could not be recovered, so the UI shows it, with
    every failure in the log and the message.

    :param sink_id: the sink (templated; mapped by the recovery DAG).
    :param orphan_grace: how old an unknown write location's files must all be before it is removed.
    :param lock_ttl: the longest this task holds the sink's lock.
    :return: the ``SinkRecoveryReport`` as a dict.
    """

    template_fields: Sequence[str] = ("sink_id",)
    ui_color = "#fdf2e0"

    def __init__(
        self,
        *,
        sink_id: str,
        meta_conn_id: str | None = None,
        orphan_grace: timedelta = DEFAULT_ORPHAN_GRACE,
        lock_ttl: timedelta = DEFAULT_LOCK_TTL,
        history_retention: timedelta = DEFAULT_HISTORY_RETENTION,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.sink_id = sink_id
        self.meta_conn_id = meta_conn_id
        self.orphan_grace = orphan_grace
        self.lock_ttl = lock_ttl
        self.history_retention = history_retention

    def execute(self, context: Context) -> dict[str, Any]:
        # The recovery machinery (coordinator, committers) loads in the task, not at every parse.
        from airflow_provider_exactly_once.recovery.sink import recover_sink

        with airflow_errors(), acting(task_actor(context, ActorKind.RECOVERY)):
            check_sink_id(self.sink_id)  # templated: only the rendered value can be checked
            store = open_meta_store(self.meta_conn_id)
            try:
                report = recover_sink(
                    store,
                    self.sink_id,
                    holder=_holder(context),
                    orphan_grace=self.orphan_grace,
                    lock_ttl=self.lock_ttl,
                )
                self._emit_assets(context, store, report.committed)
                expired = store.history.expire(self.sink_id, self.history_retention)
                if expired:
                    self.log.info("%d history row(s) older than %s deleted", expired, self.history_retention)
            except SinkLocked as exc:
                raise AirflowSkipException(str(exc)) from exc
            finally:
                store.dispose()
        self.log.info("%s", report.summary())
        for what, why in sorted(report.failed.items()):
            self.log.error("sink %r: %s failed: %s", self.sink_id, what, why)
        if not report.ok:
            raise AirflowFailException(
                f"recovery of sink {self.sink_id!r} left {len(report.failed)} failure(s): "
                + "; ".join(f"{what}: {why}" for what, why in sorted(report.failed.items()))
            )
        return report.model_dump(mode="json")

    def _emit_assets(self, context: Context, store: SqlSinkStateStore, committed: list[int]) -> None:
        """Asset events for the tables of the epochs this recovery committed (``observability.assets``).

        Only with the recovery alias among the task's outlets (the recovery DAG declares it), and
        never at the cost of the recovery: the epochs are committed whatever happens here.
        """
        alias = recovery_alias()
        if not committed or alias not in self.outlets:
            return
        from airflow_provider_exactly_once.runtime.assembly import registered_configs

        try:
            registration = registered_configs(store.registry, self.sink_id)
            if registration is None or not isinstance(sink := registration[0], IcebergSinkConfig):
                return
            for epoch in committed:
                record = store.get(self.sink_id, epoch)
                if record is not None and record.status is EpochStatus.COMMITTED:
                    emit_committed(context, alias, sink.iceberg_conn_id, record, committed_by=RECOVERY)
        except Exception:  # the asset events are a notification; the commit already happened
            self.log.warning(
                "sink %r: could not add asset events for epochs %s", self.sink_id, committed, exc_info=True
            )


def _holder(context: Context) -> str:
    """Names the task instance and host, so a refused recovery can say who holds the lock."""
    ti = context.get("ti")
    name = (
        f"{getattr(ti, 'dag_id', '?')}/{getattr(ti, 'run_id', '?')}/{getattr(ti, 'task_id', '?')}"
        f"[{getattr(ti, 'map_index', -1)}]#{getattr(ti, 'try_number', 0)}@{socket.gethostname()}"
    )
    from airflow_provider_exactly_once.store.models import LOCK_HOLDER_LENGTH

    return name[:LOCK_HOLDER_LENGTH]
