"""Pre-commit metadata: everything a write hands to the commit, and nothing the commit must re-read.

Plain JSON validated once where it enters (``PreCommit.from_json``) and immutable afterwards, with
the conventions that keep the commit free of footer reads: design.md, "Vocabulary".
"""

from __future__ import annotations

import base64
import binascii
import uuid
import zlib
from collections.abc import Iterator
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .data_file_list import DataFiles
from .epochs import Epoch, SinkId, WriteId, check_generation
from .errors import InvalidPreCommit, find_control
from .input_ranges import positions_fault
from .upserts import ChangeCounts, RevisedWrite, RewrittenFile

#: Validation context key: the metadata is read back from the meta store (``PreCommit.parse(...,
#: recorded=True)``): the record of an abort without a write (``PreCommit.nothing_written``) is
#: accepted, and source positions stored before they were checked are kept as they are.
_RECORDED = "recorded"
#: Validation context key: the metadata is this package's own, stored after it passed every check
#: (``PreCommit.parse(..., trusted=True)``): the checks that run once per data file are skipped.
_TRUSTED = "trusted"

Generation = Annotated[str | None, AfterValidator(check_generation)]

PartitionValue = int | float | str | bool | None
#: Marks the compressed text form of a pre-commit (``PreCommit.to_compressed``).
COMPRESSED_PREFIX = "eo-precommit+zlib+b64:"
#: Refuse to inflate more than this: real metadata is megabytes, a corrupt value could be anything.
COMPRESSED_MAX_BYTES = 256 * 1024 * 1024
PRE_COMMIT_VERSION: Literal[1] = 1


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)


def _trusted(info: ValidationInfo) -> bool:
    return bool((info.context or {}).get(_TRUSTED))


def _no_control(value: str, info: ValidationInfo) -> str:
    """Paths and names end up in operators' terminals and logs: a control character there is an
    escape sequence waiting to retitle or clear a terminal, and never part of a real path."""
    if _trusted(info):
        return value
    found = find_control(value)
    if found is not None:
        raise ValueError(f"contains the control character {found}; paths and names may not hold control characters")
    return value


class DataFileDescriptor(_Frozen):
    """One data file as the writer produced it, with the statistics Iceberg keeps per file."""

    path: str = Field(min_length=1)
    format: Literal["parquet", "orc", "avro"] = "parquet"
    record_count: int = Field(ge=0)
    file_size_in_bytes: int = Field(ge=0)
    partition: dict[str, PartitionValue] = Field(default_factory=dict)
    column_sizes: dict[str, int] = Field(default_factory=dict)
    value_counts: dict[str, int] = Field(default_factory=dict)
    null_value_counts: dict[str, int] = Field(default_factory=dict)
    nan_value_counts: dict[str, int] = Field(default_factory=dict)
    lower_bounds: dict[str, str] = Field(default_factory=dict)
    upper_bounds: dict[str, str] = Field(default_factory=dict)
    split_offsets: list[int] | None = None
    #: Which writer (Spark task) produced the file; file sinks build final names from it.
    writer: str | None = None

    @model_validator(mode="after")
    def _checked(self, info: ValidationInfo) -> Self:
        """The path printable and the bounds base64: one call per file, not one per field (an
        epoch's 10,000 files made 30,000 calls into Python, a sixth of its parse)."""
        if _trusted(info):
            return self
        faults = []
        try:
            _no_control(self.path, info)
        except ValueError as exc:
            faults.append(f"path: {exc}")
        for field, bounds in (("lower_bounds", self.lower_bounds), ("upper_bounds", self.upper_bounds)):
            for column, encoded in bounds.items():
                try:
                    # binascii directly: base64.b64decode's checks cost ten times the decode itself.
                    binascii.a2b_base64(encoded, strict_mode=True)
                except (binascii.Error, ValueError):
                    faults.append(f"{field}: bound of column {column!r} is not base64")
        if faults:  # named by field, as pydantic names the faults of the fields it checks itself
            raise ValueError("; ".join(faults))
        return self

    def bound_bytes(self, which: Literal["lower", "upper"]) -> dict[str, bytes]:
        bounds = self.lower_bounds if which == "lower" else self.upper_bounds
        return {column: binascii.a2b_base64(encoded) for column, encoded in bounds.items()}


class WrittenColumn(_Frozen):
    """A top-level column as written: Iceberg type name (``long``, ``timestamptz``, ``decimal(10, 2)``)."""

    name: str = Field(min_length=1)
    type: str = Field(min_length=1)
    required: bool = False
    doc: str | None = None
    #: The Iceberg field id the files carry for this column, when they carry ids (Spark's writer
    #: does). The commit refuses when the table's id differs: readers resolve columns by id, so a
    #: mismatch would show the data under another column or not at all.
    field_id: int | None = Field(default=None, ge=1)


