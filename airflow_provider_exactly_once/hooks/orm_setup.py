"""The meta store's SQLAlchemy mappers, configured without Airflow's import of every Airflow model.

Airflow listens (``airflow.utils.orm_event_handlers``), once per process, for the first configuration
of any SQLAlchemy mapper, and then imports all of its own models so that their relationships
resolve: about 0.3 s. In a task process the meta store's first query is that first configuration,
so every persist, commit and abort task start paid for models the task never uses. The store's
mappers relate to none of Airflow's, so they are configured alone: Airflow's listener is set aside
for that moment and put back for the first configuration of Airflow's own mappers, which then
imports them as before. Where Airflow has no such listener, this is a plain configuration.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_configured = False


def configure_store_mappers() -> None:
    """Configure the store's mappers now (once per process), without firing Airflow's listener."""
    global _configured
    if _configured:
        return
    with _lock:
        if _configured:
            return
        from sqlalchemy import event
        from sqlalchemy.orm import Mapper

        from airflow_provider_exactly_once.store.models import Base

        try:
            from airflow.models import import_all_models
        except ImportError:  # pragma: no cover - an Airflow without it
            Base.registry.configure()
        else:
            if event.contains(Mapper, "before_configured", import_all_models):
                event.remove(Mapper, "before_configured", import_all_models)
                try:
                    Base.registry.configure()
                finally:
                    event.listen(Mapper, "before_configured", import_all_models, once=True)
            else:
                Base.registry.configure()
        _configured = True
