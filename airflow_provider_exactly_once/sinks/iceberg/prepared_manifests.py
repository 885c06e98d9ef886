"""An append's manifest written at persist, so that its commit only lists it.

Writing a manifest is most of a fast append's cost (pyiceberg's Avro writer is pure Python), and in
the commit it sits inside the window where the catalog is contended; persist is Flink's
``snapshotState``: the write is known and durable, its checkpoint not yet complete. The manifests lie
in a folder of the write's own (``manifest_folder``), so whatever deletes a write's files deletes
them too. The contract: design.md D16.
"""

from __future__ import annotations

import base64
import contextlib
import io
import logging
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from pyiceberg.avro.codecs import AvroCompressionCodec
from pyiceberg.avro.encoder import BinaryEncoder
from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.avro.writer import (
    BinaryWriter,
    DateWriter,
    IntegerWriter,
    ListWriter,
    MapWriter,
    OptionWriter,
    StringWriter,
    StructWriter,
    TimestampNanoWriter,
    TimestamptzNanoWriter,
    TimestamptzWriter,
    TimestampWriter,
    TimeWriter,
    Writer,
)
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    UNASSIGNED_SEQ,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    PartitionFieldSummary,
    write_manifest,
)
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot, SnapshotSummaryCollector

from airflow_provider_exactly_once.core.precommit import (
    PartitionSummary,
    PreCommit,
    PreparedManifest,
    PreparedSnapshot,
    TableWrite,
)
from airflow_provider_exactly_once.sinks.iceberg.catalog_access import delete_tree, local_folder
from airflow_provider_exactly_once.sinks.iceberg.data_files import build_data_files
from airflow_provider_exactly_once.sinks.iceberg.write_check import write_spec

log = logging.getLogger(__name__)

W = TypeVar("W", bound=ManifestWriter)

#: The folder below a write location that holds the manifests persist prepared for it.
MANIFEST_FOLDER = "_eo-manifests"
#: The one format version whose manifests leave snapshot ids and sequence numbers to inheritance
#: and that pyiceberg 0.12 commits: version 1 has no inheritance, version 3 adds row lineage.
PREPARED_FORMAT_VERSION = 2
#: ``ManifestWriter`` wants a snapshot id; the entries are written without one (``snapshot_id=None``)
#: and the commit's manifest list entry names the real one, so this value is never stored.
_UNKNOWN_SNAPSHOT = -1


def summary_limit(metadata: TableMetadata) -> int:
    return int(
        metadata.properties.get(
            TableProperties.WRITE_PARTITION_SUMMARY_LIMIT, TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT
        )
    )


#: Entries per Avro block of a manifest this package writes. pyiceberg's ``ManifestWriter`` makes
#: every entry a block of its own (its header, a deflate stream and a sync marker each), most of a
#: manifest's cost and six times its size; Java writes blocks of about 64 KB, roughly this many entries.
BLOCK_ENTRIES = 1000

#: Writes one value's Avro encoding onto the block being built.
_Write = Callable[[bytearray, Any], None]


def _varint(out: bytearray, integer: int) -> None:
    """Avro's zig-zag varint of an int or long (``BinaryEncoder.write_int``)."""
    datum = (integer << 1) ^ (integer >> 63)
    while datum > 0x7F:
        out.append((datum & 0x7F) | 0x80)
        datum >>= 7
    out.append(datum)