class PartitionSummary(_Frozen):
    """One partition field's summary in a manifest list entry (Iceberg's ``field_summary``), bounds
    in Iceberg's single-value binary serialisation, base64: what readers prune manifests by."""

    contains_null: bool
    contains_nan: bool | None = None
    lower_bound: str | None = None
    upper_bound: str | None = None


class PreparedManifest(_Frozen):
    """A manifest persist wrote for the write's files, the entries' snapshot id and sequence
    numbers left to inheritance: the commit lists it as it is (``sinks/iceberg/prepared_manifests.py``).
    A revision's (``sinks/iceberg/overwrites.py``) also records the replaced write's entries,
    deleted, and the other entries of a manifest that held some, existing: its counts say which."""

    path: str = Field(min_length=1)
    length: int = Field(ge=1)
    spec_id: int = Field(ge=0)
    added_files: int = Field(ge=0)
    added_rows: int = Field(ge=0)
    partitions: list[PartitionSummary] = Field(default_factory=list)
    existing_files: int = Field(default=0, ge=0)
    existing_rows: int = Field(default=0, ge=0)
    deleted_files: int = Field(default=0, ge=0)
    deleted_rows: int = Field(default=0, ge=0)
    #: The smallest sequence number of its live entries, when they carry their own (existing ones);
    #: ``None``: the snapshot's, as for a manifest of added entries.
    min_sequence_number: int | None = Field(default=None, ge=0)
    #: The manifest of the table it stands in for: the one that listed the entries it keeps existing.
    replaces: str | None = None

    @property
    def lists_other_writes(self) -> bool:
        """A revision's copy of a table manifest, or its deleted entries: it outlives this write's
        files (later snapshots carry it), so it lies in the table's metadata folder."""
        return self.replaces is not None or self.deleted_files > 0


class PreparedSnapshot(_Frozen):
    """What persist prepared of a table's snapshot, valid while the table keeps the schema and the
    partition-summary limit it was prepared against; otherwise the commit writes its own."""

    schema_id: int = Field(ge=0)
    summary_limit: int
    #: The snapshot summary's properties for the added (and a revision's removed) files, before
    #: the table's totals.
    summary: dict[str, str]
    manifests: list[PreparedManifest] = Field(min_length=1)
    #: A revision's: the id its snapshot takes, which the entries it deletes carry (``None``: an append).
    snapshot_id: int | None = None
    #: A revision's: the manifests of the table that held the replaced write's files, all of which
    #: the snapshot must still list for the prepared manifests to stand in for them.
    replaced: list[str] = Field(default_factory=list)


