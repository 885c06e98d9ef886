"""Fixtures of the meta-store tests: an open store per backend, and fresh databases for first-use tests
(with an engine of their own, for looking at the tables as stored)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from airflow_provider_exactly_once.store import SqlSinkStateStore


def _opened(url: str) -> Iterator[SqlSinkStateStore]:
    opened = SqlSinkStateStore(url)
    yield opened
    opened.dispose()


@pytest.fixture
def store(meta_url: str) -> Iterator[SqlSinkStateStore]:
    yield from _opened(meta_url)


@pytest.fixture
def fresh_store(fresh_url: str) -> Iterator[SqlSinkStateStore]:
    """A store on a database of its own (``fresh_url``), which a test may change behind its back."""
    yield from _opened(fresh_url)


@pytest.fixture
def fresh_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database nobody has opened yet: a new SQLite file, or a new PostgreSQL database."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    yield str(request.getfixturevalue("pg_database_url"))


@pytest.fixture
def engine(fresh_url: str) -> Iterator[sa.Engine]:
    created = sa.create_engine(fresh_url)
    yield created
    created.dispose()
