"""``core.cleanups``: which finished write persist takes when the write task returned none, on a
listing of its own (what each folder holds, how old its files are) and a registry of known writes."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from airflow_provider_exactly_once.core.cleanups import (
    FileAge,
    NoWriteLeft,
    WriteFolder,
    WriteLocation,
    left_writes,
    newest_left_write,
)
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite

SINK, EPOCH = "s", 1000
NOW = datetime.now(UTC)


def write_id(n: int) -> str:
    return str(uuid.UUID(int=n))


class Registry:
    def __init__(self, known: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self._known = set(known)

    def known_writes(self, sink_id: str, write_ids: Sequence[str]) -> set[str]:
        return self._known & set(write_ids)


def left(n: int, *, epoch: int = EPOCH, sink: str = SINK, names: int | None = None) -> bytes:
    location = f"s3://bkt/t/_eo/{write_id(n)}"
    pre = PreCommit(
        sink_id=sink, epoch=epoch, write_id=write_id(names or n), tables=[TableWrite(table="ns.t", location=location)]
    )
    return pre.model_dump_json().encode()


def folder(n: int, content: bytes | None, age: timedelta | None) -> list[WriteFolder]:
    at = None if age is None else NOW - age
    return [
        WriteFolder(
            WriteLocation("ns.t", f"s3://bkt/t/_eo/{write_id(n)}"), partial(FileAge, 2, at, at), lambda: content
        )
    ]


def test_the_newest_finished_write_of_the_epoch_is_taken_and_the_rest_are_not() -> None:
    folders = {
        write_id(1): folder(1, left(1), timedelta(minutes=30)),  # a dead driver's, finished earlier
        write_id(2): folder(2, left(2), timedelta(minutes=1)),  # the retry's
        write_id(3): folder(3, None, timedelta(seconds=10)),  # half written: no pre-commit
        write_id(4): folder(4, b'{"sink_id": "s", "epo', timedelta(seconds=5)),  # cut short
        write_id(5): folder(5, left(5, epoch=EPOCH + 1), timedelta(seconds=1)),  # another epoch's
        write_id(6): folder(6, left(6, names=7), timedelta(seconds=1)),  # names another write
        write_id(8): folder(8, left(8, sink="other"), timedelta(seconds=1)),  # another sink's
        write_id(9): folder(9, left(9), timedelta(seconds=1)),  # newest, but the store knows it
    }
    registry = Registry({write_id(9)})

    found = left_writes(SINK, EPOCH, folders, registry)  # type: ignore[arg-type]

    assert [w.pre_commit.write_id for w in found] == [write_id(2), write_id(1)]
    assert newest_left_write(SINK, EPOCH, folders, registry, "write").write_id == write_id(2)  # type: ignore[arg-type]


def test_writes_of_unknown_age_come_after_dated_ones() -> None:
    folders = {write_id(1): folder(1, left(1), None), write_id(2): folder(2, left(2), timedelta(hours=5))}
    found = left_writes(SINK, EPOCH, folders, Registry())  # type: ignore[arg-type]
    assert [w.pre_commit.write_id for w in found] == [write_id(2), write_id(1)]


def test_nothing_left_is_refused_naming_the_task_and_what_to_do() -> None:
    folders = {write_id(1): folder(1, None, timedelta(seconds=3))}
    with pytest.raises(NoWriteLeft, match=r"task 'write' returned no pre-commit.*epoch 1000.*clear the write task"):
        newest_left_write(SINK, EPOCH, folders, Registry(), "write")  # type: ignore[arg-type]
    assert not NoWriteLeft.retryable
