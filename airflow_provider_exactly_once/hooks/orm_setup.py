"""SQLAlchemy mappers of ours and pyiceberg's, configured without Airflow's import of every Airflow model.

Airflow listens (``airflow.utils.orm_event_handlers``), once per process, for the first configuration
of any SQLAlchemy mapper, and then imports all of its own models so that their relationships
resolve: about 0.3 s. In a task process the first configuration is the meta store's first query, or
pyiceberg's SQL catalog's, so every persist, commit and abort task start paid for models it never
uses. Neither registry relates to Airflow's models, so each is configured alone: Airflow's listener
is set aside for that moment (``upstream_private.airflow_model_import_set_aside``) and put back for
the first configuration of Airflow's own mappers, which then imports them as before.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from airflow_provider_exactly_once.upstream_private import airflow_model_import_set_aside

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
