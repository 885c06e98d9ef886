"""How one sink's epochs reach its tables: whether a reader can see an epoch in some of them only.

A fan-out's tables are one catalog transaction only where the catalog offers one (design.md, D18:
a SQL catalog, a REST catalog listing ``transactions/commit``), and a file sink's commit moves its
files one at a time: an operator who finds an epoch in one table and not the next, or chooses a
catalog, must see whether the sink's epochs are atomic across its tables, and why not where not. Each sink kind says it
(``sinks/``), the epoch views show it (``operations``), and the reason is masked as the value is made
(``core.errors``), so no door that shows one can leak a catalog's credentials.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    computed_field,
    field_validator,
    model_serializer,
)

from .errors import mask_userinfo


class Delivery(StrEnum):
    """Whether an epoch becomes visible in all of the sink's tables at once."""

    #: One table, one snapshot: there is nothing to be atomic across.
    ONE_TABLE = "one table"
    #: Every table's snapshot in one catalog transaction, applied all or none for every reader.
    ONE_TRANSACTION = "one catalog transaction"
    #: Every table's snapshot in one request to a catalog that does not say it applies it atomically
    #: (a REST catalog asked for a route it does not list): none when refused, perhaps table by table inside.
    ONE_REQUEST = "one catalog request"
    #: Each table committed on its own: a reader may see the epoch in the first tables before the last.
    TABLE_BY_TABLE = "table by table"
    #: A file sink's one root, its files moved to their final names one at a time.
    FILE_BY_FILE = "file by file"
    #: The sink's catalog could not be opened (or the sink is not registered): the reason says why.
    UNKNOWN = "unknown"


class EpochDelivery(BaseModel):
    """One sink's ``Delivery``, over how many tables (``None`` where the sink is unknown), and why;
    ``eo-sink show --json`` and the UI carry it as ``model_dump(mode="json")``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    how: Delivery
    tables: int | None
    why: str

    @field_validator("tables")
    @classmethod
    def _some(cls, tables: int | None) -> int | None:
        if tables is not None and tables < 1:
            raise ValueError(f"a sink writes at least one table, got {tables}")
        return tables

    @model_serializer(mode="wrap")
    def _atomic_after_tables(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``atomic`` where the doors always showed it, after ``tables``."""
        data: dict[str, Any] = handler(self)
        atomic = data.pop("atomic")
        return {"how": data.pop("how"), "tables": data.pop("tables"), "atomic": atomic, **data}

    @field_validator("why")
    @classmethod
    def _masked(cls, why: str) -> str:
        return mask_userinfo(why)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def atomic(self) -> bool | None:
        """Whether a reader can never see an epoch in some of the sink's tables only (``None``: the
        catalog, or the sink, is not known)."""
        if self.how in (Delivery.ONE_TABLE, Delivery.ONE_TRANSACTION):
            return True
        return None if self.how in (Delivery.ONE_REQUEST, Delivery.UNKNOWN) else False

    @computed_field  # type: ignore[prop-decorator]
    @property
    def text(self) -> str:
        """The line ``eo-sink show`` and the epoch page print."""
        if self.how is Delivery.ONE_TRANSACTION:
            return f"atomic across its {self.tables} tables, one catalog transaction ({self.why})"
        if self.how is Delivery.ONE_REQUEST:
            return f"one catalog request across its {self.tables} tables, atomic only if the catalog applies it so: {self.why}"
        if self.how is Delivery.TABLE_BY_TABLE:
            return f"not atomic across its {self.tables} tables, committed table by table: {self.why}"
        return f"{self.how.value}: {self.why}"


def unknown(tables: int | None, error: BaseException) -> EpochDelivery:
    """The answer when the catalog cannot be opened: the error named, masked, instead of a failure."""
    lines = str(error).strip().splitlines()
    return EpochDelivery(
        how=Delivery.UNKNOWN, tables=tables, why=f"{type(error).__name__}: {lines[0] if lines else ''}"
    )


#: Every one-table Iceberg sink's answer, and every file sink's (one root, whose readers list the
#: directory while the commit moves the files one after the other): known without a catalog or a
#: file system, so ``eo-sink show`` of such a sink imports neither.
SINGLE_TABLE = EpochDelivery(how=Delivery.ONE_TABLE, tables=1, why="each epoch is one snapshot of its one table")
FILE_SINK = EpochDelivery(
    how=Delivery.FILE_BY_FILE,
    tables=1,
    why="a file sink has one root, and its commit moves the epoch's files to their final names one at a "
    "time, so a reader listing the root during a commit can see part of the epoch",
)
