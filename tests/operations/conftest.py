"""The operations service against real stores, catalogs and files, reached through Airflow connections.

The service rebuilds each sink's coordinator as the recovery DAG does, through Airflow's connection
lookup (``AIRFLOW_CONN_<ID>`` variables here), so Airflow must be configured before it is imported:
importing the Airflow suite's conftest points it at that suite's private AIRFLOW_HOME (and refuses
if another home was set first). No Airflow metadata database is needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.airflow.conftest  # noqa: F401  (sets AIRFLOW_HOME before anything imports Airflow)
from tests.airflow.harness import World
from tests.operations.helpers import ops_world


@pytest.fixture
def world(meta_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """An Iceberg sink registered in a meta store on the test's backend (SQLite file or PostgreSQL)."""
    w = ops_world(tmp_path, monkeypatch, meta_url)
    yield w
    w.dispose()
