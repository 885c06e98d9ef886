"""Connections to what the protocol runs over: the meta store (the sink's catalog is the Iceberg
provider's own hook). Assembling a coordinator from them is ``runtime.assembly``'s job."""

from airflow_provider_exactly_once.defaults import DEFAULT_META_CONN_ID
from airflow_provider_exactly_once.hooks.meta_store import (
    META_CONN_TYPE,
    ExactlyOnceMetaStoreHook,
    embedded_meta_store_url,
)

__all__ = [
    "DEFAULT_META_CONN_ID",
    "META_CONN_TYPE",
    "ExactlyOnceMetaStoreHook",
    "embedded_meta_store_url",
]
