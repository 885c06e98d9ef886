"""The meta store as an Airflow connection of this package's own type (``exactly_once_meta``; design.md
D20), and the SQLAlchemy mappers of ours and pyiceberg's SQL catalog configured without Airflow's
import of every Airflow model, which a task start would otherwise pay for at its first query.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.defaults import DEFAULT_META_CONN_ID
from airflow_provider_exactly_once.get_provider_info import META_STORE_FIELD_BEHAVIOUR
from airflow_provider_exactly_once.upstream_private import airflow_model_import_set_aside
from airflow_provider_exactly_once.version_compat import AirflowNotFoundException

if TYPE_CHECKING:
    from airflow_provider_exactly_once.store import SqlSinkStateStore


# The meta store as an Airflow connection, and the coordinator of one sink built from connections.
#
# Tasks in Airflow 3 may not touch Airflow's own metadata database, so the meta store
# (``pending_sink_state`` and its companions) is reached through a connection of this package's own
# type, ``exactly_once_meta``: its *SQLAlchemy URL* field names a SQLite file or a PostgreSQL
# database. A deployment that never creates the default connection still works on one machine: the
# hook then falls back to an embedded SQLite file under ``$AIRFLOW_HOME`` and says so in the log.
# ``eo-sink`` opens the meta store through this hook too (docs/design.md, D20).

__all__ = ["META_CONN_TYPE", "ExactlyOnceMetaStoreHook", "embedded_meta_store_url"]

META_CONN_TYPE = "exactly_once_meta"
#: Extra keys passed through to ``SqlSinkStateStore`` (seconds).
STORE_OPTIONS = ("connect_timeout_s", "busy_timeout_s")
#: ``SqlSinkStateStore``'s own defaults, for a connection that sets only one of the two.
_DEFAULT_CONNECT_TIMEOUT_S = 10.0
_DEFAULT_BUSY_TIMEOUT_S = 30.0

log = logging.getLogger(__name__)


def embedded_meta_store_url() -> str:
    """The SQLite file used when the default connection does not exist: ``$AIRFLOW_HOME/exactly_once/meta.db``.

    Computed the way Airflow computes its home (``AIRFLOW_HOME``, else ``~/airflow``, variables
    expanded until nothing changes), so the scheduler's recovery DAG, the workers, the triggerer and
    ``eo-sink`` of a one-machine deployment agree.
    """
    home = os.environ.get("AIRFLOW_HOME", "~/airflow")
    while (expanded := os.path.expanduser(os.path.expandvars(home))) != home:
        home = expanded
    return f"sqlite:///{Path(home) / 'exactly_once' / 'meta.db'}"


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
        """The embedded store, for the default id only: any other id that does not exist is a mistake to name."""
        if self.meta_conn_id != DEFAULT_META_CONN_ID:
            raise InvalidSinkConfig(
                f"meta store connection {self.meta_conn_id!r} does not exist; create it (type "
                f"{META_CONN_TYPE!r}) or use the default id {DEFAULT_META_CONN_ID!r} for the embedded SQLite store"
            )
        url = embedded_meta_store_url()
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        log.info("No connection %r: using the embedded meta store %s", self.meta_conn_id, url)
        return url, {}

    def _from_connection(self, conn: Any) -> tuple[str, dict[str, float]]:
        """The store URL (with the password field's password when the URL has none) and the store
        options of the connection's extra."""
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        raw = (conn.host or "").strip()
        if not raw:
            raise InvalidSinkConfig(
                f"meta store connection {self.meta_conn_id!r} has no SQLAlchemy URL (the host field), "
                "e.g. sqlite:////path/meta.db or postgresql+psycopg2://user@host:5432/db"
            )
        try:
            url = make_url(raw)
        except ArgumentError:
            raise InvalidSinkConfig(
                f"meta store connection {self.meta_conn_id!r}: {raw.split('@')[-1]!r} is not a SQLAlchemy URL"
            ) from None
        if conn.password and url.password is None:
            url = url.set(password=conn.password)
        extra = conn.extra_dejson
        options: dict[str, float] = {}
        for key in STORE_OPTIONS:
            if key in extra:
                try:
                    options[key] = float(extra[key])
                except (TypeError, ValueError):
                    raise InvalidSinkConfig(
                        f"meta store connection {self.meta_conn_id!r}: extra {key}={extra[key]!r} is not a number"
                    ) from None
        log.info("Meta store of connection %r: %s", self.meta_conn_id, url.render_as_string(hide_password=True))
        return url.render_as_string(hide_password=False), options

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
    from airflow_provider_exactly_once.store import SqlSinkStateStore

    configure_store_mappers()
    if not any(key in options for key in STORE_OPTIONS):
        return SqlSinkStateStore(url)
    return SqlSinkStateStore(
        url,
        connect_timeout_s=options.get("connect_timeout_s", _DEFAULT_CONNECT_TIMEOUT_S),
        busy_timeout_s=options.get("busy_timeout_s", _DEFAULT_BUSY_TIMEOUT_S),
    )


# SQLAlchemy mappers of ours and pyiceberg's, configured without Airflow's import of every Airflow model.
#
# Airflow listens (``airflow.utils.orm_event_handlers``), once per process, for the first configuration
# of any SQLAlchemy mapper, and then imports all of its own models so that their relationships
# resolve: about 0.3 s. In a task process the first configuration is the meta store's first query, or
# pyiceberg's SQL catalog's, so every persist, commit and abort task start paid for models it never
# uses. Neither registry relates to Airflow's models, so each is configured alone: Airflow's listener
# is set aside for that moment (``upstream_private.airflow_model_import_set_aside``) and put back for
# the first configuration of Airflow's own mappers, which then imports them as before.

_lock = threading.Lock()
_configured: set[int] = set()


def configure_alone(registry: Any) -> None:
    """Configure ``registry``'s mappers now (once per process), without firing Airflow's listener.

    ``registry``: a SQLAlchemy ``registry`` whose mappers have no relationship to Airflow's.
    """
    if id(registry) in _configured:
        return
    with _lock:
        if id(registry) in _configured:
            return
        with airflow_model_import_set_aside():
            registry.configure()
        _configured.add(id(registry))


def configure_store_mappers() -> None:
    """The meta store's mappers."""
    from airflow_provider_exactly_once.store.models import Base

    configure_alone(Base.registry)


def configure_catalog_mappers(catalog: object) -> None:
    """pyiceberg's SQL catalog's mappers, when ``catalog`` is one (other catalogs have none; a SQL
    catalog has imported its module, so another kind of catalog imports nothing here)."""
    sql = sys.modules.get("pyiceberg.catalog.sql")
    if sql is not None and isinstance(catalog, sql.SqlCatalog):
        configure_alone(sql.SqlCatalogBaseTable.registry)