class TableWrite(_Frozen):
    """What one write produced for one target (an Iceberg table, or a file sink's directory)."""

    #: Iceberg identifier (``namespace.table``) or, for a file sink, the sink root.
    table: str = Field(min_length=1)
    #: The location unique to this write; every data file lies below it (abort deletes below it).
    location: str = Field(min_length=1)
    #: Read back from the meta store, parsed only when a descriptor is read (``DataFiles``).
    data_files: DataFiles[DataFileDescriptor] = Field(default_factory=DataFiles)
    #: Columns as written, in file order. Empty means "the table's schema as it was".
    schema_written: list[WrittenColumn] = Field(default_factory=list)
    #: Columns the writer asks the commit to add (schema evolution, optional columns only).
    added_columns: list[WrittenColumn] = Field(default_factory=list)
    #: The Iceberg partition spec the files were partitioned for. The table's spec may change
    #: between the write and the commit; Iceberg keeps files of older specs, so the commit files
    #: them under this one. ``None`` (metadata from before it was recorded, file sinks) means the
    #: table's default spec at commit time.
    spec_id: int | None = Field(default=None, ge=0)
    #: An upsert write (``core.upserts``): the table's data files it rewrote, which its commit
    #: removes in the snapshot that adds ``data_files``.
    rewritten: list[RewrittenFile] = Field(default_factory=list)
    #: An upsert write: the snapshot of the table it read (``None``: the table had none). Files the
    #: table gained since that may hold the epoch's keys make the commit refuse: the write did not
    #: see them.
    read_snapshot_id: int | None = None
    #: An upsert write: the epoch's key range per key column, Iceberg single-value serialisation,
    #: base64 (as descriptors' bounds), deletes included: what a file added since the read is
    #: compared with.
    key_lower_bounds: dict[str, str] = Field(default_factory=dict)
    key_upper_bounds: dict[str, str] = Field(default_factory=dict)
    #: An upsert write: rows inserted, updated and deleted, as counted against the table it read.
    changes: ChangeCounts | None = None
    #: An upsert revision (design.md D14): the committed write it replaces. ``read_snapshot_id`` is
    #: then the table as it was before that write, and ``rewritten`` includes that write's.
    revises: RevisedWrite | None = None
    #: The manifests persist wrote for ``data_files`` (an Iceberg append on a format-2 table);
    #: set by the committer at persist (``SinkCommitter.stage``), never by a writer.
    prepared: PreparedSnapshot | None = None

    _names_printable = field_validator("table", "location")(_no_control)

    @field_validator("location")
    @classmethod
    def _no_parent_segment(cls, location: str, info: ValidationInfo) -> str:
        """An abort deletes everything below the location: one that climbs out of the folder it names
        would have it delete elsewhere, and files "inside" it are not where they seem."""
        if not _trusted(info) and ".." in location.replace("\\", "/").split("/"):
            raise ValueError(
                f"{location[:200]!r} holds a '..' segment; a write location names its folder directly, without '..'"
            )
        return location

    @model_validator(mode="after")
    def _files_inside_location(self, info: ValidationInfo) -> Self:
        if not _trusted(info):
            self._check_files()
        required_added = [c.name for c in self.added_columns if c.required]
        if required_added:
            raise ValueError(f"table {self.table!r}: added columns must be optional, not {required_added}")
        if self.revises is not None:
            # The commit removes only the files the revision rewrote beyond the revised write's.
            unrewritten = set(self.revises.rewritten) - {r.path for r in self.rewritten}
            if self.changes is None or unrewritten:
                raise ValueError(
                    f"table {self.table!r}: an upsert revision rewrites every file the write it revises rewrote"
                )
        return self

    def _check_files(self) -> None:
        root = self.location.rstrip("/") + "/"
        prepared = self.prepared.manifests if self.prepared else []
        # A revision's manifests that list other writes' entries outlive this write's files (a later
        # snapshot carries them), so they lie in the table's metadata folder, never below the location.
        shared = [m.path for m in prepared if m.lists_other_writes]
        manifests = [m.path for m in prepared if m.path not in shared]
        outside = [p for p in list(self.data_files.paths()) + manifests if not p.startswith(root) or "/../" in p]
        if outside:
            raise ValueError(
                f"table {self.table!r}: {len(outside)} file(s) outside the write location {self.location!r}, "
                f"first: {outside[0]!r}"
            )
        inside = [p for p in shared if p.startswith(root) or "/../" in p]
        if inside:
            raise ValueError(
                f"table {self.table!r}: a manifest of other writes' entries below the write location: {inside[0]!r}"
            )
        paths = self.data_files.paths()
        if len(set(paths)) != len(paths):
            raise ValueError(f"table {self.table!r}: a data file is listed twice")

    @property
    def record_count(self) -> int:
        return self.data_files.record_count()

    @property
    def is_empty(self) -> bool:
        """Nothing to add and nothing to remove: an epoch of only deletes of absent keys is empty."""
        return not self.data_files and not self.rewritten


