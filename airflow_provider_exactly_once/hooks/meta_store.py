"""The meta store as an Airflow connection, and the coordinator of one sink built from connections.

Tasks in Airflow 3 may not touch Airflow's own metadata database, so the meta store
(``pending_sink_state`` and its companions) is reached through a connection of this package's own
type, ``exactly_once_meta``: its *SQLAlchemy URL* field names a SQLite file or a PostgreSQL
database. A deployment that never creates the default connection still works on one machine: the
hook then falls back to an embedded SQLite file under ``$AIRFLOW_HOME`` and says so in the log.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from airflow_provider_exactly_once.defaults import DEFAULT_META_CONN_ID
from airflow_provider_exactly_once.get_provider_info import META_STORE_FIELD_BEHAVIOUR
from airflow_provider_exactly_once.hooks.meta_store_url import (
    META_CONN_TYPE,
    connection_store,
    embedded,
    embedded_meta_store_url,
    url_of_fields,
)
from airflow_provider_exactly_once.version_compat import AirflowNotFoundException

if TYPE_CHECKING:
    from airflow_provider_exactly_once.store import SqlSinkStateStore

__all__ = ["META_CONN_TYPE", "ExactlyOnceMetaStoreHook", "embedded_meta_store_url"]


class ExactlyOnceMetaStoreHook(BaseHook):
    """Resolves an ``exactly_once_meta`` connection to the package's meta store.

    The connection's *SQLAlchemy URL* (the ``host`` field) is e.g. ``sqlite:////data/meta.db`` or
    ``postgresql+psycopg2://airflow@db:5432/exactly_once``; a password kept in the connection's
    password field (so it stays masked) is put into the URL when the URL carries none. Extra may hold
    ``connect_timeout_s`` and ``busy_timeout_s``.

    :param meta_conn_id: the connection id; when it is the default id and no such connection
        exists, the embedded SQLite default is used (see ``embedded_meta_store_url``).
    """

    conn_name_attr = "meta_conn_id"
    default_conn_name = DEFAULT_META_CONN_ID
    conn_type = META_CONN_TYPE
    hook_name = "Exactly-once meta store"

    def __init__(self, meta_conn_id: str = DEFAULT_META_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.meta_conn_id = meta_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """One URL field; the same definition the provider info declares for Airflow 3.2+ UIs."""
        return copy.deepcopy(META_STORE_FIELD_BEHAVIOUR)

    # -- the URL -----------------------------------------------------------------------------------

    def get_url(self) -> tuple[str, dict[str, float]]:
        """The meta store URL and store options this hook resolves to (connection or embedded default)."""
        try:
            conn = self.get_connection(self.meta_conn_id)
        except AirflowNotFoundException:
            return self._embedded()
        return self._from_connection(conn)

    async def aget_url(self) -> tuple[str, dict[str, float]]:
        """``get_url`` for the triggerer's event loop (connections must be fetched asynchronously there)."""
        try:
            conn = await self.aget_connection(self.meta_conn_id)
        except AirflowNotFoundException:
            return self._embedded()
        return self._from_connection(conn)

    def _embedded(self) -> tuple[str, dict[str, float]]:
        return embedded(self.meta_conn_id)

    def _from_connection(self, conn: Any) -> tuple[str, dict[str, float]]:
        return url_of_fields(self.meta_conn_id, conn.host, conn.password, conn.extra_dejson)

    # -- the store ---------------------------------------------------------------------------------

    def get_store(self) -> SqlSinkStateStore:
        """A store on the connection's database (migrations applied on first use in this process)."""
        url, options = self.get_url()
        return _open_store(url, options)

    async def aget_store(self) -> SqlSinkStateStore:
        """``get_store`` without blocking the event loop (the first use may run migrations)."""
        url, options = await self.aget_url()
        return await asyncio.to_thread(_open_store, url, options)

    def get_conn(self) -> SqlSinkStateStore:
        return self.get_store()

    def test_connection(self) -> tuple[bool, str]:
        """Open the store (which applies migrations) and read the database clock."""
        try:
            store = self.get_store()
            try:
                now = store.now()
            finally:
                store.dispose()
        except Exception as exc:  # the UI shows the message; any failure is "not usable"
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"Connected to {store.url_for_display}; database time {now.isoformat()}"


def _open_store(url: str, options: Mapping[str, float]) -> SqlSinkStateStore:
    from airflow_provider_exactly_once.hooks.orm_setup import configure_store_mappers

    configure_store_mappers()
    return connection_store(url, options)
