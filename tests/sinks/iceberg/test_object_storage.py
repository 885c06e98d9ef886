"""The whole life of an epoch with its files on S3, behind the REST catalog of SeaweedFS and behind
AWS Glue (moto): the coordinator and the Iceberg committer as production runs them, judged by
DuckDB reading the table's metadata from S3 (``tests.support.independent_reader``).

Local tables hide what object storage changes: paths are URLs that need the catalog's credentials,
listings are prefix listings, a deleted write leaves no folder behind, and the catalog is a server.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import SinkUnavailable
from airflow_provider_exactly_once.core.outcomes import AbortOutcome, CommitOutcome
from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.iceberg.catalog_access import (
    missing_files,
    missing_in_locations,
    unavailable_when_unreachable,
)
from tests.support.independent_reader import read_rows
from tests.support.object_store import S3Pipeline

COMPLETED, FAILED = CheckpointStatus.COMPLETED, CheckpointStatus.FAILED
G1 = "2024-06-01T01:00:00.000000Z/0000000000"
G2 = "2024-06-02T09:30:00.000000Z/0000000001"


def shown(pipeline: S3Pipeline, name: str, snapshot_id: int | None = None) -> list[tuple[int, int, str]]:
    table = pipeline.catalog.load_table(f"{pipeline.namespace}.{name}")
    return sorted(read_rows(table, "id, epoch, write_id", snapshot_id=snapshot_id))


def test_an_epoch_is_committed_once_with_its_files_on_s3(pipeline_s3: S3Pipeline, sink_id: str) -> None:
    pipeline = pipeline_s3
    pipeline.create_table("orders")
    committer = pipeline.iceberg_committer()
    coordinator = pipeline.coordinator(sink_id, committer)
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"], rows=7, files=3)
    assert all(d.path.startswith("s3://") for d in pre.tables[0].data_files)
    assert pipeline.lake is not None
    assert type(pipeline.catalog.load_table(pre.tables[0].table).io).__name__ == pipeline.lake.file_io

    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 1, COMPLETED)
    result = coordinator.commit(sink_id, 1)
    assert result.outcome is CommitOutcome.COMMITTED
    assert shown(pipeline, "orders") == pipeline.expected_rows([pre], pre.tables[0].table)

    # A retry of the commit, by the coordinator and by the committer itself on an unprepared plan (a
    # decided commit resumed by recovery): both find the marker, neither commits again.
    assert coordinator.commit(sink_id, 1).outcome is CommitOutcome.ALREADY_COMMITTED
    row = pipeline.store.get(sink_id, 1)
    assert row is not None and row.status is EpochStatus.COMMITTED
    again = committer.commit(CommitPlan(pre, None), row.created_at)
    assert again == row.committed
    assert pipeline.marker_snapshots("orders", sink_id) == {1: [pre.write_id]}
    assert len(pipeline.catalog.load_table(f"{pipeline.namespace}.orders").metadata.snapshots) == 1
    assert pipeline.write_exists(pre)  # committed files stay where they were written


def test_an_abort_deletes_exactly_the_writes_objects(pipeline_s3: S3Pipeline, sink_id: str) -> None:
    pipeline = pipeline_s3
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    kept = pipeline.write_iceberg(sink_id, 1, ["orders"], rows=3)
    coordinator.persist(kept)
    pipeline.checkpoint(sink_id, 1, COMPLETED)
    coordinator.commit(sink_id, 1)

    dropped = pipeline.write_iceberg(sink_id, 2, ["orders"], rows=4, files=2)
    coordinator.persist(dropped)
    pipeline.checkpoint(sink_id, 2, FAILED)
    result = coordinator.abort(sink_id, 2, reason="checkpoint failed")
    assert result.outcome is AbortOutcome.ABORTED and result.files_deleted == 3  # and persist's manifest
    assert pipeline.objects(dropped.tables[0].location) == []
    # the committed write's objects and the table's own metadata are untouched
    assert len(pipeline.objects(kept.tables[0].location)) == 2  # its data file and persist's manifest
    assert shown(pipeline, "orders") == pipeline.expected_rows([kept], kept.tables[0].table)
    table = pipeline.catalog.load_table(f"{pipeline.namespace}.orders")
    assert pipeline.objects(table.metadata_location)


def _generation(pre: PreCommit, value: str) -> PreCommit:
    return pre.model_copy(update={"generation": value})


def test_a_revision_replaces_the_write_in_one_overwrite_snapshot(pipeline_s3: S3Pipeline, sink_id: str) -> None:
    pipeline = pipeline_s3
    pipeline.create_table("orders")
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(), on_reprocess={sink_id: "replace"})
    first = _generation(pipeline.write_iceberg(sink_id, 1, ["orders"], rows=4, files=2), G1)
    other = _generation(pipeline.write_iceberg(sink_id, 2, ["orders"], rows=2), G1)
    for pre in (first, other):
        coordinator.persist(pre)
        pipeline.checkpoint(sink_id, pre.epoch, COMPLETED)
        coordinator.commit(sink_id, pre.epoch)

    second = _generation(pipeline.write_iceberg(sink_id, 1, ["orders"], rows=5, files=2), G2)
    assert coordinator.persist(second).record.revision == 1
    result = coordinator.commit(sink_id, 1)
    assert result.outcome is CommitOutcome.COMMITTED and result.record.revision == 1

    table = pipeline.catalog.load_table(f"{pipeline.namespace}.orders")
    name = f"{pipeline.namespace}.orders"
    assert result.record.committed is not None
    replacement = table.snapshot_by_id(int(result.record.committed[name]))
    assert replacement is not None and replacement.summary is not None
    assert replacement.summary.operation.value == "overwrite"
    summary = replacement.summary.additional_properties
    assert (summary["deleted-data-files"], summary["added-data-files"]) == ("2", "2")
    # In every snapshot, as DuckDB reads them from S3, each epoch shows the rows of one write only.
    for snapshot in table.snapshots():
        writes: dict[int, set[str]] = {}
        for _, epoch, write_id in shown(pipeline, "orders", snapshot.snapshot_id):
            writes.setdefault(epoch, set()).add(write_id)
        assert all(len(ids) == 1 for ids in writes.values()), writes
    assert shown(pipeline, "orders") == pipeline.expected_rows([second, other], name)
    # D12: the replaced objects stay while an older snapshot lists them
    assert pipeline.write_exists(first)
    assert coordinator.clean_up(sink_id).files_deleted == 0 and pipeline.write_exists(first)


def test_storage_errors_reach_the_coordinator_retryable_and_without_the_connections_secrets() -> None:
    """Driver errors can quote an endpoint URL or a setting; the message goes to logs and the UI."""
    properties = {
        "s3.secret-access-key": "s3-secret-value",
        "credential": "client-id:client-secret-value",
        "s3.access-key-id": "visible-key-id",
    }
    failure = OSError(
        "HeadObject failed at http://user:pw-in-url@127.0.0.1:9/b with s3-secret-value, token client-secret-value"
    )
    with pytest.raises(SinkUnavailable) as caught, unavailable_when_unreachable("checking files", properties):
        raise failure
    message = str(caught.value)
    assert caught.value.retryable and caught.value.__cause__ is failure
    for secret in ("s3-secret-value", "client-secret-value", "pw-in-url"):
        assert secret not in message
    assert message.startswith("checking files: OSError: HeadObject failed at http://user:***@127.0.0.1:9/b with ***")


def test_missing_files_lists_the_write_location_once_and_asks_only_for_what_it_did_not_see(
    pipeline_s3: S3Pipeline, sink_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One prefix listing instead of a request per file, with the same answer: present files found,
    a deleted one missing, a path outside the location and a location that is not there checked one
    by one."""
    pipeline = pipeline_s3
    pipeline.create_table("orders")
    pre = pipeline.write_iceberg(sink_id, 1, ["orders"], rows=6, files=3)
    [write] = pre.tables
    paths = [d.path for d in write.data_files]
    table = pipeline.catalog.load_table(f"{pipeline.namespace}.orders")
    asked: list[str] = []
    real_new_input = type(table.io).new_input

    def counted(self: Any, location: str) -> Any:
        asked.append(location)
        return real_new_input(self, location)

    monkeypatch.setattr(type(table.io), "new_input", counted)
    assert missing_files(table.io, paths, under=write.location) == []
    assert asked == []  # every file was in the listing

    pipeline.lake.filesystem().rm_file(paths[1])  # type: ignore[union-attr]
    outside = f"{write.location}-elsewhere/part-0.parquet"
    assert missing_files(table.io, [*paths, outside], under=write.location) == [paths[1], outside]
    assert sorted(asked) == sorted([paths[1], outside])

    asked.clear()
    assert missing_files(table.io, paths, under=f"{write.location}-not-there") == [paths[1]]
    assert sorted(asked) == sorted(paths)


