"""Pins down that SeaweedFS's table buckets do not rewrite a table behind the committer's back.

SeaweedFS 4.x ships an ``iceberg_maintenance`` job for its plugin workers (compact, expire_snapshots,
remove_orphans, rewrite_manifests; by default expiry is considered once a table has more than 5
snapshots, keeping every snapshot younger than 168 h, and orphan removal deletes unreferenced files
under ``data/`` older than 72 h). Its job runs only where an admin server schedules it to a worker;
``weed mini`` as ``demo.servers.SeaweedFS`` starts it has none that reaches the admin. What the
committer relies on is checked here: after more commits than that threshold, every snapshot, marker
and data file is still the committer's, and every commit stays idempotent. A server-side rewrite
(a compaction snapshot, an expired marker, a deleted file) fails this test; docs/deployment.md says
how to keep it away from the tables of a sink on a full SeaweedFS deployment.
"""

from __future__ import annotations

import time
from pathlib import Path

from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.outcomes import CommitOutcome
from demo.servers import SeaweedFS
from tests.support.independent_reader import read_rows
from tests.support.object_store import s3_pipeline, seaweed_lake

#: More than the 5 snapshots at which SeaweedFS's maintenance looks at a table.
COMMITS = 7


def test_repeated_commits_are_left_exactly_as_committed(
    seaweed: SeaweedFS, tmp_path: Path, sink_id: str, unique: str
) -> None:
    pipeline = s3_pipeline(seaweed_lake(seaweed, f"eo_{unique}"), tmp_path)
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    writes = []
    for epoch in range(1, COMMITS + 1):
        pre = pipeline.write_iceberg(sink_id, epoch, ["orders"], rows=2)
        coordinator.persist(pre)
        pipeline.checkpoint(sink_id, epoch, CheckpointStatus.COMPLETED)
        assert coordinator.commit(sink_id, epoch).outcome is CommitOutcome.COMMITTED
        writes.append(pre)
    time.sleep(3)  # room for anything the server would do right after a commit

    name = f"{pipeline.namespace}.orders"
    table = pipeline.catalog.load_table(name)
    snapshots = table.snapshots()
    assert len(snapshots) == COMMITS
    assert all(s.summary is not None and s.summary.operation.value == "append" for s in snapshots)
    assert pipeline.marker_snapshots("orders", sink_id) == {p.epoch: [p.write_id] for p in writes}
    assert all(pipeline.write_exists(p) for p in writes)
    assert sorted(read_rows(table, "id, epoch, write_id")) == pipeline.expected_rows(writes, name)
    for pre in writes:  # every marker still answers for its epoch
        assert coordinator.commit(sink_id, pre.epoch).outcome is CommitOutcome.ALREADY_COMMITTED
    assert len(pipeline.catalog.load_table(name).snapshots()) == COMMITS
    pipeline.dispose()