def _compiled(writer: Writer) -> _Write:
    """pyiceberg's writer tree for a manifest entry as nested closures onto a ``bytearray``: the same
    bytes as its ``Writer.write`` through a ``BinaryEncoder``, with a fraction of the Python calls
    for the types a manifest entry holds; any other type is written by pyiceberg's own writer."""
    if isinstance(writer, StructWriter):
        fields = tuple((pos, _compiled(field)) for pos, field in writer.field_writers)

        def struct(out: bytearray, value: Any) -> None:
            for pos, write in fields:
                write(out, value[pos] if pos is not None else None)

        return struct
    if isinstance(writer, OptionWriter):
        option = _compiled(writer.option)

        def nullable(out: bytearray, value: Any) -> None:
            if value is None:
                out.append(0)
            else:
                out.append(2)  # the union's branch 1, zig-zag encoded
                option(out, value)

        return nullable
    if isinstance(writer, MapWriter):
        key, item = _compiled(writer.key_writer), _compiled(writer.value_writer)

        def mapping(out: bytearray, value: Any) -> None:
            if value:
                _varint(out, len(value))
                for k, v in value.items():
                    key(out, k)
                    item(out, v)
            out.append(0)

        return mapping
    if isinstance(writer, ListWriter):
        element = _compiled(writer.element_writer)

        def array(out: bytearray, value: Any) -> None:
            if value:
                _varint(out, len(value))
                for v in value:
                    element(out, v)
            out.append(0)

        return array
    if isinstance(writer, StringWriter):

        def text(out: bytearray, value: Any) -> None:
            encoded = value.encode("utf-8")
            _varint(out, len(encoded))
            out += encoded

        return text
    if isinstance(writer, BinaryWriter):

        def binary(out: bytearray, value: Any) -> None:
            _varint(out, len(value))
            out += value

        return binary
    if type(writer) in _INTEGERS:
        return _varint

    def other(out: bytearray, value: Any) -> None:
        written = io.BytesIO()
        writer.write(BinaryEncoder(written), value)
        out += written.getvalue()

    return other


#: pyiceberg's writers that write their value as ``BinaryEncoder.write_int``.
_INTEGERS = (
    IntegerWriter,
    DateWriter,
    TimeWriter,
    TimestampWriter,
    TimestamptzWriter,
    TimestampNanoWriter,
    TimestamptzNanoWriter,
)


def _write_block(avro: AvroOutputFile[ManifestEntry], entries: list[ManifestEntry]) -> None:
    """``AvroOutputFile.write_block`` of ``entries``, encoded by ``_compiled``."""
    content = bytearray()
    write = _compiled(avro.writer)
    for entry in entries:
        write(content, entry)
    block = bytes(content)
    avro.encoder.write_int(len(entries))
    codec = avro.compression_codec()
    if codec is not None:
        block, _ = codec.compress(block)
    avro.encoder.write_int(len(block))
    avro.encoder.write(block)
    avro.encoder.write(avro.sync_bytes)


@contextmanager
def in_blocks(writer: W) -> Iterator[W]:
    """``with writer`` (a pyiceberg ``ManifestWriter``), its entries written ``BLOCK_ENTRIES`` to an
    Avro block instead of one each (``_compiled``): the same entries and manifest list entry,
    readers see no difference. Every manifest this package writes goes through here."""
    with writer:
        avro = writer._writer
        entries: list[ManifestEntry] = []

        def gather(objects: list[ManifestEntry]) -> None:
            entries.extend(objects)
            if len(entries) >= BLOCK_ENTRIES:
                _write_block(avro, entries)
                entries.clear()

        avro.write_block = gather  # type: ignore[method-assign]
        yield writer
        if entries:
            _write_block(avro, entries)


def prepare_snapshot(table: Table, pre_commit: PreCommit, write: TableWrite) -> PreparedSnapshot | None:
    """Write the manifest of ``write``'s files for ``table`` as it is now; ``None`` where the commit
    must build its own (a format other than 2, or nothing to add)."""
    metadata = table.metadata
    if metadata.format_version != PREPARED_FORMAT_VERSION or not write.data_files:
        return None
    schema = metadata.schema()
    spec = write_spec(metadata, write, owner=pre_commit.describe())
    data_files = build_data_files(write.data_files, schema=schema, spec=spec, spec_id=spec.spec_id, table=write.table)
    limit = summary_limit(metadata)
    collector = SnapshotSummaryCollector(partition_summary_limit=limit)
    path = f"{manifest_folder(write, pre_commit.write_id)}/{uuid.uuid4()}-m0.avro"
    codec: AvroCompressionCodec = metadata.properties.get(  # type: ignore[assignment]
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    with in_blocks(write_manifest(2, spec, schema, table.io.new_output(path), _UNKNOWN_SNAPSHOT, codec)) as writer:
        for data_file in data_files:
            collector.add_file(data_file=data_file, partition_spec=spec, schema=schema)
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=None,
                    sequence_number=None,
                    file_sequence_number=None,
                    data_file=data_file,
                )
            )
    manifest = writer.to_manifest_file()
    return PreparedSnapshot(
        schema_id=metadata.current_schema_id,
        summary_limit=limit,
        summary=collector.build(),
        manifests=[recorded(manifest)],
    )


