"""Alembic environment of the meta store, shipped inside the package.

``SqlSinkStateStore`` runs it programmatically and hands over its own connection (already inside a
transaction and, on PostgreSQL, holding the migration advisory lock) through
``config.attributes["connection"]``. Run from the ``alembic`` command line instead, it connects to
``sqlalchemy.url`` itself, or renders SQL in offline mode.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from airflow_provider_exactly_once.store.models import VERSION_TABLE, Base

config = context.config


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    if context.is_offline_mode():
        context.configure(
            url=config.get_main_option("sqlalchemy.url"),
            target_metadata=Base.metadata,
            version_table=VERSION_TABLE,
            literal_binds=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    given = config.attributes.get("connection")
    if given is not None:
        _run(given)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("the exactly-once meta store migrations need a connection or sqlalchemy.url")
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            _run(connection)
    finally:
        engine.dispose()


_main()
