"""Fixtures of the meta-store tests: an open store per backend, and fresh databases for first-use tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
    yield str(request.getfixturevalue("pg_database_url"))
