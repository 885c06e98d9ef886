"""A config's ``storage_conn_id`` resolved into fsspec options, in the process that opens the files.

The checkpoint sources and the file sink sit below the Airflow layer and never read a connection
(``filesystems.given_storage_options`` refuses to open a store without the credentials its config
names). Every task, trigger, recovery run and operations tool that opens one asks here first, so a
connection is read in one place, and only where files are touched, never while a DAG is parsed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_exactly_once.checkpoints.config import CheckpointConfig, MetaStoreCheckpoint

if TYPE_CHECKING:
    from airflow_provider_exactly_once.checkpoints.metastore import CheckpointTable
    from airflow_provider_exactly_once.core.ports import CheckpointSource


class NamesStorage(Protocol):
    """A file sink's or checkpoint's config: non-secret options, and the connection holding the rest."""

    @property
    def storage_options(self) -> Mapping[str, Any]: ...

    @property
    def storage_conn_id(self) -> str | None: ...


def resolved_storage_options(config: NamesStorage) -> dict[str, Any]:
    """The config's options with the credentials of its ``storage_conn_id`` (an ``aws`` connection),
    read now."""
    if config.storage_conn_id is None:
        return dict(config.storage_options)
    # The hook brings Airflow's SDK: imported only when a connection is to be read.
    from airflow_provider_exactly_once.hooks.storage import ObjectStorageHook

    return ObjectStorageHook(config.storage_conn_id).storage_options(config.storage_options)


async def aresolved_storage_options(config: NamesStorage) -> dict[str, Any]:
    """``resolved_storage_options`` for the triggerer's event loop (a synchronous fetch of the
    connection may not run on it)."""
    if config.storage_conn_id is None:
        return dict(config.storage_options)
    from airflow_provider_exactly_once.hooks.storage import ObjectStorageHook

    return await ObjectStorageHook(config.storage_conn_id).astorage_options(config.storage_options)


def checkpoint_source(checkpoint: CheckpointConfig | None, table: CheckpointTable) -> CheckpointSource:
    """The checkpoint's source (the meta store's checkpoint table when there is none), with its
    storage connection read now."""
    config = checkpoint or MetaStoreCheckpoint()
    if isinstance(config, MetaStoreCheckpoint):
        return config.source(table)
    return config.source(table, storage_options=resolved_storage_options(config))
