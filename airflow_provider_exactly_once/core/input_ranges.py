"""Incremental inputs: which snapshot range of an upstream Iceberg table each epoch of a sink reads.

The range is reserved in the meta store before the write reads it and never changes, so a retry, a
clear or a reprocess reads the same rows; ``range_decision`` holds the rules, as pure functions of
the sink's reservations and their epochs' statuses (nothing here reads a table or the store). The
contract: design.md D21.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from .epochs import SNAPSHOT_ID_MAX, SNAPSHOT_ID_MIN, EpochStatus, table_name_fault
from .errors import EarlierEpochUndecided, InputRangeRefused, InvalidPreCommit

#: The ``kind`` of an incremental input's source positions in a pre-commit.
POSITIONS_KIND = "iceberg_snapshots"


def _table_name(table: str) -> str:
    if (fault := table_name_fault(table)) is not None:
        raise ValueError(fault)
    return table


#: An Iceberg snapshot id: an integer (never a bool) that a signed 64-bit column holds.
SnapshotId = Annotated[int, Field(strict=True, ge=SNAPSHOT_ID_MIN, le=SNAPSHOT_ID_MAX)]


class SnapshotRange(BaseModel):
    """The upstream snapshots an epoch reads: those after ``after_snapshot_id`` (``None``: from the
    table's first) up to and including ``to_snapshot_id``; ``to_snapshot_id`` equal to
    ``after_snapshot_id`` (or both ``None``: the table had no snapshot) is an empty range."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: Annotated[str, Field(min_length=1), AfterValidator(_table_name)]
    after_snapshot_id: SnapshotId | None = None
    to_snapshot_id: SnapshotId | None = None

    @model_validator(mode="after")
    def _ends(self) -> Self:
        if self.to_snapshot_id is None and self.after_snapshot_id is not None:
            raise ValueError(
                f"range of {self.table}: it starts after snapshot {self.after_snapshot_id} and ends nowhere"
            )
        return self

    @property
    def empty(self) -> bool:
        return self.to_snapshot_id == self.after_snapshot_id

    @property
    def end(self) -> int | None:
        """Where the next range starts when this one is committed."""
        return self.to_snapshot_id

    def describe(self) -> str:
        after = "its first snapshot" if self.after_snapshot_id is None else f"snapshot {self.after_snapshot_id}"
        if self.empty:
            return f"{self.table}: nothing after {after}"
        start = "from its first snapshot" if self.after_snapshot_id is None else f"after {after}"
        return f"{self.table}: {start} to snapshot {self.to_snapshot_id}"

    def positions(self, **read: Any) -> dict[str, Any]:
        """The range as a pre-commit's source positions, with what the read found (``read``)."""
        return {"kind": POSITIONS_KIND, **self.model_dump(), **read}

    @classmethod
    def of_positions(cls, positions: dict[str, Any] | None) -> SnapshotRange | None:
        """The range a pre-commit read, or ``None`` when its input was not incremental. Positions of
        the incremental kind that hold no range are ``InvalidPreCommit`` naming the field: a
        pre-commit refuses them where it enters (``positions_fault``), so only a row stored before
        that check can still hold them."""
        parsed = _parsed_positions(positions)
        if isinstance(parsed, str):
            raise InvalidPreCommit(f"source_positions: {parsed}")
        return parsed


def positions_fault(positions: dict[str, Any] | None) -> str | None:
    """Why a pre-commit's ``source_positions`` of the incremental kind hold no range, or ``None``."""
    parsed = _parsed_positions(positions)
    return parsed if isinstance(parsed, str) else None


def _parsed_positions(positions: dict[str, Any] | None) -> SnapshotRange | str | None:
    if not positions or positions.get("kind") != POSITIONS_KIND:
        return None
    try:
        return SnapshotRange.model_validate(
            {k: positions.get(k) for k in ("table", "after_snapshot_id", "to_snapshot_id")}
        )
    except ValidationError as exc:
        faults = "; ".join(
            ".".join(map(str, e["loc"])) + (": " if e["loc"] else "") + e["msg"].removeprefix("Value error, ")
            for e in exc.errors(include_url=False)
        )
    return (
        f"kind {POSITIONS_KIND!r} but no snapshot range ({faults}); an incremental write records the range it "
        "read as SnapshotRange.positions() gives it: table, after_snapshot_id and to_snapshot_id"
    )


@dataclass(frozen=True)
class Link:
    """One reservation of the chain: the epoch, its place in the chain, and its range."""

    epoch: int
    position: int
    range: SnapshotRange


@dataclass(frozen=True)
class Replay:
    """The epoch reserved its range already: read it again."""

    range: SnapshotRange
    why: str


@dataclass(frozen=True)
class Reserve:
    """A new link at ``position``: the range starts after ``after_snapshot_id`` and ends at the
    upstream's current snapshot, which the caller reads when it inserts the link."""

    position: int
    after_snapshot_id: int | None
    why: str


_SETTLED = (EpochStatus.COMMITTED, EpochStatus.ABORTED)


def range_decision(
    sink_id: str,
    epoch: int,
    table: str,
    links: Sequence[Link],
    status_of: Callable[[int], EpochStatus | None],
    start_after_snapshot_id: int | None = None,
) -> Replay | Reserve:
    """What epoch ``epoch`` of ``sink_id`` reads of ``table``, given the sink's chain (``links``,
    any order) and each epoch's row status (``None``: no row). Raises the refusal or the wait."""
    chain = sorted(links, key=lambda link: link.position)
    own = next((link for link in chain if link.epoch == epoch), None)
    if own is not None:
        _same_table(sink_id, epoch, own, table)
        later = [link for link in chain if link.position > own.position]
        status = status_of(epoch)
        if later and status in (EpochStatus.ABORTED, None):
            raise InputRangeRefused(
                f"sink {sink_id!r} epoch {epoch}: its range ({own.range.describe()}) was read again by epoch "
                f"{later[0].epoch} after this epoch was {'aborted' if status else 'left unpersisted'}, so its rows "
                "are delivered there; writing this epoch again would deliver them twice. Leave this epoch aborted "
                "(nothing is lost)"
            )
        return Replay(own.range, f"epoch {epoch} reserved {own.range.describe()} before: read again")
    newer = [link for link in chain if link.epoch > epoch]
    if newer:
        first = min(newer, key=lambda link: link.epoch)
        raise InputRangeRefused(
            f"sink {sink_id!r} epoch {epoch}: epoch {first.epoch} was written before it and read {table} up to "
            f"snapshot {chain[-1].range.end}; an incremental input reads forward only, so an interval that was "
            "never written cannot be read afterwards (a reprocess of a written epoch reads its own range again)"
        )
    if not chain:
        return Reserve(0, start_after_snapshot_id, f"the first epoch of sink {sink_id!r} to read {table}")
    last = chain[-1]
    _same_table(sink_id, epoch, last, table)
    if status_of(last.epoch) not in _SETTLED:
        raise EarlierEpochUndecided(
            f"sink {sink_id!r} epoch {epoch}: epoch {last.epoch} ({last.range.describe()}) is not committed or "
            "aborted yet, and the range of this epoch starts where the last committed one ended; retrying after "
            f"it settles succeeds (a run of epoch {last.epoch} that will never finish is aborted with "
            f"'eo-sink abort {sink_id} {last.epoch}')"
        )
    committed = [link for link in chain if status_of(link.epoch) == EpochStatus.COMMITTED]
    after = committed[-1].range.end if committed else start_after_snapshot_id
    source = f"epoch {committed[-1].epoch}'s end" if committed else "the input's start"
    return Reserve(last.position + 1, after, f"after {source}: {table} after snapshot {after}")


def _same_table(sink_id: str, epoch: int, link: Link, table: str) -> None:
    if link.range.table != table:
        raise InputRangeRefused(
            f"sink {sink_id!r} epoch {epoch}: the sink's epochs read {link.range.table} (epoch {link.epoch}), "
            f"this input names {table}; a sink reads one upstream table for its whole history: give the new "
            "input a new sink id"
        )


def range_read_elsewhere(
    sink_id: str, epoch: int, positions: dict[str, Any] | None, taken: Callable[[SnapshotRange], int | None]
) -> InputRangeRefused | None:
    """The commit's fence: an epoch's range (its write's ``positions``) may not go in when another
    epoch that read from the same start is committed or decided. The chain refuses that at
    reservation; this holds it when an aborted epoch was written again at the moment its successor
    reserved, both deciding before either was persisted. A row stored before its positions were
    checked (``positions_fault``) and holding no range is refused too: which rows it read is unknown."""
    if (fault := positions_fault(positions)) is not None:
        return InputRangeRefused(
            f"sink {sink_id!r} epoch {epoch}: its write's source_positions: {fault}. Which upstream rows it read "
            f"cannot be told, so it is not committed; abort it ('eo-sink abort {sink_id} {epoch} --reason ... "
            "--force'): nothing is lost, the next epoch reads from the last committed epoch's end"
        )
    reserved = SnapshotRange.of_positions(positions)
    if reserved is None or reserved.empty:
        return None
    other = taken(reserved)
    if other is None:
        return None
    return InputRangeRefused(
        f"sink {sink_id!r} epoch {epoch}: its range ({reserved.describe()}) starts where epoch {other}'s "
        f"does, and epoch {other} is committed or being committed: its rows are delivered there. This epoch "
        "is not committed; abort it (nothing is lost)"
    )
