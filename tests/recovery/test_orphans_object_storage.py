"""Orphaned write locations on S3 (D9), behind the REST catalog of SeaweedFS and behind Glue.

An object store has no directories: ``<data root>/_eo/<write_id>`` exists only while an object is
below it, its age is its objects' age, and the scan is a prefix listing. The scan must find an
orphan there, leave a live write and a young orphan alone, and the removal (through the clean-up
queue and the committer's checks, as recovery runs it) must leave nothing of the orphan behind.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from airflow_provider_exactly_once.core.cleanups import classify_orphans
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.ports import ORPHAN_EPOCH
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from airflow_provider_exactly_once.sinks.write_locations import IcebergWriteFolders
from tests.support.object_store import S3Pipeline


def test_an_orphan_on_s3_is_removed_after_its_grace_and_live_writes_are_not(
    pipeline_s3: S3Pipeline, sink_id: str
) -> None:
    pipeline = pipeline_s3
    pipeline.create_table("orders")
    table = f"{pipeline.namespace}.orders"
    sink = IcebergSinkConfig(sink_id=sink_id, tables=(table,))
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    committed = pipeline.write_iceberg(sink_id, 1, ["orders"])
    coordinator.persist(committed)
    pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
    coordinator.commit(sink_id, 1)
    pending = pipeline.write_iceberg(sink_id, 2, ["orders"], files=2)
    coordinator.persist(pending)  # live: waits for its checkpoint
    orphan = pipeline.write_iceberg(sink_id, 3, ["orders"], files=3)  # its task died before persist
    time.sleep(2.5)  # S3 dates objects to the second
    young = pipeline.write_iceberg(sink_id, 4, ["orders"])  # a write still in flight

    grace = timedelta(seconds=2)
    registry = pipeline.store.registry
    listing = IcebergWriteFolders(pipeline.catalog, sink.tables)
    old, kept = classify_orphans(sink_id, listing.folders(), registry, grace=grace, now=datetime.now(UTC))
    assert [c.write_id for c in old] == [orphan.write_id]
    assert [c.write_id for c in kept] == [young.write_id]
    assert old[0].age.files == 3 and old[0].locations[0].location == orphan.tables[0].location

    oldest = old[0].age.oldest
    assert oldest is not None
    registry.enqueue_orphan_cleanup(old[0].pre_commit(), reason="test: orphan", written_since=oldest)
    report = coordinator.clean_up(sink_id, ORPHAN_EPOCH)
    assert report.files_deleted == 3 and not report.failed
    assert pipeline.objects(orphan.tables[0].location) == []
    assert all(pipeline.write_exists(w) for w in (committed, pending, young))

    # The removed location is gone from the listing (no empty "folder" lingers), the others stay.
    later = datetime.now(UTC) + timedelta(hours=1)
    old, kept = classify_orphans(sink_id, listing.folders(), registry, grace=grace, now=later)
    assert [c.write_id for c in old] == [young.write_id] and kept == []
