"""An upsert epoch crashed at every step of persist and commit, then settled by recovery: the
table equals the model (the earlier epoch's rows with this epoch's changes applied once), one
marked snapshot for the epoch, the rewritten files removed from the table and nothing left over."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.sinks.iceberg.prepared_manifests import MANIFEST_FOLDER
from tests.core.coordinator.test_crash_recovery import COMMIT_POINTS
from tests.support.faults import FaultSwitch
from tests.support.pipeline import local_path
from tests.support.upsert_writer import keyed_pipeline, write_upsert

SINK = "upsert-crashes"
STEPS = ["persist.staged", "persist.inserted", *COMMIT_POINTS]


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_then_recovery_applies_the_epoch_once(tmp_path: Path, step: str) -> None:
    faults = FaultSwitch()
    pipeline = keyed_pipeline(tmp_path, faults)
    try:
        coordinator = pipeline.coordinator(SINK, pipeline.iceberg_committer())
        first = write_upsert(pipeline.catalog, "ns.t", SINK, 0, {k: "v0" for k in range(6)}, str(uuid.uuid4()))
        coordinator.persist(first)
        pipeline.checkpoint(SINK, 0, CheckpointStatus.COMPLETED)
        coordinator.commit(SINK, 0)

        changes = {1: "v1", 2: None, 9: "new", 11: None}
        pre = write_upsert(pipeline.catalog, "ns.t", SINK, 1, changes, str(uuid.uuid4()))
        assert pre.tables[0].rewritten, "the epoch rewrites the first epoch's file"
        pipeline.checkpoint(SINK, 1, CheckpointStatus.COMPLETED)
        faults.crash_at(step)
        with pytest.raises(SimulatedCrash):
            coordinator.persist(pre)
            coordinator.commit(SINK, 1)
        faults.disarm()
        if pipeline.store.get(SINK, 1) is None:
            coordinator.persist(pre)  # the crash was before the row existed: the task's retry persists
        report = coordinator.recover(SINK)
        assert report.ok, report.failed

        row = pipeline.store.get(SINK, 1)
        assert row is not None and row.status is EpochStatus.COMMITTED
        table = pipeline.catalog.load_table("ns.t")
        shown = {r["id"]: r["value"] for r in table.scan().to_arrow().to_pylist()}
        assert shown == {0: "v0", 1: "v1", 3: "v0", 4: "v0", 5: "v0", 9: "new"}
        assert list(pipeline.marker_snapshots("t", SINK)) == [0, 1]
        assert all(len(ids) == 1 for ids in pipeline.marker_snapshots("t", SINK).values())
        live = {t.file.file_path for t in table.scan().plan_files()}
        assert not live & {r.path for r in pre.tables[0].rewritten}
        assert list(pipeline.store.cleanups(SINK)) == []
        prepared = row.pre_commit.tables[0].prepared  # its manifests were written at persist
        assert prepared is not None and prepared.snapshot_id == int((row.committed or {})["ns.t"])
        folder = Path(local_path(pre.tables[0].location)) / MANIFEST_FOLDER / pre.write_id
        recorded = {Path(local_path(m.path)).name for m in prepared.manifests if not m.lists_other_writes}
        assert {p.name for p in folder.iterdir()} == recorded  # a killed attempt's staging is gone
    finally:
        pipeline.dispose()
