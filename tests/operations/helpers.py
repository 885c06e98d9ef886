"""Building sinks and epochs for the operations and CLI suites, and reading their whole state back."""

from __future__ import annotations

import json
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.config import SinkConfig
from tests.support.airflow_world import TABLE, World
from tests.support.pipeline import write_location_exists


def ops_world(tmp: Path, monkeypatch: pytest.MonkeyPatch, meta_url: str) -> World:
    world = World.create(tmp, monkeypatch, meta_url=meta_url)
    register(world, world.iceberg_sink())
    return world


def register(world: World, sink: SinkConfig) -> None:
    """As the epoch operators register a sink on first use."""
    world.pipeline.store.registry.register_sink(sink.sink_id, sink.to_dict(), MetaStoreCheckpoint().to_dict())


def dead_catalog(monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    """A connection to a PostgreSQL catalog on a port nothing listens on, its password planted."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conn_id = f"iceberg_down_{uuid.uuid4().hex[:8]}"
    uri = f"postgresql+psycopg2://eo:Planted-pw@127.0.0.1:{port}/catalog"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "iceberg", "extra": {"type": "sql", "uri": uri}})
    )
    return conn_id, port


def coordinator(world: World) -> TwoPhaseCommitCoordinator:
    """A coordinator of the world's Iceberg sink, to drive epochs into the states a test needs."""
    return world.pipeline.coordinator(world.sink_id, world.pipeline.iceberg_committer())


def write(world: World, epoch: int, rows: int = 5) -> PreCommit:
    return world.pipeline.write_iceberg(world.sink_id, epoch, [TABLE], rows)


@dataclass(frozen=True)
class State:
    """Everything an action could change: rows, open clean-ups, snapshots, and which writes' files exist."""

    rows: dict[int, tuple[str, str, Any, Any]]
    cleanups: list[tuple[int, str]]
    snapshots: list[int]
    files: dict[str, bool]


def state(world: World, sink_id: str, epochs: list[int], writes: list[PreCommit]) -> State:
    store = world.pipeline.store
    rows = {}
    for epoch in epochs:
        row = store.get(sink_id, epoch)
        if row is not None:
            rows[epoch] = (row.status.value, row.write_id, row.commit_decided_at, row.updated_at)
    table = world.pipeline.catalog.load_table(world.table)
    return State(
        rows=rows,
        cleanups=sorted((t.id, t.write_id) for t in store.cleanups(sink_id)),
        snapshots=sorted(s.snapshot_id for s in table.snapshots()),
        files={w.write_id: write_location_exists(w) for w in writes},
    )