#: What prepares one write's snapshot: ``prepare_snapshot``, or a revision's (``overwrites``).
Preparer = Callable[[Table, PreCommit, TableWrite], PreparedSnapshot | None]


def staged_pre_commit(
    pre_commit: PreCommit, tables: Mapping[str, Table], prepare: Preparer = prepare_snapshot
) -> PreCommit:
    """``pre_commit`` with a prepared snapshot for each write into one of ``tables`` (as loaded at
    persist) that can have one; any other write's is cleared, so only a committer ever sets it."""
    staged = []
    for write in pre_commit.tables:
        prepared = None
        table = tables.get(write.table)
        try:
            prepared = None if table is None else prepare(table, pre_commit, write)
        except Exception as exc:
            # Only an optimisation: the commit writes the manifest itself. The write's location may
            # be going away under it (a concurrent persist discarding this write cleans it up).
            log.warning("%s: no manifest prepared for table %r: %s", pre_commit.describe(), write.table, exc)
        staged.append(write.model_copy(update={"prepared": prepared}))
    return pre_commit.model_copy(update={"tables": staged})


def usable_manifests(
    metadata: TableMetadata, write: TableWrite, io: FileIO, snapshot_id: int
) -> tuple[list[ManifestFile], dict[str, str]] | None:
    """The prepared manifests as the snapshot ``snapshot_id`` lists them, with the summary properties
    of the files they add, or ``None`` when the commit must write its own: nothing prepared (or a
    revision's, prepared by a persist round that then recorded the write as an append), the table
    changed what they were prepared against, or a manifest is gone or not the length recorded."""
    prepared = write.prepared
    if prepared is None or prepared.snapshot_id is not None or not still_valid(metadata, prepared, io):
        return None
    return [listed(m, snapshot_id) for m in prepared.manifests], prepared.summary


def still_valid(metadata: TableMetadata, prepared: PreparedSnapshot, io: FileIO) -> bool:
    """Whether the table still has what ``prepared`` was prepared against, and every manifest it
    records is there with the length recorded (one written in part or replaced is never trusted)."""
    if (
        metadata.format_version != PREPARED_FORMAT_VERSION
        or metadata.current_schema_id != prepared.schema_id
        or summary_limit(metadata) != prepared.summary_limit
        or any(m.spec_id not in metadata.specs() for m in prepared.manifests)
    ):
        return False
    for manifest in prepared.manifests:
        try:
            if len(io.new_input(manifest.path)) != manifest.length:
                return False
        except FileNotFoundError:
            return False
    return True


def manifest_folder(write: TableWrite, write_id: str) -> str:
    """Where persist writes the write's manifests: a folder of that write id, so that a location shared
    by several writes (it should not be) never has one write's clean-up touch another's manifests."""
    return f"{write.location.rstrip('/')}/{MANIFEST_FOLDER}/{write_id}"


def tidy(io: FileIO, write: TableWrite, write_id: str, *, unused: bool = False, only_staged: bool = False) -> None:
    """Delete the manifests below the write location that no snapshot will list: those of other
    persist attempts than the one ``write`` records; all of them (``unused``) once its commit wrote
    its own; or (``only_staged``) just ``write``'s, staged by a persist that recorded nothing, which
    must not touch what a row of the same write may record. A revision's manifests that list other
    writes' entries lie in the table's metadata folder (``overwrites``), deleted here by path.
    Best effort: a manifest left behind costs its bytes, never correctness, and one deleted while
    recorded is written again by the commit."""
    try:
        folder = manifest_folder(write, write_id)
        if unused or only_staged:
            for manifest in write.prepared.manifests if write.prepared else []:
                if only_staged or not manifest.path.startswith(f"{folder}/"):
                    io.delete(manifest.path)
        if only_staged:
            # Staging may have re-created the folders of a write whose files are gone; only a
            # local file system has folders, and ``rmdir`` removes one only while it is empty.
            for path in (folder, folder.rpartition("/")[0], write.location):
                local = local_folder(f"{path}/_")
                with contextlib.suppress(OSError):
                    if local is not None:
                        os.rmdir(local)
            return
        keep = [] if unused or write.prepared is None else [m.path for m in write.prepared.manifests]
        delete_tree(io, folder, keep=keep)
    except Exception as exc:
        log.warning("table %r: could not delete unused manifests below %r: %s", write.table, write.location, exc)


