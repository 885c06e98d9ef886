"""Several tables' snapshots in one catalog transaction: a SQL catalog's database transaction, or the
REST protocol's ``transactions/commit``.

So a reader joining a fan-out's tables never sees an epoch in one and not yet in the other. Which
catalogs qualify, how the REST request is made on pyiceberg's private ``RestCatalog`` attributes, and
why SeaweedFS stays table by table: design.md D18.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyiceberg.catalog import TOKEN, Catalog
from pyiceberg.catalog.rest import (
    AUTHORIZATION_HEADER,
    BEARER_PREFIX,
    DEFAULT_ENDPOINTS,
    VIEW_ENDPOINTS,
    Endpoint,
    RestCatalog,
)
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.delivery import SINGLE_TABLE, Delivery, EpochDelivery
from airflow_provider_exactly_once.core.errors import CommitOutcomeUnknown, CommitRefused, SinkUnavailable
from airflow_provider_exactly_once.core.ports import EMPTY, CommitPlan
from airflow_provider_exactly_once.sinks.iceberg.catalog_access import describe_error
from airflow_provider_exactly_once.sinks.iceberg.epoch_snapshot import (
    EpochSnapshot,
    StagedSnapshots,
    TableEntry,
    counted,
    stage_snapshots,
)
from airflow_provider_exactly_once.sinks.iceberg.transaction import (
    FAULT_AFTER_CATALOG_UPDATE,
    FAULT_BEFORE_CATALOG_UPDATE,
    SinkCommitConflict,
    SinkTransaction,
    SqlPointerMoves,
)

log = logging.getLogger(__name__)

ROUTE = Endpoint.from_string("POST /v1/{prefix}/transactions/commit")
#: A catalog property: ``true`` asks for the route where the catalog does not list it, ``false``
#: commits table by table even where it does (docs/operations.md, "A fan-out epoch in some of its tables").
SETTING = "exactly-once.multi-table-commit"
#: A server's answers meaning it has no such route (a 404 naming a missing table or namespace is not one).
_NO_ROUTE = frozenset({404, 405, 501})
_MISSING_THINGS = frozenset({"NoSuchTableException", "NoSuchNamespaceException"})
#: pyiceberg's catalog classes that commit each table on its own, as the epoch views name them.
_KINDS = {"GlueCatalog": "Glue", "HiveCatalog": "Hive", "DynamoDbCatalog": "DynamoDB"}
#: A single-table sink's answer, on any catalog: no catalog need be opened to give it.


class RouteMissing(Exception):
    """The catalog has no multi-table commits: nothing was applied, and the staged manifests are deleted."""


class TableTransactions:
    """Whether one catalog commits several tables at once, learnt once and remembered, and the commit."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._offered, self._why = _offer(catalog)

    @property
    def offered(self) -> bool:
        """Yes where the catalog lists the route, or the connection asks for it and the catalog has
        not refused it yet."""
        return self._offered is not False

    @property
    def known(self) -> bool | None:
        """``True``/``False`` once listed, switched off or tried; ``None`` while only a try can tell."""
        return self._offered

    def delivery(self, tables: int) -> EpochDelivery:
        """How a sink of ``tables`` tables on this catalog commits an epoch, and why: what the epoch
        views show, decided by ``offered`` as the committer decides. A REST catalog that does not
        list the route, asked for it, is one request but not known to be atomic for readers."""
        if tables == 1:
            return SINGLE_TABLE
        if not self.offered:
            return EpochDelivery(how=Delivery.TABLE_BY_TABLE, tables=tables, why=self._why)
        return EpochDelivery(
            how=Delivery.ONE_TRANSACTION if self.known else Delivery.ONE_REQUEST, tables=tables, why=self._why
        )

    def commit(self, staged: Sequence[StagedSnapshots], fault: Callable[[str], None]) -> list[list[int]]:
        """Commit every table's staged transaction at once; per table, its snapshots' ids.

        ``SinkCommitConflict``: another writer moved a table, and nothing was applied; a failure that
        leaves the outcome open is ``CommitOutcomeUnknown``, to be settled by every table's markers.
        """
        what = ", ".join(f"{one.name!r} ({counted(one.snapshot_ids)})" for one in staged)
        commit = f"{staged[0].owner}: the commit of tables {what} in one transaction"
        if isinstance(self._catalog, SqlCatalog):
            return _commit_sql(self._catalog, staged, fault, commit)
        return self._commit_rest(staged, fault, commit)

    def _commit_rest(
        self, staged: Sequence[StagedSnapshots], fault: Callable[[str], None], commit: str
    ) -> list[list[int]]:
        """Every table's staged transaction in one ``transactions/commit`` request. ``RouteMissing``:
        the catalog has no such route (nothing applied)."""
        catalog = self._catalog
        assert isinstance(catalog, RestCatalog)
        producers: list[Any] = []
        changes: list[str] = []
        for one in staged:
            producers += one.tx.detach_producers()
            changes.append(one.tx.commit_request().model_dump_json())
        try:
            headers = self._headers(staged)
        except RouteMissing:
            SinkTransaction.delete_uncommitted(producers)
            raise
        body = ('{"table-changes": [' + ", ".join(changes) + "]}").encode()
        fault(FAULT_BEFORE_CATALOG_UPDATE)
        try:
            response = catalog._session.post(
                catalog.url("transactions/commit", prefixed=True), data=body, headers=headers
            )
        except Exception as exc:
            raise CommitOutcomeUnknown(
                f"{commit} has an unknown outcome: {describe_error(exc, staged[0].table.io.properties)}"
            ) from exc
        status = response.status_code
        if status in (200, 204):
            fault(FAULT_AFTER_CATALOG_UPDATE)
            return [one.committed() for one in staged]
        error = _error_of(response)
        if status == 409 or (status in _NO_ROUTE and error[0] not in _MISSING_THINGS):
            SinkTransaction.delete_uncommitted(producers)  # certainly not applied
            if status == 409:
                raise SinkCommitConflict(f"{error[0]}: {error[1]}")
            self._offered = False
            self._why = f"catalog {catalog.name!r} refused {ROUTE} (HTTP {status} {error[0]})"
            raise RouteMissing(f"HTTP {status} {error[0]}: {error[1]}")
        raise CommitOutcomeUnknown(
            f"{commit} has an unknown outcome: the catalog answered HTTP {status} {error[0]}: {error[1]}"
        )

    def _headers(self, staged: Sequence[StagedSnapshots]) -> dict[str, str]:
        """The bearer token the tables were loaded with, as pyiceberg's ``commit_table`` sends a
        table's own (``LoadTableResult.config["token"]``) in place of the catalog's. One request
        carries one: tables loaded with different tokens are committed table by table (``RouteMissing``
        before anything is sent), each with its own, never with another table's."""
        tokens = {one.table.config.get(TOKEN) for one in staged}
        if len(tokens) == 1:
            token = tokens.pop()
            return {AUTHORIZATION_HEADER: f"{BEARER_PREFIX} {token}"} if token else {}
        self._offered = False
        self._why = f"the tables of catalog {self._catalog.name!r} were loaded with tokens of their own, one each"
        raise RouteMissing(self._why)


