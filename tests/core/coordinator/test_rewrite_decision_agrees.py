"""The rewrite task's decision agrees with what it then does (issue 31): a decided upsert write whose
commit crashed after the table took it "conflicts" with its own snapshot, and giving it up as lost is
refused (a table shows it). The decision says so itself, pointing at the commit, instead of deciding
to give it up and meeting the abort's refusal.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import RewriteRefused
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.outcomes import CommitOutcome
from tests.support.faults import FaultSwitch
from tests.support.upsert_writer import keyed_pipeline, write_upsert

SINK = "rewrite-agrees"


def test_a_decided_write_the_table_shows_is_committed_not_written_again(tmp_path: Path) -> None:
    faults = FaultSwitch()
    pipeline = keyed_pipeline(tmp_path, faults)
    try:
        coordinator = pipeline.coordinator(SINK, pipeline.iceberg_committer())
        first = write_upsert(pipeline.catalog, "ns.t", SINK, 0, {k: "v0" for k in range(4)}, str(uuid.uuid4()))
        coordinator.persist(first)
        pipeline.checkpoint(SINK, 0, CheckpointStatus.COMPLETED)
        coordinator.commit(SINK, 0)
        pre = write_upsert(pipeline.catalog, "ns.t", SINK, 1, {1: "v1", 2: None}, str(uuid.uuid4()))
        coordinator.persist(pre)
        pipeline.checkpoint(SINK, 1, CheckpointStatus.COMPLETED)
        faults.crash_at("iceberg.after_catalog_update")  # the table took it; the row was not marked
        with pytest.raises(SimulatedCrash):
            coordinator.commit(SINK, 1)
        faults.disarm()
        snapshots = len(pipeline.catalog.load_table("ns.t").snapshots())

        with pytest.raises(RewriteRefused, match=r"table\(s\) ns.t show the commit of write .*eo-sink commit"):
            coordinator.prepare_rewrite(SINK, 1, run_writes=[pre.write_id])
        row = pipeline.store.get(SINK, 1)
        assert row is not None and row.status is EpochStatus.PENDING and row.commit_decided_at is not None
        assert len(pipeline.catalog.load_table("ns.t").snapshots()) == snapshots
        assert coordinator.commit(SINK, 1).outcome is CommitOutcome.COMMITTED  # what the refusal says to do
    finally:
        pipeline.dispose()