def recorded(manifest: ManifestFile, replaces: str | None = None) -> PreparedManifest:
    """What the pre-commit keeps of a manifest written at persist: its manifest list entry but for
    the snapshot's id and sequence number, which the commit fills in (``listed``)."""
    return PreparedManifest(
        path=manifest.manifest_path,
        length=manifest.manifest_length,
        spec_id=manifest.partition_spec_id,
        added_files=manifest.added_files_count or 0,
        added_rows=manifest.added_rows_count or 0,
        existing_files=manifest.existing_files_count or 0,
        existing_rows=manifest.existing_rows_count or 0,
        deleted_files=manifest.deleted_files_count or 0,
        deleted_rows=manifest.deleted_rows_count or 0,
        min_sequence_number=None if manifest.min_sequence_number == UNASSIGNED_SEQ else manifest.min_sequence_number,
        replaces=replaces,
        partitions=[
            PartitionSummary(
                contains_null=summary.contains_null,
                contains_nan=summary.contains_nan,
                lower_bound=_b64(summary.lower_bound),
                upper_bound=_b64(summary.upper_bound),
            )
            for summary in manifest.partitions or []
        ],
    )


def listed(manifest: PreparedManifest, snapshot_id: int) -> ManifestFile:
    """The manifest list entry of a prepared manifest, as ``ManifestWriter.to_manifest_file`` makes it
    for a manifest the snapshot wrote itself: new in ``snapshot_id``, its sequence number the snapshot's
    (and the smallest of its entries', unless existing entries carry their own)."""
    return ManifestFile.from_args(
        manifest_path=manifest.path,
        manifest_length=manifest.length,
        partition_spec_id=manifest.spec_id,
        content=ManifestContent.DATA,
        sequence_number=UNASSIGNED_SEQ,
        min_sequence_number=UNASSIGNED_SEQ if manifest.min_sequence_number is None else manifest.min_sequence_number,
        added_snapshot_id=snapshot_id,
        added_files_count=manifest.added_files,
        existing_files_count=manifest.existing_files,
        deleted_files_count=manifest.deleted_files,
        added_rows_count=manifest.added_rows,
        existing_rows_count=manifest.existing_rows,
        deleted_rows_count=manifest.deleted_rows,
        partitions=[
            PartitionFieldSummary.from_args(
                contains_null=summary.contains_null,
                contains_nan=summary.contains_nan,
                lower_bound=_bytes(summary.lower_bound),
                upper_bound=_bytes(summary.upper_bound),
            )
            for summary in manifest.partitions
        ],
        key_metadata=None,
    )


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode("ascii")


def _bytes(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)


#: Manifest lists read, by path: a list file is never rewritten, and a replacement's commit asks
#: whether its prepared snapshot stands up to three times (the check before the decision, the
#: commit, and its retry guard), which pyiceberg answers by reading the list each time.
_LISTS: OrderedDict[str, tuple[ManifestFile, ...]] = OrderedDict()
_LISTS_MAX = 16
_LISTS_LOCK = threading.Lock()


def snapshot_manifests(snapshot: Snapshot, io: FileIO) -> list[ManifestFile]:
    """``snapshot.manifests(io)``, its list file read once per process."""
    with _LISTS_LOCK:
        found = _LISTS.get(snapshot.manifest_list)
        if found is not None:
            _LISTS.move_to_end(snapshot.manifest_list)
            return list(found)
    read = tuple(snapshot.manifests(io))
    with _LISTS_LOCK:
        _LISTS[snapshot.manifest_list] = read
        while len(_LISTS) > _LISTS_MAX:
            _LISTS.popitem(last=False)
    return list(read)