def _commit_sql(
    catalog: SqlCatalog, staged: Sequence[StagedSnapshots], fault: Callable[[str], None], commit: str
) -> list[list[int]]:
    """Every table's staged transaction in one database transaction of the SQL catalog
    (``SqlPointerMoves``); the manifests staged are deleted when it certainly failed."""
    producers: list[Any] = []
    for one in staged:
        producers += one.tx.detach_producers()
    fault(FAULT_BEFORE_CATALOG_UPDATE)
    try:
        SqlPointerMoves(catalog, [one.tx for one in staged]).commit(fault, lambda: commit)
    except (SinkCommitConflict, SinkUnavailable, CommitRefused):  # nothing was applied
        SinkTransaction.delete_uncommitted(producers)
        raise
    fault(FAULT_AFTER_CATALOG_UPDATE)
    return [one.committed() for one in staged]


def _offer(catalog: Catalog) -> tuple[bool | None, str]:
    """Whether the catalog commits several tables at once (``None``: asked for, only a try can
    tell), and why, as the epoch views say it."""
    setting = str(catalog.properties.get(SETTING, "")).strip().lower()
    name = catalog.name
    if isinstance(catalog, SqlCatalog):
        if setting == "false":
            return False, f"the connection of SQL catalog {name!r} sets {SETTING} to false"
        return True, (
            f"SQL catalog {name!r} moves every table's pointer in one database transaction, "
            "so a reader sees an epoch in all of them or in none"
        )
    if not isinstance(catalog, RestCatalog):
        kind = _KINDS.get(type(catalog).__name__, type(catalog).__name__)
        return False, (
            f"catalog {name!r} is a {kind} catalog, which commits each table on its own: a reader can see an epoch "
            "in some of the sink's tables before the others, and after a crash between two of them until recovery"
        )
    if setting == "false":
        return False, f"the connection of REST catalog {name!r} sets {SETTING} to false"
    if setting == "true":
        return None, (
            f"the connection of REST catalog {name!r} asks for {ROUTE} ({SETTING}: true); "
            "a catalog that refuses it is committed table by table, and one that moves the tables one after "
            "the other inside it (SeaweedFS, design.md D18) is atomic for a refusal but not for readers"
        )
    if _listed(catalog):
        return True, f"REST catalog {name!r} lists {ROUTE} in its /v1/config"
    return False, (
        f"REST catalog {name!r} does not list {ROUTE} in its /v1/config ({SETTING}: true on its connection asks for it)"
    )


