"""Fixtures of the meta-store tests: an open store per backend, and fresh databases for first-use tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from airflow_provider_exactly_once.store import SqlSinkStateStore


@pytest.fixture
def store(meta_url: str) -> Iterator[SqlSinkStateStore]:
    opened = SqlSinkStateStore(meta_url)
    yield opened
    opened.dispose()


@pytest.fixture
def fresh_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database nobody has opened yet: a new SQLite file, or a new PostgreSQL database."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    pg_url = str(request.getfixturevalue("pg_url"))
    name = f"eo_store_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield pg_url.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()