def test_the_check_of_a_fresh_write_asks_for_its_manifest_once_and_finds_it_gone_or_cut(
    pipeline_s3: S3Pipeline, sink_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 59: the commit task's check of a fresh epoch is one request for the manifest persist
    wrote (a HEAD on S3, through each lake's FileIO), not a listing of the data files: a data file
    deleted alone goes unseen there and is found by the check of every file; a manifest deleted or
    of another length is named."""
    pipeline = pipeline_s3
    pipeline.create_table("orders")
    committer = pipeline.iceberg_committer()
    pre = committer.stage(committer.prepare(pipeline.write_iceberg(sink_id, 1, ["orders"], rows=6, files=3)))
    [write] = pre.tables
    assert write.prepared is not None
    [manifest] = write.prepared.manifests
    assert manifest.path.startswith(f"{write.location}/")
    table = pipeline.catalog.load_table(write.table)
    loaded = [(write, table)]
    asked: list[str] = []
    real_new_input = type(table.io).new_input

    def counted(self: Any, location: str) -> Any:
        asked.append(location)
        return real_new_input(self, location)

    monkeypatch.setattr(type(table.io), "new_input", counted)
    assert missing_in_locations(pre, loaded, every_file=False) == []
    assert asked == [manifest.path]

    storage = pipeline.lake.filesystem()  # type: ignore[union-attr]
    gone = write.data_files[0].path
    storage.rm_file(gone)
    assert missing_in_locations(pre, loaded, every_file=False) == []  # unseen: the manifest stands
    assert missing_in_locations(pre, loaded) == [gone]
    cut = write.model_copy(
        update={
            "prepared": write.prepared.model_copy(
                update={"manifests": [manifest.model_copy(update={"length": manifest.length + 1})]}
            )
        }
    )
    assert missing_in_locations(pre, [(cut, table)], every_file=False) == [manifest.path]
    storage.rm_file(manifest.path)
    assert missing_in_locations(pre, loaded, every_file=False) == [manifest.path]
