"""Checks for the two keys of every epoch, the sink id and the epoch number, for the one text an
operator writes into a row, an abort's reason, and for what an incremental input's reservation row
keeps of its upstream table: its name and a snapshot id.

A sink id ends up in file paths, snapshot summaries and SQL rows, so it is held to the characters
that are safe in all three; an epoch is a signed 64-bit column and a file-name component. An abort
reason is kept on the row and printed by every listing of the epoch, so it is one line of bounded
length, whichever door it came through (``eo-sink``, the UI, ``SinkOperations``).
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated

from pydantic import PlainValidator

from .errors import InvalidIdentifier
from .redact import find_control

SINK_ID_MAX_LENGTH = 128
#: The longest abort reason taken: a sentence or a paragraph, not a log pasted into the row.
ABORT_REASON_MAX_LENGTH = 2000
EPOCH_MAX = 2**63 - 1
#: The longest upstream table name a reservation row keeps (``input_range.source``).
TABLE_NAME_MAX_LENGTH = 512
#: Iceberg's snapshot ids are signed 64-bit (a ``BigInteger`` column in the meta store).
SNAPSHOT_ID_MIN, SNAPSHOT_ID_MAX = -(2**63), 2**63 - 1
_SINK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_sink_id(sink_id: object) -> str:
    if not isinstance(sink_id, str):
        raise InvalidIdentifier(f"sink_id must be a string, got {type(sink_id).__name__}")
    if not sink_id:
        raise InvalidIdentifier("sink_id is empty")
    if len(sink_id) > SINK_ID_MAX_LENGTH:
        raise InvalidIdentifier(
            f"sink_id {sink_id[:40]!r}... is {len(sink_id)} characters; at most {SINK_ID_MAX_LENGTH}"
        )
    if not _SINK_ID.fullmatch(sink_id) or ".." in sink_id:
        raise InvalidIdentifier(
            f"sink_id {sink_id!r} has characters unsafe in a path: use letters, digits, '_', '-' and '.', "
            "starting with a letter or digit, without '..'"
        )
    return sink_id


def check_epoch(epoch: object) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise InvalidIdentifier(f"epoch must be an integer, got {type(epoch).__name__}")
    if epoch < 0:
        raise InvalidIdentifier(f"epoch {epoch} is negative")
    if epoch > EPOCH_MAX:
        raise InvalidIdentifier(f"epoch {epoch} does not fit in 64 bits")
    return epoch


def check_write_id(write_id: object) -> str:
    if not isinstance(write_id, str):
        raise InvalidIdentifier(f"write_id must be a UUID string, got {type(write_id).__name__}")
    try:
        return str(uuid.UUID(write_id))
    except ValueError:
        raise InvalidIdentifier(f"write_id {write_id!r} is not a UUID") from None


def abort_reason_fault(reason: object) -> str | None:
    """What is wrong with an operator's abort reason, said for whoever typed it, or ``None``."""
    if not isinstance(reason, str) or not reason.strip():
        return "an abort needs a reason (it is kept on the row)"
    if (control := find_control(reason)) is not None:
        # Printed raw by a later listing, an escape sequence would act on the reader's terminal.
        return f"the abort reason holds the control character {control}; give it as one line of printable text"
    if len(reason) > ABORT_REASON_MAX_LENGTH:
        return (
            f"the abort reason is {len(reason)} characters long; at most {ABORT_REASON_MAX_LENGTH} are kept: "
            "shorten it, and say where the details are rather than pasting them"
        )
    return None


def table_name_fault(table: str) -> str | None:
    """What is wrong with an upstream table's name as a reservation row keeps it and every listing
    prints it, said for whoever wrote it, or ``None``."""
    if (control := find_control(table)) is not None:
        # Printed raw by a listing, an escape sequence would act on the reader's terminal.
        return f"{table[:40]!r} holds the control character {control}; name the table in printable characters"
    if len(table) > TABLE_NAME_MAX_LENGTH:
        return f"{table[:40]!r}... is {len(table)} characters long; a table name has at most {TABLE_NAME_MAX_LENGTH}"
    return None


def new_write_id() -> str:
    """A fresh write id: every attempt at writing an epoch gets its own (design.md section 2)."""
    return str(uuid.uuid4())


#: Field types for pydantic models that carry an epoch's keys: the checks above, with their messages.
SinkId = Annotated[str, PlainValidator(check_sink_id)]
Epoch = Annotated[int, PlainValidator(check_epoch)]
WriteId = Annotated[str, PlainValidator(check_write_id)]
