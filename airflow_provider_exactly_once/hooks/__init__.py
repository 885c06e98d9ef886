"""Connections to what the protocol runs over: the meta store, the sink's catalog, the run's epoch."""

from airflow_provider_exactly_once.hooks.epochs import epoch_for_context
from airflow_provider_exactly_once.hooks.meta_store import (
    DEFAULT_META_CONN_ID,
    META_CONN_TYPE,
    ExactlyOnceMetaStoreHook,
    coordinator_for,
    embedded_meta_store_url,
    sink_committer,
)

__all__ = [
    "DEFAULT_META_CONN_ID",
    "META_CONN_TYPE",
    "ExactlyOnceMetaStoreHook",
    "coordinator_for",
    "embedded_meta_store_url",
    "epoch_for_context",
    "sink_committer",
]