def _listed(catalog: Catalog) -> bool:
    """Whether the endpoints the catalog's ``/v1/config`` published hold the route; a catalog that
    published none (pyiceberg then assumes its defaults, which never include it) does not."""
    endpoints = getattr(catalog, "_supported_endpoints", None)
    if not endpoints or endpoints in (set(DEFAULT_ENDPOINTS), set(DEFAULT_ENDPOINTS) | set(VIEW_ENDPOINTS)):
        return False
    return ROUTE in endpoints


def _error_of(response: Any) -> tuple[str, str]:
    """The REST error response's type and message, or the status text and body."""
    try:
        error = response.json()["error"]
        return str(error.get("type", "")), str(error.get("message", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return str(response.reason or ""), str(response.text or "")[:500]


def stage_together(tables: Sequence[tuple[Table, Sequence[EpochSnapshot]]], branch: str) -> list[StagedSnapshots]:
    """Every table's transaction staged with its snapshots; a failure on one deletes what the others
    staged."""
    staged: list[StagedSnapshots] = []
    try:
        for table, snapshots in tables:
            staged.append(stage_snapshots(table, snapshots, branch=branch))
    except BaseException:
        for one in staged:
            one.tx.discard()
        raise
    return staged


def report_torn(
    plans: Sequence[CommitPlan],
    committed: Sequence[Mapping[str, str]],
    pending: Sequence[Sequence[TableEntry]],
    catalog: str,
) -> None:
    """Where the catalog commits a fan-out all or none, an epoch shown by some of its tables and not
    the others was committed table by table (by an earlier version, or before the catalog offered
    it), or the catalog applied part of a transaction: the rest is committed now, and said, loudly.

    ``committed[i]``: the tables plan ``i`` is committed in already; ``pending``: per table, the
    entries still to commit."""
    missing: dict[int, list[str]] = {}
    for entries in pending:
        for entry in entries:
            missing.setdefault(entry.index, []).append(entry.write.table)
    for index, names in missing.items():
        shown = [name for name, snapshot_id in committed[index].items() if snapshot_id != EMPTY]
        if shown:
            log.error(
                "%s: table(s) %s already show this epoch and %s do not, although catalog %r commits a "
                "fan-out's tables in one transaction; committing the missing ones now (docs/operations.md, "
                '"A fan-out epoch in some of its tables")',
                plans[index].pre_commit.describe(),
                ", ".join(shown),
                ", ".join(names),
                catalog,
            )
