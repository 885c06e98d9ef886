"""The meta store's URL and options from a connection's fields, without importing Airflow.

The hook (``meta_store.py``) and ``eo-sink``'s own reading of the connection
(``cli/meta_connection.py``, which must answer before Airflow could even be imported) turn the same
fields into the same store: one rule, kept here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.defaults import DEFAULT_META_CONN_ID

if TYPE_CHECKING:
    from airflow_provider_exactly_once.store import SqlSinkStateStore

META_CONN_TYPE = "exactly_once_meta"
#: Extra keys passed through to ``SqlSinkStateStore`` (seconds).
STORE_OPTIONS = ("connect_timeout_s", "busy_timeout_s")
#: ``SqlSinkStateStore``'s own defaults, for a connection that sets only one of the two.
_DEFAULT_CONNECT_TIMEOUT_S = 10.0
_DEFAULT_BUSY_TIMEOUT_S = 30.0

log = logging.getLogger(__name__)


def airflow_home() -> Path:
    """Airflow's home as Airflow computes it (``AIRFLOW_HOME``, else ``~/airflow``, variables expanded)."""
    return Path(expand(os.environ.get("AIRFLOW_HOME", "~/airflow")))


def expand(value: str) -> str:
    """Environment variables and ``~`` expanded until nothing changes, as Airflow's configuration does."""
    while True:
        expanded = os.path.expanduser(os.path.expandvars(value))
        if expanded == value:
            return expanded
        value = expanded


def embedded_meta_store_url() -> str:
    """The SQLite file used when the default connection does not exist: ``$AIRFLOW_HOME/exactly_once/meta.db``.

    Computed the way Airflow computes its home, so the scheduler's recovery DAG, the workers, the
    triggerer and ``eo-sink`` of a one-machine deployment agree.
    """
    return f"sqlite:///{airflow_home() / 'exactly_once' / 'meta.db'}"


def embedded(meta_conn_id: str) -> tuple[str, dict[str, float]]:
    """The embedded store, for the default id only: any other id that does not exist is a mistake to name."""
    if meta_conn_id != DEFAULT_META_CONN_ID:
        raise InvalidSinkConfig(
            f"meta store connection {meta_conn_id!r} does not exist; create it (type "
            f"{META_CONN_TYPE!r}) or use the default id {DEFAULT_META_CONN_ID!r} for the embedded SQLite store"
        )
    url = embedded_meta_store_url()
    Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    log.info("No connection %r: using the embedded meta store %s", meta_conn_id, url)
    return url, {}


def url_of_fields(
    meta_conn_id: str, host: str | None, password: str | None, extra: Mapping[str, Any] | None
) -> tuple[str, dict[str, float]]:
    """The store URL (with the password field's password when the URL has none) and the store
    options of the connection's extra."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    raw = (host or "").strip()
    if not raw:
        raise InvalidSinkConfig(
            f"meta store connection {meta_conn_id!r} has no SQLAlchemy URL (the host field), "
            "e.g. sqlite:////path/meta.db or postgresql+psycopg2://user@host:5432/db"
        )
    try:
        url = make_url(raw)
    except ArgumentError:
        raise InvalidSinkConfig(
            f"meta store connection {meta_conn_id!r}: {raw.split('@')[-1]!r} is not a SQLAlchemy URL"
        ) from None
    if password and url.password is None:
        url = url.set(password=password)
    options: dict[str, float] = {}
    for key in STORE_OPTIONS:
        if key in (extra or {}):
            value = (extra or {})[key]
            try:
                options[key] = float(value)
            except (TypeError, ValueError):
                raise InvalidSinkConfig(
                    f"meta store connection {meta_conn_id!r}: extra {key}={value!r} is not a number"
                ) from None
    log.info("Meta store of connection %r: %s", meta_conn_id, url.render_as_string(hide_password=True))
    return url.render_as_string(hide_password=False), options


def connection_store(url: str, options: Mapping[str, float]) -> SqlSinkStateStore:
    """The store of a connection's resolved URL and options."""
    from airflow_provider_exactly_once.store import SqlSinkStateStore

    if not any(key in options for key in STORE_OPTIONS):
        return SqlSinkStateStore(url)
    return SqlSinkStateStore(
        url,
        connect_timeout_s=options.get("connect_timeout_s", _DEFAULT_CONNECT_TIMEOUT_S),
        busy_timeout_s=options.get("busy_timeout_s", _DEFAULT_BUSY_TIMEOUT_S),
    )
