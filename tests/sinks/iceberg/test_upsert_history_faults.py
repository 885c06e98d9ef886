"""An upsert's check against the table (``sinks/iceberg/overwrites.py``) where the table holds what
pyiceberg itself never writes: delete files of another engine's merge-on-read, and a history whose
head names a parent that expiry removed (Java's and Spark's expiry keep such parent ids; pyiceberg's
own clears them)."""

from __future__ import annotations

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.typedef import Record

from airflow_provider_exactly_once.core.errors import UpsertConflict
from airflow_provider_exactly_once.sinks.iceberg.overwrites import files_to_rewrite, snapshots_since

from .iceberg_helpers import create_table, rows
from .test_iceberg_upserts import data_files, upsert


class _DeleteManifestWriter(ManifestWriterV2):
    def content(self) -> ManifestContent:
        return ManifestContent.DELETES


class _AddPositionDeletes(_FastAppendFiles):
    """A snapshot that adds one manifest of position deletes beside the existing manifests: what
    Spark's merge-on-read commits. Built by hand because pyiceberg 0.12 cannot write delete files;
    the delete file itself is never read (the check looks at the manifest list only), so it is not
    written either."""

    def _manifests(self) -> list[ManifestFile]:
        metadata = self._transaction.table_metadata
        delete_file = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path=f"{metadata.location}/data/deletes-{self._snapshot_id}.parquet",
            file_format=FileFormat.PARQUET,
            partition=Record(),
            record_count=1,
            file_size_in_bytes=100,
        )
        delete_file.spec_id = metadata.default_spec_id
        writer = _DeleteManifestWriter(
            metadata.spec(), metadata.schema(), self.new_manifest_output(), self._snapshot_id, self._compression
        )
        with writer:
            writer.add(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=self._snapshot_id,
                    sequence_number=None,
                    file_sequence_number=None,
                    data_file=delete_file,
                )
            )
        return [*self._existing_manifests(), writer.to_manifest_file()]


def _add_position_deletes(table: Table) -> Table:
    with table.transaction() as tx:
        _AddPositionDeletes(operation=Operation.OVERWRITE, transaction=tx, io=table.io).commit()
    table = table.refresh()
    head = table.current_snapshot()
    assert head is not None
    assert [m.content for m in head.manifests(table.io)] == [ManifestContent.DATA, ManifestContent.DELETES]
    return table


def test_delete_files_added_since_the_read_refuse_the_upsert(catalog: SqlCatalog) -> None:
    table = create_table(catalog, "deletes_after")
    table.append(rows(0, 10))
    read = table.metadata.current_snapshot_id
    (path,) = data_files(table)
    pre = upsert("deletes_after", read, [path], 3, 4)

    table = _add_position_deletes(table)

    with pytest.raises(UpsertConflict, match="delete files were added since the write's read"):
        files_to_rewrite(table, "main", pre, pre.tables[0])


def test_delete_files_the_read_already_saw_do_not_refuse_the_upsert(catalog: SqlCatalog) -> None:
    table = create_table(catalog, "deletes_before")
    table.append(rows(0, 10))
    (path,) = data_files(table)
    table = _add_position_deletes(table)
    pre = upsert("deletes_before", table.metadata.current_snapshot_id, [path], 3, 4)

    assert [f.file_path for f in files_to_rewrite(table, "main", pre, pre.tables[0])] == [path]


def test_a_head_whose_parent_expired_cannot_tell_whether_the_read_is_an_ancestor(catalog: SqlCatalog) -> None:
    """Snapshots read <- expired <- head, with ``expired`` gone from the metadata but still named as
    the head's parent: what the expired snapshot added cannot be looked at, so the upsert is refused."""
    table = create_table(catalog, "expired")
    table.append(rows(0, 10))
    read = table.metadata.current_snapshot_id
    (path,) = data_files(table)
    table.append(rows(3, 1))  # id 3, inside the epoch's range, added by the snapshot that expires
    expired = table.metadata.current_snapshot_id
    table.append(rows(100, 1))
    head = table.metadata.current_snapshot_id
    assert read is not None and head is not None
    metadata = table.metadata.model_copy(
        update={"snapshots": [s for s in table.metadata.snapshots if s.snapshot_id != expired]}
    )
    assert metadata.snapshot_by_id(head).parent_snapshot_id == expired  # type: ignore[union-attr]
    as_java_left_it = Table(table.name(), metadata, table.metadata_location, table.io, catalog)
    pre = upsert("expired", read, [path], 3, 4)

    assert snapshots_since(metadata, head, read) is None
    with pytest.raises(UpsertConflict, match="is no longer an ancestor of the head"):
        files_to_rewrite(as_java_left_it, "main", pre, pre.tables[0])
