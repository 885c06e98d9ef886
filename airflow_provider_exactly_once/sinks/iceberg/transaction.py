"""The places where pyiceberg 0.12's ``Transaction`` must behave differently for sink commits.

All rely on private attributes, pinned by ``pyiceberg<0.13`` in pyproject.toml; keeping them in this
one module means an upgrade has one file to re-check.

1. ``commit_transaction`` retries a ``CommitFailedException`` itself by rebasing the registered
   snapshot producers onto the new head (``commit.retry.*`` table properties). That rebase does not
   look for our marker again, so a concurrent commit of the same epoch would be duplicated
   (design.md section 5, step 4). ``commit_once`` detaches the producers so the first conflict comes
   back to the committer, which reloads the table and re-checks the marker.
2. ``Transaction.table_metadata`` re-applies every staged update and deep-copies the whole metadata
   (every snapshot of the table's history) on each access, and one fast append reads it about sixteen
   times. A table with a long history then makes every commit, and so recovery of many epochs,
   cost O(history) many times over. The metadata only changes when an update is staged, so it is
   cached until then.
3. pyiceberg's ``AssertRefSnapshotId`` refuses any ref but ``main`` on a table without snapshots, so
   the first commit to a named branch of a new table fails while staging. The Iceberg spec (and Java
   Iceberg, whose REST servers check the same requirement) only asks that a ref expected absent is
   absent; a table without snapshots has no refs at all, so the first commit creates the branch, as
   Flink's committer does. ``_stage`` swaps the requirement for one with the spec's meaning; it
   serialises identically, so a REST catalog receives the standard requirement.
4. A fast append writes every added file into one manifest of the table's *default* spec and
   summarises partitions with it. Iceberg keeps files of older specs, and a write partitioned for
   the spec of its time must be filed under that spec when the table's spec changed before the
   commit. ``SpecAwareFastAppend`` writes one manifest per spec, as Java's ``FastAppend`` does.
   ``SpecAwareOverwrite`` does the same for the replacement of an epoch's write (design.md section 5,
   step 6): pyiceberg's ``_OverwriteFiles`` removes exactly the files given to ``delete_data_file``
   (refusing, in ``_validate_required_deletes``, one that is no longer in the table) and adds the
   new ones, in one snapshot.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.update import AssertRefSnapshotId, TableRequirement, TableUpdate, update_table_metadata
from pyiceberg.table.update.snapshot import _FastAppendFiles, _OverwriteFiles
from pyiceberg.typedef import EMPTY_DICT


class SinkCommitConflict(Exception):
    """The catalog refused the commit because the table moved on: nothing landed, try again."""


class RefMustBeAbsent(AssertRefSnapshotId):
    """``AssertRefSnapshotId`` with no snapshot id, as the Iceberg spec defines it: the ref must not
    exist. Only the check differs from pyiceberg's; the serialised form is the same."""

    # pyiceberg's requirements all override pydantic's deprecated classmethod ``validate`` this way.
    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
        if base_metadata is None:
            raise CommitFailedException("Requirement failed: current table metadata is missing")
        ref = base_metadata.refs.get(self.ref)
        if ref is not None:
            raise CommitFailedException(
                f"Requirement failed: {ref.snapshot_ref_type} {self.ref} was created concurrently"
            )


def _spec_meaning(requirement: TableRequirement) -> TableRequirement:
    if type(requirement) is AssertRefSnapshotId and requirement.snapshot_id is None:
        return RefMustBeAbsent(ref=requirement.ref, snapshot_id=None)
    return requirement


def _added_by_spec(producer: Any) -> list[ManifestFile]:
    """The producer's added files, one manifest per partition spec they name."""
    by_spec: dict[int, list[DataFile]] = {}
    for data_file in producer._added_data_files:
        by_spec.setdefault(data_file.spec_id, []).append(data_file)
    added: list[ManifestFile] = []
    for spec_id, data_files in by_spec.items():
        with producer.new_manifest_writer(spec=producer.spec(spec_id)) as writer:
            for data_file in data_files:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=producer._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=data_file,
                    )
                )
        added.append(writer.to_manifest_file())
    return added


