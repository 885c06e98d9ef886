"""One epoch's snapshot of one table: staged in one transaction, committed at most once.

The committer (``committer.py``) decides whether a table takes a snapshot and retries conflicts; this
module is what the snapshot consists of (design.md section 5, steps 3, 6 and 7): the columns the write
adds, an upsert's identifier fields, a name mapping for a table without one, the data files built from
the writers' descriptors under the spec they were written for, and the marker in the summary, as an
append, or as an overwrite that removes exactly the files a revision or an upsert replaces.
"""

from __future__ import annotations

from collections.abc import Callable

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties

from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_files
from airflow_provider_exactly_once.sinks.iceberg.markers import marker_properties
from airflow_provider_exactly_once.sinks.iceberg.schema_check import ColumnToAdd, check_added_field_ids
from airflow_provider_exactly_once.sinks.iceberg.transaction import (
    SinkTransaction,
    SpecAwareFastAppend,
    SpecAwareOverwrite,
)
from airflow_provider_exactly_once.sinks.iceberg.upsert_commits import identifier_update
from airflow_provider_exactly_once.sinks.iceberg.write_check import write_spec


def commit_snapshot(
    pre_commit: PreCommit,
    write: TableWrite,
    table: Table,
    to_add: list[ColumnToAdd],
    revision: tuple[int, list[DataFile]] | None,
    *,
    branch: str,
    fault: Callable[[str], None],
) -> int:
    """Stage schema changes, name mapping and the marked snapshot in one transaction; commit it once.

    A revision (its number and the replaced files), or an upsert (revision 0 and the files it
    rewrote), makes the snapshot an overwrite that removes exactly those files in the same step as it
    adds the new ones. An upsert's key becomes the table's identifier fields when the table has none
    and its columns allow it. The snapshot's id; ``SinkCommitConflict`` when the table moved.
    """
    tx = SinkTransaction(table)
    with tx.staging(pre_commit.describe(), write.table, branch):
        if to_add:
            with tx.update_schema() as update:
                for column in to_add:
                    update.add_column(column.name, column.type, doc=column.doc, required=False)
            check_added_field_ids(tx.table_metadata.schema(), write)  # the ids the files carry
        key = identifier_update(tx.table_metadata, write)
        if key:
            with tx.update_schema() as update:
                update.set_identifier_fields(*key)
        ensure_name_mapping(tx)
        data_files = staged_data_files(tx, pre_commit, write)
        number, to_replace = revision or (0, [])
        marker = marker_properties(pre_commit.sink_id, pre_commit.epoch, pre_commit.write_id, number)
        snapshot: SpecAwareFastAppend | SpecAwareOverwrite
        if revision is None:
            snapshot = tx.fast_append(branch=branch, snapshot_properties=marker)
        else:
            snapshot = tx.replace_files(branch=branch, snapshot_properties=marker)
            for replaced in to_replace:
                snapshot.delete_data_file(replaced)
        for data_file in data_files:
            snapshot.append_data_file(data_file)
        # Writes the manifests; stages the snapshot and AssertRefSnapshotId(the head checked before).
        snapshot.commit()
    tx.commit_staged(
        fault, lambda: f"{pre_commit.describe()}: the commit of table {write.table!r} (snapshot {snapshot.snapshot_id})"
    )
    return int(snapshot.snapshot_id)


def ensure_name_mapping(tx: SinkTransaction) -> None:
    """Give a table without a name mapping one, from its staged schema.

    Spark and pyarrow write Parquet without Iceberg field ids; readers resolve columns through the
    name mapping. ``update_schema`` keeps an existing mapping current (stage schema changes first),
    but does not create one.
    """
    if tx.table_metadata.name_mapping() is None:
        mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
        tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})


def staged_data_files(tx: SinkTransaction, pre_commit: PreCommit, write: TableWrite) -> list[DataFile]:
    """The write's ``DataFile`` entries against the table as staged so far, in the spec the files
    were written for (not necessarily the table's default)."""
    metadata = tx.table_metadata
    spec = write_spec(metadata, write, owner=pre_commit.describe())
    return build_data_files(
        write.data_files,
        schema=metadata.schema(),
        spec=spec,
        spec_id=spec.spec_id,
        format_version=metadata.format_version,
        table=write.table,
    )
