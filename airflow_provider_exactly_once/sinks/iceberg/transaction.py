"""The places where pyiceberg 0.12's ``Transaction`` and ``SqlCatalog`` must behave differently for sink commits.

Each relies on private attributes, pinned by ``pyiceberg<0.13``; keeping them in this one module
gives an upgrade one file to re-check. What each patch does, why, and what upstream has about it:
design.md, "Use, do not rewrite" (the table of pyiceberg 0.12 patches).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from copy import copy
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import (
    UNASSIGNED_SEQ,
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.table import CommitTableRequest, Table, TableIdentifier, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
    UpdatesAndRequirements,
    _apply_table_update,
    _TableMetadataUpdateContext,
    update_table_metadata,
)
from pyiceberg.table.update.snapshot import _FastAppendFiles, _OverwriteFiles
from pyiceberg.typedef import EMPTY_DICT, KeyDefaultDict
from sqlalchemy.orm import Session

from airflow_provider_exactly_once.core.errors import (
    CommitOutcomeUnknown,
    CommitRefused,
    ExactlyOnceError,
    SinkUnavailable,
)
from airflow_provider_exactly_once.sinks.iceberg.catalog_access import UNREACHABLE, describe_error
from airflow_provider_exactly_once.sinks.iceberg.prepared_manifests import in_blocks, summary_limit

log = logging.getLogger(__name__)

#: Fault points around a sink commit's catalog update, in the order one attempt passes them.
FAULT_BEFORE_CATALOG_UPDATE = "iceberg.before_catalog_update"
FAULT_AFTER_CATALOG_UPDATE = "iceberg.after_catalog_update"
#: Between those two on a SQL catalog's fan-out (``SqlPointerMoves``): every table's new metadata
#: file written; then every pointer moved inside the database transaction, not yet committed.
FAULT_METADATA_WRITTEN = "iceberg.metadata_written"
FAULT_IN_CATALOG_TRANSACTION = "iceberg.in_catalog_transaction"
#: PostgreSQL's SQLSTATEs for a transaction given up for another one (a deadlock, a serialization
#: failure, a lock not granted): nothing of it was applied, and trying again may succeed.
_GIVEN_UP_FOR_ANOTHER = frozenset({"40P01", "40001", "55P03"})


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


def _apply(metadata: TableMetadata, updates: tuple[TableUpdate, ...]) -> TableMetadata:
    """``update_table_metadata`` for updates staged after ``metadata`` was made. Snapshots and their
    refs alone cannot break the schema or partition spec, and the metadata models are never changed
    in place, so those are applied without the deep copy of the whole history pyiceberg makes; any
    other update goes through pyiceberg's checks (the catalog applies every update again anyway)."""
    if not all(isinstance(update, AddSnapshotUpdate | SetSnapshotRefUpdate) for update in updates):
        return update_table_metadata(metadata, updates)
    context = _TableMetadataUpdateContext()
    for update in updates:
        metadata = _apply_table_update(update, metadata, context)
    return metadata


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
        with in_blocks(producer.new_manifest_writer(spec=producer.spec(spec_id))) as writer:
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


def _summary_by_spec(
    producer: Any, snapshot_properties: dict[str, str], prepared: dict[str, str] | None = None
) -> Summary:
    """The snapshot summary, each added and removed file counted under its own spec; ``prepared``:
    the added files' properties as persist computed them (``prepared_manifests``)."""
    metadata = producer._transaction.table_metadata
    parent = producer._parent_snapshot_id
    previous = metadata.snapshot_by_id(parent) if parent is not None else None
    added = _changed_files(producer) if prepared is None else prepared
    return update_snapshot_summaries(
        summary=Summary(operation=producer._operation, **added, **snapshot_properties),
        previous_summary=previous.summary if previous is not None else None,
    )


