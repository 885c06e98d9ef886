"""The operations service against real stores, catalogs and files, reached through Airflow connections.

The service rebuilds each sink's coordinator as the recovery DAG does, through Airflow's connection
lookup (``AIRFLOW_CONN_<ID>`` variables here), so Airflow must be configured before it is imported:
tests/conftest.py points it at a private AIRFLOW_HOME first (and refuses if another home was set
first). No Airflow metadata database is needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.operations.helpers import ops_world
from tests.support.airflow_world import World


@pytest.fixture
def world(meta_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """An Iceberg sink registered in a meta store on the test's backend (SQLite file or PostgreSQL)."""
    w = ops_world(tmp_path, monkeypatch, meta_url)
    yield w
    w.dispose()
