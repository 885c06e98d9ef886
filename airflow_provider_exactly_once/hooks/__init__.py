"""Connections to what the protocol runs over: the meta store (``meta_store``, with the mappers its
first query configures) and object storage (``storage``); the sink's catalog is the Iceberg
provider's own hook. Assembling a coordinator from them is ``runtime.assembly``'s job.

The meta store's hook is resolved on first use (PEP 562): it brings the store's SQLAlchemy models,
which the storage hook (``hooks.storage``, asked by every task that opens files) never needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_exactly_once.defaults import DEFAULT_META_CONN_ID
from airflow_provider_exactly_once.extras import lazy_exports

if TYPE_CHECKING:
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

__getattr__, __dir__ = lazy_exports(
    __name__,
    {name: "meta_store" for name in ("META_CONN_TYPE", "ExactlyOnceMetaStoreHook", "embedded_meta_store_url")},
    globals(),
)
