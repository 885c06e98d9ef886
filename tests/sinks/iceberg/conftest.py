"""Fixtures of the Iceberg committer tests: a real pyiceberg SQL catalog on SQLite or PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from .iceberg_helpers import NAMESPACE

#: The commit paths run on ``main`` and on a named branch, as Flink's committer tests do: a marker walk
#: or an append that reads ``main`` instead of the configured branch must fail a test.
BRANCHES = ["main", "audit"]


@pytest.fixture(params=BRANCHES)
def branch(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def catalog(catalog_url: str, warehouse: Path) -> Iterator[SqlCatalog]:
    """A catalog of its own per test: tests sharing the session's PostgreSQL database never meet."""
    catalog = SqlCatalog(f"cat_{uuid.uuid4().hex[:10]}", uri=catalog_url, warehouse=f"file://{warehouse}")
    catalog.create_namespace(NAMESPACE)
    yield catalog
    catalog.engine.dispose()


# Object storage (tests/support/object_store.py): ``lake`` runs a test on the REST catalog of SeaweedFS
# and on Glue on moto, ``pipeline_s3`` is the coordinator's pipeline on it.
from tests.support.object_store import lake, pipeline_s3  # noqa: E402, F401