def _changed_files(producer: Any) -> dict[str, str]:
    """The summary's properties for the files the producer adds and removes, before the totals."""
    metadata = producer._transaction.table_metadata
    schema, specs = metadata.schema(), metadata.specs()
    collector = SnapshotSummaryCollector(partition_summary_limit=summary_limit(metadata))
    for data_file in producer._added_data_files:
        collector.add_file(data_file=data_file, partition_spec=specs[data_file.spec_id], schema=schema)
    for data_file in producer._deleted_data_files:
        collector.remove_file(data_file=data_file, partition_spec=specs[data_file.spec_id], schema=schema)
    return collector.build()


class SpecAwareFastAppend(_FastAppendFiles):
    """A fast append that files each added data file under the partition spec it names, or lists the
    manifests persist prepared for them (``use_prepared``) instead of writing its own."""

    _prepared: tuple[list[ManifestFile], dict[str, str]] | None = None

    def use_prepared(self, manifests: list[ManifestFile], summary: dict[str, str]) -> None:
        self._prepared = (manifests, summary)

    def _manifests(self) -> list[ManifestFile]:
        added = _added_by_spec(self) if self._prepared is None else self._prepared[0]
        return self._process_manifests(added + self._existing_manifests())

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        return _summary_by_spec(self, snapshot_properties, None if self._prepared is None else self._prepared[1])