def _summary_by_spec(producer: Any, snapshot_properties: dict[str, str]) -> Summary:
    """The snapshot summary, each added and removed file counted under its own spec."""
    metadata = producer._transaction.table_metadata
    schema, specs = metadata.schema(), metadata.specs()
    limit = int(
        metadata.properties.get(
            TableProperties.WRITE_PARTITION_SUMMARY_LIMIT, TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT
        )
    )
    collector = SnapshotSummaryCollector(partition_summary_limit=limit)
    for data_file in producer._added_data_files:
        collector.add_file(data_file=data_file, partition_spec=specs[data_file.spec_id], schema=schema)
    for data_file in producer._deleted_data_files:
        collector.remove_file(data_file=data_file, partition_spec=specs[data_file.spec_id], schema=schema)
    parent = producer._parent_snapshot_id
    previous = metadata.snapshot_by_id(parent) if parent is not None else None
    return update_snapshot_summaries(
        summary=Summary(operation=producer._operation, **collector.build(), **snapshot_properties),
        previous_summary=previous.summary if previous is not None else None,
    )


class SpecAwareFastAppend(_FastAppendFiles):
    """A fast append that files each added data file under the partition spec it names."""

    def _manifests(self) -> list[ManifestFile]:
        return self._process_manifests(_added_by_spec(self) + self._existing_manifests())

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        return _summary_by_spec(self, snapshot_properties)


class SpecAwareOverwrite(_OverwriteFiles):
    """An overwrite that removes exactly the given files and adds the new ones under their own specs."""

    def _manifests(self) -> list[ManifestFile]:
        self._build_delete_files_partition_predicate()
        # Planned before any manifest is written, so a file no longer in the table fails the commit
        # with nothing left behind.
        deleted_entries = self._deleted_entries()
        by_spec: dict[int, list[ManifestEntry]] = {}
        for entry in deleted_entries:
            by_spec.setdefault(entry.data_file.spec_id, []).append(entry)
        deleted: list[ManifestFile] = []
        for spec_id, entries in by_spec.items():
            with self.new_manifest_writer(self.spec(spec_id)) as writer:
                for entry in entries:
                    writer.add_entry(entry)
            deleted.append(writer.to_manifest_file())
        return self._process_manifests(_added_by_spec(self) + deleted + self._existing_manifests())

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        return _summary_by_spec(self, snapshot_properties)


class SinkTransaction(Transaction):
    """A transaction that caches its applied metadata and commits at most once, without rebasing."""

    def __init__(self, table: Table) -> None:
        super().__init__(table, autocommit=False)
        self._applied: tuple[int, int, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        if not self._updates:
            return self._table.metadata  # nothing to apply; the model is immutable, so no copy is needed
        key = (id(self._table.metadata), len(self._updates))
        if self._applied is None or self._applied[:2] != key:
            self._applied = (*key, update_table_metadata(self._table.metadata, self._updates))
        return self._applied[2]

    def _stage(self, updates: tuple[TableUpdate, ...], requirements: tuple[TableRequirement, ...] = ()) -> Transaction:
        return super()._stage(updates, tuple(_spec_meaning(requirement) for requirement in requirements))

    def fast_append(self, *, branch: str, snapshot_properties: dict[str, str]) -> SpecAwareFastAppend:
        return SpecAwareFastAppend(
            operation=Operation.APPEND,
            transaction=self,
            io=self._table.io,
            branch=branch,
            snapshot_properties=snapshot_properties,
        )

    def replace_files(self, *, branch: str, snapshot_properties: dict[str, str]) -> SpecAwareOverwrite:
        return SpecAwareOverwrite(
            operation=Operation.OVERWRITE,
            transaction=self,
            io=self._table.io,
            branch=branch,
            snapshot_properties=snapshot_properties,
        )

    def discard(self) -> None:
        """Delete the manifests staged so far: the transaction failed before reaching the catalog."""
        for producer in self._snapshot_producers:
            producer._clean_all_uncommitted()
        self._snapshot_producers = []

    def commit_once(self) -> Table:
        """Commit the staged updates; a conflict raises ``SinkCommitConflict`` with nothing left behind.

        Any other exception is passed on untouched: its outcome may be unknown, so nothing is deleted.
        """
        producers: list[Any] = list(self._snapshot_producers)
        self._snapshot_producers = []  # pyiceberg's retry loop re-raises at once without producers
        try:
            return self.commit_transaction()
        except CommitFailedException as exc:
            # Certainly not committed: delete the manifests this attempt wrote (pyiceberg would have,
            # had the producers still been registered).
            for producer in producers:
                producer._clean_all_uncommitted()
            raise SinkCommitConflict(str(exc)) from exc
