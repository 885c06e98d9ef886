"""Upsert sinks: what an epoch of changes is, and how its rows are read.

Two changes of one key in one epoch need ``order_by`` (the greatest wins, a tie is refused): taking
"the last one" of an unordered input would pick a different row on every retry. No Spark and no
pyiceberg here, so an Airflow worker validates the settings the Spark job applies. The contract:
design.md D14 and "The Iceberg commit", step 7.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: The operation a change row carries once its operation column is read.
Operation = Literal["upsert", "delete"]


class UpsertSpec(BaseModel):
    """How an epoch's rows are changes by key; validated once, where the sink is configured."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    #: The primary key: the table's identifier fields (set on the table at the first commit when it
    #: has none and the columns allow it; a table whose identifier fields differ is refused).
    key: tuple[str, ...] = Field(min_length=1)
    #: The input column naming each row's operation; ``None``: every row is an insert or update.
    #: It is never written to the table (unless the table has a column of that name).
    op_column: str | None = None
    #: Values of ``op_column`` meaning insert, update and delete (compared as text).
    insert_values: tuple[str, ...] = ("insert", "I", "c", "r")
    update_values: tuple[str, ...] = ("update", "U", "u")
    delete_values: tuple[str, ...] = ("delete", "D", "d")
    #: The input column ordering two changes of one key in the epoch (greatest wins); ``None``:
    #: two changes of one key refuse the epoch.
    order_by: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if len(set(self.key)) != len(self.key):
            raise ValueError(f"key names a column twice: {list(self.key)}")
        if any(not name or name != name.strip() for name in self.key):
            raise ValueError(f"key columns must be non-blank names without surrounding spaces: {list(self.key)}")
        groups = {"insert_values": self.insert_values, "update_values": self.update_values}
        groups["delete_values"] = self.delete_values
        seen: dict[str, str] = {}
        for group, values in groups.items():
            for value in values:
                if value in seen and seen[value] != group:
                    raise ValueError(f"operation value {value!r} is in both {seen[value]} and {group}")
                seen[value] = group
        if not self.delete_values:
            raise ValueError("delete_values is empty: name at least one value meaning delete")
        for name in (self.op_column, self.order_by):
            if name is not None and name in self.key:
                raise ValueError(f"column {name!r} cannot be both a key column and op_column or order_by")
        if self.op_column is not None and self.op_column == self.order_by:
            raise ValueError(f"op_column and order_by are both {self.op_column!r}")
        return self

    def operation(self, value: str) -> Operation | None:
        """The operation an ``op_column`` value names; ``None`` for a value it does not know."""
        if value in self.delete_values:
            return "delete"
        if value in self.upsert_values:
            return "upsert"
        return None

    @property
    def upsert_values(self) -> tuple[str, ...]:
        """Values meaning insert or update: both are applied alike, as the row's new state."""
        return (*self.insert_values, *self.update_values)

    @property
    def known_values(self) -> tuple[str, ...]:
        return (*self.upsert_values, *self.delete_values)

    def change_columns(self) -> tuple[str, ...]:
        """Input columns that describe the change rather than the row."""
        return tuple(name for name in (self.op_column, self.order_by) if name is not None)


class ChangeCounts(BaseModel):
    """What an upsert epoch did to one table, counted by its Spark write against the table it read."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    inserted: int = Field(default=0, ge=0)
    updated: int = Field(default=0, ge=0)
    deleted: int = Field(default=0, ge=0)
    #: Deletes of keys the table did not hold: nothing to do, counted so they are seen.
    deletes_of_absent_keys: int = Field(default=0, ge=0)
    #: Rows of rewritten files carried over unchanged (the cost of copy-on-write).
    rows_rewritten: int = Field(default=0, ge=0)

    def __add__(self, other: ChangeCounts) -> ChangeCounts:
        return ChangeCounts(**{name: getattr(self, name) + getattr(other, name) for name in type(self).model_fields})

    def describe(self) -> str:
        text = f"{self.inserted} inserted, {self.updated} updated, {self.deleted} deleted"
        if self.deletes_of_absent_keys:
            text += f" ({self.deletes_of_absent_keys} deletes of absent keys)"
        return text


class RevisedWrite(BaseModel):
    """In the pre-commit of an upsert revision, per table: the committed write of the epoch it
    replaces (design.md D14). The revision was planned at the table as it was before that write,
    so its commit removes that write's files and undoes its changes; these lists let the commit
    check that nothing committed since depends on them, even before the revision is persisted."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    write_id: str = Field(min_length=1)
    #: The data files the revised write added: its overwrite removes them.
    added: list[str] = Field(default_factory=list)
    #: The files the revised write rewrote: the revision rewrites them again, from their rows before
    #: it, so that the revised write's changes of keys the revision does not change are undone.
    rewritten: list[str] = Field(default_factory=list)
    #: The revised write's key range (as ``TableWrite.key_lower_bounds``): a file committed since
    #: that may hold one of its keys makes the revision ill-defined.
    key_lower_bounds: dict[str, str] = Field(default_factory=dict)
    key_upper_bounds: dict[str, str] = Field(default_factory=dict)


class RevisionBasis(RevisedWrite):
    """What the write task hands the Spark job of an upsert revision (``core.decisions``):
    the write it revises, and the table state to plan the revision at. That state is the parent
    of ``parent_of`` (the revised write's own commit) when set, else ``snapshot_id`` (``None``:
    the table before its first snapshot)."""

    parent_of: int | None = None
    snapshot_id: int | None = None
    #: The table the revised write was committed to: a table re-created since holds none of its
    #: files, so the write is an ordinary one there (persist re-opens the epoch for it).
    table_uuid: str | None = None

    def revised(self) -> RevisedWrite:
        return RevisedWrite.model_validate(self.model_dump(include=set(RevisedWrite.model_fields)))


class RewrittenFile(BaseModel):
    """A data file of the table an upsert write rewrote: the commit removes it in the same snapshot
    that adds the write's files, and refuses when it is no longer in the table."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    path: str = Field(min_length=1)
    record_count: int = Field(ge=0)
