"""What kind of write an epoch holds, as a value, and everything that depends on the kind alone.

The rules that differ by kind (recovery's batched commit, the upsert order, what a commit removes,
whether a conflict is written again, what counts as a lost write) ask the kind here instead of
testing the pre-commit's fields where they are used: a new kind of write (deletes by predicate, a
multi-table atomic write) is then one more value whose answers are written down in one place, not a
flag to find at every site.

The kind is derived, never stored: from the pre-commit (a table written as changes by key carries
its ``changes``) and from the epoch's row (a revision names the committed write it replaces). So
every stored row keeps parsing, and the kind of an old row is what it always was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

#: What a commit records for a table it left unchanged (``core.ports.CommittedTables``).
EMPTY = "empty"

if TYPE_CHECKING:
    from .precommit import PreCommit, TableWrite


class Kind(StrEnum):
    """The kinds of write. A table's write is an append or an upsert; an epoch's write is also a
    revision when a newer generation's write replaces the committed one (design.md D12, D14)."""

    #: The record of an abort before anything was written (``PreCommit.nothing_written``).
    NOTHING = "nothing written"
    APPEND = "append"
    #: An append revision: swaps the committed write's files for its own.
    REVISION = "revision"
    UPSERT = "upsert"
    #: Changes by key replacing the committed write's, planned against the table before it.
    UPSERT_REVISION = "upsert revision"

    @classmethod
    def of_table(cls, table: TableWrite) -> Kind:
        """One table's write: changes by key carry their counts, rows do not."""
        return cls.APPEND if table.changes is None else cls.UPSERT

    @property
    def by_key(self) -> bool:
        """Changes by key (insert, update, delete), applied copy-on-write: the commit removes the
        files they rewrote and refuses when the table moved under them (``UpsertConflict``)."""
        return self in (Kind.UPSERT, Kind.UPSERT_REVISION)

    @property
    def stages_manifests(self) -> bool:
        """Whether persist writes the commit's manifests ahead (D16): an append's, a revision's and an
        upsert's are known then. An upsert's revision is not: what it removes depends on every commit
        since the write it revises (``upsert_overwrites.files_to_revise``)."""
        return self in (Kind.APPEND, Kind.REVISION, Kind.UPSERT)


@dataclass(frozen=True)
class ReplacedWrite:
    """The committed write a Pending revision replaces: its commit removes exactly these files, and
    an abort of the revision makes this write the epoch's again, Committed as it was."""

    write_id: str
    pre_commit: PreCommit
    #: Per table, the snapshot that made it visible (``ports.CommittedTables``).
    committed: Mapping[str, str]
    table_uuids: Mapping[str, str] | None
    revision: int
    committed_at: datetime


@dataclass(frozen=True)
class WriteKind:
    """An epoch's write: its ``kind`` and, for a revision, the committed write it replaces."""

    kind: Kind
    #: The committed write a revision replaces (its commit removes that write's files); ``None``
    #: for every other kind.
    replaces: ReplacedWrite | None = None

    @classmethod
    def of(cls, pre_commit: PreCommit, replaces: ReplacedWrite | None = None) -> WriteKind:
        """The kind of ``pre_commit`` as the epoch's row holds it (``replaces``: the row's)."""
        if not pre_commit.written:
            return cls(Kind.NOTHING)
        by_key = any(Kind.of_table(t).by_key for t in pre_commit.tables)
        if replaces is None:
            return cls(Kind.UPSERT if by_key else Kind.APPEND)
        return cls(Kind.UPSERT_REVISION if by_key else Kind.REVISION, replaces)

    @property
    def by_key(self) -> bool:
        return self.kind.by_key

    @property
    def revises(self) -> bool:
        """A revision: the epoch stays Committed with the replaced write until this one commits."""
        return self.kind in (Kind.REVISION, Kind.UPSERT_REVISION)

    @property
    def stages_manifests(self) -> bool:
        return self.kind.stages_manifests

    def shows_replaced(self, table: str) -> bool:
        """Whether the write a revision replaces made a snapshot of its own in ``table`` (its marker
        is the table's newest for the epoch until this one commits)."""
        return self.replaces is not None and self.replaces.committed.get(table, EMPTY) != EMPTY

    @property
    def replaced_write_id(self) -> str | None:
        return None if self.replaces is None else self.replaces.write_id

    @property
    def batches(self) -> bool:
        """Whether recovery may commit it together with its neighbours (D15). Only a plain append:
        a revision replaces files the table must still hold when its snapshot is made, and changes
        by key are checked against the table just before them; both depend on what the epoch
        before them left."""
        return self.kind is Kind.APPEND

    @property
    def in_epoch_order(self) -> bool:
        """Whether the sink's epochs of this kind commit in epoch order (design.md section 5, step
        7): changes by key applied out of order would leave an older state of a key visible."""
        return self.by_key

    @property
    def rewritable(self) -> bool:
        """Whether a conflict with the table is cured by writing the epoch again (D14). Only plain
        changes by key: a revision conflicts with what was committed after the epoch, which a new
        write meets again."""
        return self.kind is Kind.UPSERT

    @property
    def lost_beyond_files(self) -> bool:
        """Whether the write counts as lost also when the sink's checks refuse it for good, not
        only when its data files are gone: a revision whose replaced files left the table can
        never replace them, and changes by key whose table moved under them can never be
        committed as written."""
        return self.revises or self.by_key
