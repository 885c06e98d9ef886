"""``coordinator_for`` arms ``EXACTLY_ONCE_FAULT`` in the coordinator and the committer it builds,
so an operator task dies at the named point; the next attempt, without the fault, finishes the
epoch once. Real meta store (SQLite) and a real file sink."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.status import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.runtime.assembly import coordinator_for
from airflow_provider_exactly_once.runtime.faults import FAULT_ENV_VAR
from airflow_provider_exactly_once.sinks.config import FileSinkConfig
from tests.support.pipeline import Pipeline

EPOCH = 1714521600000


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    (tmp_path / "warehouse").mkdir()
    return Pipeline(
        meta_url=f"sqlite:///{tmp_path / 'meta.db'}",
        catalog_url=f"sqlite:///{tmp_path / 'catalog.db'}",
        warehouse=tmp_path / "warehouse",
        catalog_name="c",
        namespace="ns",
    )


def final_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet") if "_staging" not in p.parts)


def test_crash_between_the_visible_commit_and_the_mark(
    pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "sink"
    sink = FileSinkConfig(f"s-{uuid.uuid4().hex[:6]}", str(root))
    pre = pipeline.write_files(sink.sink_id, EPOCH, root, rows=7)
    pipeline.checkpoint(sink.sink_id, EPOCH, CheckpointStatus.COMPLETED)

    monkeypatch.setenv(FAULT_ENV_VAR, "commit.visible:crash")
    crashing = coordinator_for(sink, MetaStoreCheckpoint(), store=pipeline.store)
    crashing.persist(pre)
    with pytest.raises(SimulatedCrash, match=r"commit\.visible"):
        crashing.commit(sink.sink_id, EPOCH)
    row = pipeline.store.get(sink.sink_id, EPOCH)
    assert row is not None and row.status is EpochStatus.PENDING and row.commit_decided_at is not None
    visible = final_files(root)
    assert len(visible) == 2  # the files are in place: the crash came after the sink commit

    monkeypatch.delenv(FAULT_ENV_VAR)
    coordinator_for(sink, MetaStoreCheckpoint(), store=pipeline.store).commit(sink.sink_id, EPOCH)
    row = pipeline.store.get(sink.sink_id, EPOCH)
    assert row is not None and row.status is EpochStatus.COMMITTED
    assert final_files(root) == visible  # finished, not moved or written twice


def test_the_committer_gets_the_same_hook(pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``files.before_move`` is the file committer's own point: reaching it proves the hook was passed."""
    root = tmp_path / "sink"
    sink = FileSinkConfig(f"s-{uuid.uuid4().hex[:6]}", str(root))
    pre = pipeline.write_files(sink.sink_id, EPOCH, root, rows=3)
    pipeline.checkpoint(sink.sink_id, EPOCH, CheckpointStatus.COMPLETED)
    monkeypatch.setenv(FAULT_ENV_VAR, "files.before_move@2")
    coordinator = coordinator_for(sink, MetaStoreCheckpoint(), store=pipeline.store)
    coordinator.persist(pre)
    with pytest.raises(SimulatedCrash, match=r"files.before_move \(#2\)"):
        coordinator.commit(sink.sink_id, EPOCH)
    assert len(final_files(root)) == 1  # the first move happened, the second did not


def test_a_malformed_fault_fails_the_task_loudly(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV_VAR, "commit.visible:sometimes")
    with pytest.raises(ValueError, match=FAULT_ENV_VAR):
        coordinator_for(FileSinkConfig("s", "/tmp/x"), MetaStoreCheckpoint(), store=pipeline.store)