class StackedFastAppend(SpecAwareFastAppend):
    """A ``SpecAwareFastAppend`` that may follow another one staged in the same transaction, and
    then lists its manifests from memory instead of reading back the manifest list just written."""

    def __init__(self, *, previous: StackedFastAppend | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._previous = previous
        self._new_manifests: list[ManifestFile] = []
        #: The manifests as this snapshot's manifest list holds them, once staged.
        self._listed: list[ManifestFile] | None = None

    def _existing_manifests(self) -> list[ManifestFile]:
        previous = self._previous
        if previous is None or previous._listed is None or previous._snapshot_id != self._parent_snapshot_id:
            return super()._existing_manifests()
        # The filter of pyiceberg's _FastAppendFiles._existing_manifests, on the same manifests.
        return [
            m
            for m in previous._listed
            if m.has_added_files() or m.has_existing_files() or m.added_snapshot_id == self._snapshot_id
        ]

    def _manifests(self) -> list[ManifestFile]:
        self._new_manifests = super()._manifests()
        return self._new_manifests

    def _commit(self) -> UpdatesAndRequirements:
        updates, requirements = super()._commit()
        snapshot = next(u.snapshot for u in updates if isinstance(u, AddSnapshotUpdate))
        version = self._transaction.table_metadata.format_version
        self._listed = [
            _as_listed(m, version, snapshot.sequence_number) if m.added_snapshot_id == self._snapshot_id else m
            for m in self._new_manifests
        ]
        return updates, requirements


def _as_listed(manifest: ManifestFile, format_version: int, sequence_number: int | None) -> ManifestFile:
    """The manifest as pyiceberg's manifest list writer stores it (``ManifestListWriterV2.prepare_manifest``):
    a manifest new in this snapshot takes the snapshot's sequence number; v1 has none."""
    if format_version == 1 or sequence_number is None:
        return manifest
    listed = copy(manifest)
    if listed.sequence_number == UNASSIGNED_SEQ:
        listed.sequence_number = sequence_number
    if listed.min_sequence_number == UNASSIGNED_SEQ:
        listed.min_sequence_number = sequence_number
    return listed


@dataclass(frozen=True)
class WrittenAhead:
    """A revision's manifests as its persist wrote them (``SpecAwareOverwrite.write_ahead``)."""

    #: The added files' manifests, then the removed files' (deleted entries), as ``_manifests`` lists them.
    new: list[ManifestFile]
    #: Each manifest of the branch head that held a removed file -> its copy without them, its other
    #: entries existing (``None``: it held nothing else, and goes).
    rewrites: dict[str, ManifestFile | None]
    #: The summary's properties for the files added and removed, before the table's totals.
    summary: dict[str, str]


class SpecAwareOverwrite(_OverwriteFiles):
    """An overwrite that removes exactly the given files and adds the new ones under their own specs,
    or lists the manifests a revision's persist wrote of both (``use_prepared``)."""

    _prepared: tuple[list[ManifestFile], dict[str, str]] | None = None
    #: Where the added files' manifests go; ``None``: the table's metadata folder, as pyiceberg's.
    _added_folder: str | None = None

    def use_prepared(self, snapshot_id: int, manifests: list[ManifestFile], summary: dict[str, str]) -> None:
        """List ``manifests`` as they are, as snapshot ``snapshot_id``: the id they were written for."""
        self._snapshot_id = snapshot_id
        self._prepared = (manifests, summary)

    def new_manifest_output(self) -> OutputFile:
        if self._added_folder is None:
            return super().new_manifest_output()
        path = f"{self._added_folder}/{self.commit_uuid}-m{next(self._manifest_num_counter)}.avro"
        self._written_manifests.append(path)
        return self._io.new_output(path)

    def write_ahead(
        self, added_folder: str, read: Mapping[str, list[ManifestEntry]], since_sequence_number: int = 0
    ) -> WrittenAhead | None:
        """At persist, the manifests ``_manifests`` would write at commit: the added files' below
        ``added_folder``, the others (which list other writes' entries too, and so must outlive this
        write's location) in the metadata folder. ``None`` when a file to remove is not live in the
        branch head (the commit then refuses, as it would have). The copies keep the head's manifest
        order and their entries' snapshot ids and sequence numbers, as ``_existing_manifests`` does;
        only the manifests whose partitions may hold a removed file are read, as there, and only
        those not in ``read`` (their live entries, by path, as the caller read them already). A
        manifest added before ``since_sequence_number`` (that of the snapshot that added the files
        to remove) is not read: it cannot list a file the table did not hold yet."""
        try:
            self._build_delete_files_partition_predicate()
            evaluators = KeyDefaultDict(self._build_manifest_evaluator)
            head = self._transaction.table_metadata.snapshot_by_name(self._target_branch)
            removed: dict[int, list[ManifestEntry]] = {}
            kept: dict[str, tuple[int, list[ManifestEntry]]] = {}
            for manifest in head.manifests(self._io) if head is not None else []:
                if (
                    manifest.content != ManifestContent.DATA
                    or manifest.sequence_number < since_sequence_number
                    or not evaluators[manifest.partition_spec_id](manifest)
                ):
                    continue
                entries = read.get(manifest.manifest_path)
                if entries is None:
                    entries = manifest.fetch_manifest_entry(self._io, discard_deleted=True)
                if any(entry.data_file in self._deleted_data_files for entry in entries):
                    others = [e for e in entries if e.data_file not in self._deleted_data_files]
                    kept[manifest.manifest_path] = (manifest.partition_spec_id, others)
                    for entry in entries:
                        if entry.data_file in self._deleted_data_files:
                            removed.setdefault(entry.data_file.spec_id, []).append(entry)
            if sum(len(entries) for entries in removed.values()) != len(self._deleted_data_files):
                return None
            self._added_folder = added_folder
            new = _added_by_spec(self)
            self._added_folder = None
            for spec_id, entries in removed.items():
                with in_blocks(self.new_manifest_writer(self.spec(spec_id))) as writer:
                    for entry in entries:
                        writer.delete(entry)
                new.append(writer.to_manifest_file())
            rewrites: dict[str, ManifestFile | None] = {}
            for path, (spec_id, entries) in kept.items():
                rewrites[path] = None
                if entries:
                    with in_blocks(self.new_manifest_writer(self.spec(spec_id))) as writer:
                        for entry in entries:
                            writer.existing(entry)
                    rewrites[path] = writer.to_manifest_file()
            return WrittenAhead(new, rewrites, _changed_files(self))
        except BaseException:
            self._clean_all_uncommitted()
            raise

    def _manifests(self) -> list[ManifestFile]:
        if self._prepared is not None:
            return self._process_manifests(self._prepared[0])
        self._build_delete_files_partition_predicate()
        # Planned before any manifest is written, so a file no longer in the table fails the commit
        # with nothing left behind.
        deleted_entries = self._deleted_entries()
        by_spec: dict[int, list[ManifestEntry]] = {}
        for entry in deleted_entries:
            by_spec.setdefault(entry.data_file.spec_id, []).append(entry)
        deleted: list[ManifestFile] = []
        for spec_id, entries in by_spec.items():
            with in_blocks(self.new_manifest_writer(self.spec(spec_id))) as writer:
                for entry in entries:
                    writer.add_entry(entry)
            deleted.append(writer.to_manifest_file())
        return self._process_manifests(_added_by_spec(self) + deleted + self._existing_manifests())

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        return _summary_by_spec(self, snapshot_properties, None if self._prepared is None else self._prepared[1])


class SinkTransaction(Transaction):
    """A transaction that caches its applied metadata and commits at most once, without rebasing."""

    def __init__(self, table: Table) -> None:
        super().__init__(table, autocommit=False)
        self._applied: tuple[int, int, TableMetadata] | None = None

    def retire(self, branch: str, snapshot_id: int) -> None:
        """Stage the removal of ``branch`` and of its head ``snapshot_id``, which no other ref reads."""
        from pyiceberg.table.update import RemoveSnapshotRefUpdate, RemoveSnapshotsUpdate

        self._apply((RemoveSnapshotRefUpdate(ref_name=branch), RemoveSnapshotsUpdate(snapshot_ids=[snapshot_id])), ())

    @property
    def table_metadata(self) -> TableMetadata:
        if not self._updates:
            return self._table.metadata  # nothing to apply; the model is immutable, so no copy is needed
        base, staged = id(self._table.metadata), len(self._updates)
        applied = self._applied
        if applied is not None and applied[0] == base and applied[1] == staged:
            return applied[2]
        if applied is not None and applied[0] == base and applied[1] < staged:
            # Updates are only ever appended: apply the new ones to what the earlier ones made.
            metadata = _apply(applied[2], self._updates[applied[1] :])
        else:
            metadata = update_table_metadata(self._table.metadata, self._updates)
        self._applied = (base, staged, metadata)
        return metadata

    def _stage(self, updates: tuple[TableUpdate, ...], requirements: tuple[TableRequirement, ...] = ()) -> Transaction:
        asserted = {r.ref for r in self._requirements if isinstance(r, AssertRefSnapshotId)}
        kept = tuple(
            _spec_meaning(requirement)
            for requirement in requirements
            if not (isinstance(requirement, AssertRefSnapshotId) and requirement.ref in asserted)
        )
        return super()._stage(updates, kept)

    def stacked_append(
        self, *, branch: str, snapshot_properties: dict[str, str], previous: StackedFastAppend | None
    ) -> StackedFastAppend:
        """A fast append on ``branch`` after ``previous``, the last one staged in this transaction
        (``None``: the first); stage the previous one before creating the next, so parents chain."""
        return StackedFastAppend(
            previous=previous,
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

    @contextmanager
    def staging(self, owner: str, table: str, branch: str) -> Iterator[None]:
        """Around the staging of updates: a failure deletes what was staged and says that nothing
        was committed. ``owner`` names the epoch (or epochs) the snapshots are for.

        The committers check beforehand what is known to make pyiceberg refuse; anything else it
        refuses while staging would be refused again on every attempt, with nothing sent to the catalog.
        """
        try:
            yield
        except ExactlyOnceError:
            self.discard()
            raise
        except UNREACHABLE as exc:
            self.discard()
            raise SinkUnavailable(
                f"{owner}: could not prepare the commit of table {table!r}: "
                f"{describe_error(exc, self._table.io.properties)}"
            ) from exc
        except Exception as exc:
            self.discard()
            raise CommitRefused(
                f"{owner}: pyiceberg refused to stage the commit of table {table!r} on branch {branch!r}: "
                f"{type(exc).__name__}: {exc}; nothing was committed"
            ) from exc

    def commit_staged(self, fault: Callable[[str], None], what: Callable[[], str]) -> None:
        """``commit_once`` between the fault points before and after the catalog update.

        A conflict comes back as ``SinkCommitConflict``, not to pyiceberg's marker-blind rebase: nothing
        landed, and the caller looks for its marker again before retrying. Anything else from the
        catalog (a lost response, a connection dropped mid-update) may or may not have landed, so it
        is ``CommitOutcomeUnknown`` for ``what()`` (the commit, named): nothing is deleted, and the
        next attempt's marker check decides.
        """
        fault(FAULT_BEFORE_CATALOG_UPDATE)
        try:
            self.commit_once()
        except SinkCommitConflict:
            raise
        except Exception as exc:
            raise CommitOutcomeUnknown(
                f"{what()} has an unknown outcome: {describe_error(exc, self._table.io.properties)}"
            ) from exc
        fault(FAULT_AFTER_CATALOG_UPDATE)

    def commit_request(self) -> CommitTableRequest:
        """What ``commit_table`` would send for the staged updates: one table's part of a
        multi-table commit (``table_transactions``)."""
        identifier = self._table.name()
        return CommitTableRequest(
            identifier=TableIdentifier(namespace=list(identifier[:-1]), name=identifier[-1]),
            requirements=self._requirements,
            updates=self._updates,
        )

    @staticmethod
    def delete_uncommitted(producers: list[Any]) -> None:
        """Delete the manifests ``producers`` (``detach_producers``) wrote: their commit certainly failed."""
        for producer in producers:
            producer._clean_all_uncommitted()

    def detach_producers(self) -> list[Any]:
        """The staged snapshots' producers, no longer registered: pyiceberg's retry loop re-raises at
        once without them, and the caller deletes what they wrote when the commit certainly failed."""
        producers: list[Any] = list(self._snapshot_producers)
        self._snapshot_producers = []
        return producers

    def commit_once(self) -> Table:
        """Commit the staged updates; a conflict raises ``SinkCommitConflict`` with nothing left behind.

        Any other exception is passed on untouched: its outcome may be unknown, so nothing is deleted.
        """
        producers = self.detach_producers()
        try:
            return self.commit_transaction()
        except CommitFailedException as exc:
            # Certainly not committed: delete the manifests this attempt wrote (pyiceberg would have,
            # had the producers still been registered).
            self.delete_uncommitted(producers)
            raise SinkCommitConflict(str(exc)) from exc


@dataclass(frozen=True)
class _Move:
    """One table's pointer move: from the metadata its transaction was staged on to the next one."""

    table: Table
    namespace: str
    name: str
    metadata: TableMetadata
    location: str
    io: FileIO


class SqlPointerMoves:
    """Several tables' staged transactions committed in one database transaction of a pyiceberg
    ``SqlCatalog`` (item 8): each table's next metadata written as ``commit_table`` writes it, then
    every table's ``iceberg_tables`` row swapped, all or none."""

    def __init__(self, catalog: SqlCatalog, transactions: Sequence[SinkTransaction]) -> None:
        self._catalog = catalog
        self._transactions = list(transactions)

    def commit(self, fault: Callable[[str], None], what: Callable[[], str]) -> None:
        """Write the metadata files, move the pointers; the fault points between the steps.

        Until the database transaction is committed nothing is applied, and a failure deletes the
        metadata files written: a table that moved since it was staged (its row no longer names the
        metadata the transaction was staged on) is ``SinkCommitConflict`` for every table, and so is
        a transaction the database gave up for another; a catalog or storage out of reach is
        ``SinkUnavailable``. A failure of the commit itself is ``CommitOutcomeUnknown``: nothing is
        deleted, and the tables' markers settle it, all or none.
        """
        written: list[tuple[FileIO, str]] = []
        try:
            moves = [self._write(tx, written) for tx in self._transactions]
            fault(FAULT_METADATA_WRITTEN)
            with Session(self._catalog.engine) as session:
                # One order for every such transaction: two that share tables never wait for each other in a ring.
                for move in sorted(moves, key=lambda m: (m.namespace, m.name)):
                    self._swap(session, move)
                session.flush()
                fault(FAULT_IN_CATALOG_TRANSACTION)
                try:
                    session.commit()
                except Exception as exc:
                    raise CommitOutcomeUnknown(
                        f"{what()} has an unknown outcome: {describe_error(exc, self._catalog.properties)}"
                    ) from exc
        except CommitOutcomeUnknown:
            raise
        except Exception as exc:
            for io, path in written:
                _delete_quietly(io, path)
            raise self._not_applied(exc, what) from exc
        for move in moves:  # what ``Table._do_commit`` does once the catalog took a table's commit
            try:
                self._catalog._delete_old_metadata(move.table.io, move.table.metadata, move.metadata)
            except Exception as exc:
                log.warning("could not delete old metadata of table %s after its commit: %s", move.name, exc)
            move.table.metadata, move.table.metadata_location = move.metadata, move.location

    def _write(self, tx: SinkTransaction, written: list[tuple[FileIO, str]]) -> _Move:
        """The table's next metadata from its staged requirements and updates, as ``commit_table``
        makes it, checked against the metadata the transaction was staged on; written."""
        table, request = tx._table, tx.commit_request()
        requirements = (*request.requirements, AssertTableUUID(uuid=table.metadata.table_uuid))
        identifier = table.name()
        staged = self._catalog._update_and_stage_table(table, identifier, requirements, request.updates)
        written.append((staged.io, staged.metadata_location))
        self._catalog._write_metadata(staged.metadata, staged.io, staged.metadata_location)
        namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
        name = Catalog.table_name_from(identifier)
        return _Move(table, namespace, name, staged.metadata, staged.metadata_location, staged.io)

    def _swap(self, session: Session, move: _Move) -> None:
        """``commit_table``'s conditional update of the table's row, in the session's transaction."""
        row = IcebergTables
        where = (
            row.catalog_name == self._catalog.name,
            row.table_namespace == move.namespace,
            row.table_name == move.name,
            row.metadata_location == move.table.metadata_location,
        )
        if self._catalog.engine.dialect.supports_sane_rowcount:
            swap = (
                sa.update(row)
                .where(*where)
                .values(metadata_location=move.location, previous_metadata_location=move.table.metadata_location)
            )
            moved = session.connection().execute(swap).rowcount >= 1
        else:
            found = session.scalars(sa.select(row).with_for_update(of=row).where(*where)).one_or_none()
            if found is not None:
                found.metadata_location, found.previous_metadata_location = move.location, move.table.metadata_location
            moved = found is not None
        if not moved:
            raise SinkCommitConflict(f"Table has been updated by another process: {move.namespace}.{move.name}")

    def _not_applied(self, exc: Exception, what: Callable[[], str]) -> Exception:
        """What a failure before the commit means: nothing was applied."""
        if isinstance(exc, SinkCommitConflict | ExactlyOnceError):
            return exc
        if isinstance(exc, CommitFailedException) or _given_up_for_another(exc):
            return SinkCommitConflict(str(exc))
        described = describe_error(exc, self._catalog.properties)
        if isinstance(exc, UNREACHABLE):
            return SinkUnavailable(
                f"{what()} could not reach the catalog or storage: {described}; nothing was committed"
            )
        return CommitRefused(f"{what()} was refused: {described}; nothing was committed")


def _given_up_for_another(exc: Exception) -> bool:
    """A transaction the database rolled back for a concurrent one (PostgreSQL's deadlock and
    serialization codes, SQLite's lock not granted within its timeout)."""
    if not isinstance(exc, sa.exc.OperationalError):
        return False
    return getattr(exc.orig, "pgcode", None) in _GIVEN_UP_FOR_ANOTHER or "database is locked" in str(exc.orig)


def _delete_quietly(io: FileIO, path: str) -> None:
    """Delete a metadata file no table points at; one left behind is ``eo-sink gc``'s (design.md D18)."""
    try:
        io.delete(path)
    except Exception as exc:
        log.warning("could not delete metadata file %s, which no table points at: %s", path, exc)
