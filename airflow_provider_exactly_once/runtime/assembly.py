"""The coordinator of one sink, assembled from connections: what every task, the recovery DAG
and the operations tools build before they ask the coordinator anything.

Hooks hold connections only; this module puts the meta store (``hooks.meta_store``), the sink's
committer (its catalog from the sink's Iceberg connection), the checkpoint source, the faults armed
from the environment (``runtime.faults``) and Airflow's metrics together, once, the same way for
everyone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_exactly_once.checkpoints.config import CheckpointConfig, checkpoint_config_from_dict
from airflow_provider_exactly_once.core.errors import SinkUnavailable
from airflow_provider_exactly_once.core.faults import FaultHook, no_faults
from airflow_provider_exactly_once.core.identifiers import check_sink_id
from airflow_provider_exactly_once.core.redact import mask_userinfo
from airflow_provider_exactly_once.defaults import DEFAULT_META_CONN_ID
from airflow_provider_exactly_once.runtime.epochs import epoch_for_context, interval_epoch
from airflow_provider_exactly_once.sinks.config import SinkConfig, sink_config_from_dict

if TYPE_CHECKING:
    from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
    from airflow_provider_exactly_once.core.observe import Metrics
    from airflow_provider_exactly_once.core.ports import SinkCommitter
    from airflow_provider_exactly_once.store import SqlSinkStateStore


def as_sink(sink: SinkConfig | Mapping[str, Any]) -> SinkConfig:
    """Accept a sink config or its ``to_dict()`` form (what a DAG built from JSON has)."""
    return sink if not isinstance(sink, Mapping) else sink_config_from_dict(sink)


def as_checkpoint(checkpoint: CheckpointConfig | Mapping[str, Any]) -> CheckpointConfig:
    return checkpoint if not isinstance(checkpoint, Mapping) else checkpoint_config_from_dict(checkpoint)


def sink_committer(sink: SinkConfig, *, fault: FaultHook = no_faults, metrics: Metrics | None = None) -> SinkCommitter:
    """The committer of a sink, its Iceberg catalog built from the sink's Iceberg connection.

    ``fault`` is the fault-injection hook (``core.faults``); production passes none. ``metrics``:
    none by default (``core.observe`` is imported here, not where DAG files import this module).
    """
    if metrics is None:
        from airflow_provider_exactly_once.core.observe import NO_METRICS

        metrics = NO_METRICS
    from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig

    if isinstance(sink, IcebergSinkConfig):
        from airflow.providers.apache.iceberg.hooks.iceberg import IcebergHook

        from airflow_provider_exactly_once.sinks.iceberg.catalog_access import UNREACHABLE, describe_error

        hook = IcebergHook(sink.iceberg_conn_id)
        try:
            catalog = hook.catalog
        except UNREACHABLE as exc:
            # A REST catalog is contacted as it is loaded: down, it must read "try again" like any
            # other unreachable catalog call, not as an unknown failure (its connection's secrets masked).
            conn = hook.get_connection(sink.iceberg_conn_id)
            extra = conn.extra_dejson or {}
            properties = {**extra, "password": conn.password or ""}
            uri = conn.host or extra.get("uri")  # the host wins, as in IcebergHook
            where = f"catalog of connection {sink.iceberg_conn_id!r}" + (f" ({uri})" if uri else "")
            what = mask_userinfo(f"sink {sink.sink_id!r}: {where} could not be loaded")
            raise SinkUnavailable(f"{what}: {describe_error(exc, properties)}") from exc
        from airflow_provider_exactly_once.hooks.orm_setup import configure_catalog_mappers

        configure_catalog_mappers(catalog)
        committer = sink.committer(catalog, fault=fault)
        committer.metrics = metrics  # its conflict retries (``core.observe.COMMIT_RETRIES``)
        return committer
    return sink.committer(fault=fault)


def coordinator_for(
    sink: SinkConfig,
    checkpoint: CheckpointConfig | None,
    *,
    meta_conn_id: str = DEFAULT_META_CONN_ID,
    store: SqlSinkStateStore | None = None,
    fault: FaultHook | None = None,
    epoch: int | None = None,
    try_number: int | None = None,
    metrics: Metrics | None = None,
    allow_beyond_horizon: bool = False,
) -> TwoPhaseCommitCoordinator:
    """The coordinator of one sink: the meta store of ``meta_conn_id`` (or ``store``), the sink's
    committer, and the checkpoint source (``None`` only for steps that never consult it, such as
    persist; the meta-store checkpoint table then stands in).

    ``fault`` defaults to ``fault_hook_from_env()``: a no-op unless ``EXACTLY_ONCE_FAULT`` is set,
    which lets the demo and the fault-injection harness make a real task die at a named point
    without touching the DAG. One hook serves the coordinator and the committer, so an occurrence
    count (``commit.visible@2``) counts every place the point is reached in this task try.
    ``epoch`` and ``try_number`` (the task try's) select the rules of an ``EXACTLY_ONCE_FAULT_PLAN``
    file that apply to this try (``runtime.faults.fault_hook_for``).
    ``metrics`` defaults to Airflow's ``Stats`` (``observability.stats``): commit durations, files,
    rows, retries and aborts go wherever ``[metrics]`` sends Airflow's own.
    ``allow_beyond_horizon`` is an operator's word that an epoch older than the table's snapshot
    history is not in the table (``eo-sink commit --beyond-horizon``); never set by a task.
    """
    from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
    from airflow_provider_exactly_once.observability.stats import airflow_metrics

    if fault is None:
        from airflow_provider_exactly_once.runtime.faults import fault_hook_for

        fault = fault_hook_for(sink.sink_id, epoch, try_number)
    if store is None:
        store = open_meta_store(meta_conn_id)
    source = (checkpoint or MetaStoreCheckpoint()).source(store.checkpoints)
    if metrics is None:
        metrics = airflow_metrics()
    committer = sink_committer(sink, fault=fault, metrics=metrics)
    from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator

    return TwoPhaseCommitCoordinator(
        store,
        {sink.sink_id: committer},
        source,
        fault=fault,
        metrics=metrics,
        allow_beyond_horizon=allow_beyond_horizon,
        on_reprocess={sink.sink_id: sink.on_reprocess},
    )


def open_meta_store(meta_conn_id: str) -> SqlSinkStateStore:
    """The meta store of an Airflow connection; the hook (and SQLAlchemy's engine) load only in a
    task that opens one, not when a DAG file naming the operators is parsed."""
    from airflow_provider_exactly_once.hooks.meta_store import ExactlyOnceMetaStoreHook

    return ExactlyOnceMetaStoreHook(meta_conn_id).get_store()


def run_epoch(context: Mapping[str, Any], sink_id: str, meta_conn_id: str) -> int:
    """The run's epoch (``runtime.epochs.epoch_for_context``), opening the meta store only when the
    run has no data interval and its epoch must be allocated."""
    epoch = interval_epoch(context)
    if epoch is not None:
        check_sink_id(sink_id)
        return epoch
    store = open_meta_store(meta_conn_id)
    try:
        return epoch_for_context(context, sink_id, store.epochs)
    finally:
        store.dispose()