class PreCommit(_Frozen):
    """The first phase's result for one (sink, epoch): the unit the coordinator persists and commits."""

    version: Literal[1] = PRE_COMMIT_VERSION
    sink_id: SinkId
    epoch: Epoch
    write_id: WriteId
    #: Never empty for a write; empty only in the record of an epoch aborted before any write
    #: (``nothing_written``), which the meta store keeps so the abort and its reason are seen.
    tables: list[TableWrite]
    #: Where the input stood when the write read it (offsets, file lists): kept as given, except an
    #: incremental input's (kind ``iceberg_snapshots``), which is the snapshot range it read
    #: (``core.input_ranges``) and is refused unless it holds one.
    source_positions: dict[str, Any] | None = None
    #: The generation the write was started in (``core.epochs``): a newer one replaces the
    #: epoch's committed write; ``None`` outside Airflow, where a write never replaces one.
    generation: Generation = None

    @field_validator("source_positions")
    @classmethod
    def _range_readable(cls, positions: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        """Positions of an incremental input are interpreted (the commit's fence, the table's marker,
        the listings): refused where a write enters, kept as stored where a row is read back, whose
        commit refuses them by name (``input_ranges.range_read_elsewhere``) and whose abort does not read them."""
        stored = (info.context or {}).get(_RECORDED) or _trusted(info)
        if not stored and (fault := positions_fault(positions)) is not None:
            raise ValueError(fault)
        return positions

    @model_validator(mode="after")
    def _tables(self, info: ValidationInfo) -> Self:
        if not self.tables and not (info.context or {}).get(_RECORDED):
            raise ValueError("tables: a write lists at least one table")
        names = [t.table for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"a table is listed twice: {sorted(names)}")
        return self

    # -- construction and serialisation ---------------------------------------------------------

    @classmethod
    def nothing_written(cls, sink_id: str, epoch: int) -> PreCommit:
        """The record of an epoch aborted before its write produced anything (the write task failed).

        Its write id is the same for every such abort of the epoch, so a retried abort finds it
        already recorded; a later write of the epoch replaces it as it replaces any Aborted write.
        """
        write_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"exactly-once:no-write:{sink_id}:{epoch}"))
        data = {"sink_id": sink_id, "epoch": epoch, "write_id": write_id, "tables": []}
        return cls.model_validate(data, context={_RECORDED: True})

    @property
    def written(self) -> bool:
        """False for the record of an abort without a write (``nothing_written``)."""
        return bool(self.tables)

    @classmethod
    def parse(cls, data: object, *, recorded: bool = False, trusted: bool = False) -> PreCommit:
        """Validate a dict (an XCom value) or JSON text, raising one ``InvalidPreCommit`` naming every fault.

        ``recorded`` accepts what the meta store keeps, including the record of an abort without a
        write; anything arriving from a task is a write and lists at least one table.

        ``trusted``: only for metadata this package stored itself after it passed every check, read
        back in another process (a commit task). Its structure and types are still validated, but
        not the rules checked per data file (paths inside the location and listed once, printable,
        bounds in base64): at 10,000 files they cost a quarter of the parse, on every commit task.
        """
        if isinstance(data, PreCommit):
            return data
        if isinstance(data, bytes) and data.startswith(COMPRESSED_PREFIX.encode("ascii")):
            data = data.decode("ascii")
        if isinstance(data, str) and data.startswith(COMPRESSED_PREFIX):
            data = _decompress(data)
        try:
            context = {_RECORDED: recorded, _TRUSTED: trusted}
            if isinstance(data, str | bytes):
                return cls.model_validate_json(data, context=context)
            return cls.model_validate(data, context=context)
        except InvalidPreCommit:
            raise
        except ValidationError as exc:
            raise InvalidPreCommit(_describe(exc)) from None

    @classmethod
    def from_json(cls, text: str | bytes, *, recorded: bool = False) -> PreCommit:
        return cls.parse(text, recorded=recorded)

    def to_json(self) -> str:
        return self.model_dump_json(exclude_defaults=False)

    def to_compressed(self) -> str:
        """Compact JSON (defaults left out), zlib-deflated, base64, behind ``COMPRESSED_PREFIX``.

        For XCom: an epoch of 10,000 files is megabytes of JSON with the same column names and
        near-identical paths in every descriptor, which deflate shrinks many times over; ``parse``
        accepts this form wherever it accepts JSON text.
        """
        packed = zlib.compress(self.model_dump_json(exclude_defaults=True).encode("utf-8"), 6)
        return COMPRESSED_PREFIX + base64.b64encode(packed).decode("ascii")

    # -- reading ---------------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return all(t.is_empty for t in self.tables)

    @property
    def record_count(self) -> int:
        return sum(t.record_count for t in self.tables)

    def data_files(self) -> Iterator[tuple[TableWrite, DataFileDescriptor]]:
        for table in self.tables:
            for data_file in table.data_files:
                yield table, data_file

    def as_written(self) -> PreCommit:
        """The write as a writer hands it over: a prepared snapshot is the committer's to make at
        persist (``SinkCommitter.stage``) after every file passed its checks, so one arriving with
        the write is dropped, never trusted (the commit skips those checks while it stands). Its
        source positions are checked again: a pre-commit built with ``model_copy`` skipped the model's
        check, and persist is where a write becomes a row."""
        if (fault := positions_fault(self.source_positions)) is not None:
            raise InvalidPreCommit(f"invalid pre-commit metadata: source_positions: {fault}")
        if all(t.prepared is None for t in self.tables):
            return self
        return self.model_copy(update={"tables": [t.model_copy(update={"prepared": None}) for t in self.tables]})

    def table(self, name: str) -> TableWrite:
        for table in self.tables:
            if table.table == name:
                return table
        raise KeyError(name)

    def describe(self) -> str:
        if not self.tables:
            return f"sink {self.sink_id!r} epoch {self.epoch} (no write)"
        return f"sink {self.sink_id!r} epoch {self.epoch} write {self.write_id}"


def _decompress(text: str) -> bytes:
    try:
        packed = base64.b64decode(text[len(COMPRESSED_PREFIX) :], validate=True)
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, COMPRESSED_MAX_BYTES)
    except (binascii.Error, ValueError, zlib.error) as exc:
        raise InvalidPreCommit(f"invalid pre-commit metadata: compressed form cannot be decoded: {exc}") from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise InvalidPreCommit(
            f"invalid pre-commit metadata: compressed form is truncated or inflates past {COMPRESSED_MAX_BYTES} bytes"
        )
    return raw


def _describe(exc: ValidationError) -> str:
    faults = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "pre-commit metadata"
        faults.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
    return "invalid pre-commit metadata: " + "; ".join(faults)
