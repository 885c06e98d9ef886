"""Typed descriptions of a sink, validated once at construction (as cosmos's config classes are).

A DAG author writes one of these per sink; the Airflow layer resolves its connections and calls
``committer(...)``. Both serialise to plain dicts, so a sink's configuration can be recorded next to
its state and rebuilt by a process that never imported the DAG (the recovery DAG).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from airflow_provider_exactly_once.core.epochs import check_sink_id
from airflow_provider_exactly_once.core.errors import (
    InvalidPreCommit,
    InvalidSinkConfig,
    find_control,
    has_userinfo,
    mask_userinfo,
)
from airflow_provider_exactly_once.core.faults import FaultHook, no_faults
from airflow_provider_exactly_once.filesystems import (
    check_storage_conn_id,
    given_storage_options,
    refuse_secret_options,
)

if TYPE_CHECKING:
    # The committers bring pyiceberg, pyarrow and fsspec's filesystems: DAG files import these configs
    # at every parse, and only the tasks that commit need them (imported in ``committer``).
    from pyiceberg.catalog import Catalog

    from airflow_provider_exactly_once.core.cleanups import WriteFolderListing
    from airflow_provider_exactly_once.core.epochs import OnReprocess
    from airflow_provider_exactly_once.core.ports import SinkCommitter
    from airflow_provider_exactly_once.core.upserts import UpsertSpec
    from airflow_provider_exactly_once.sinks.files import FileSinkCommitter
    from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter


def _sink_id(sink_id: str) -> None:
    try:
        check_sink_id(sink_id)
    except InvalidPreCommit as exc:
        raise InvalidSinkConfig(str(exc)) from None


def _printable(sink_id: str, name: str, value: str) -> None:
    """A name that is registered and printed by the UI, eo-sink and the logs holds no control
    character: one that did would act on the terminal of whoever lists the sink."""
    if (control := find_control(value)) is not None:
        raise InvalidSinkConfig(
            f"sink {sink_id!r}: {name} {value!r} holds the control character {control}; "
            "give it in printable characters only"
        )


#: The temporary view a ``TableSelect.query`` reads the epoch's input from (the Spark write's name).
INPUT_VIEW = "epoch_input"


@dataclass(frozen=True)
class TableSelect:
    """Which part of the epoch's input one table of a fan-out gets, when not all of it.

    The Spark write reads the input once and gives each table its own part: ``where``, a Spark SQL
    condition over the input's columns (``"event_type = 'purchase'"``), or ``query``, a Spark SQL
    query reading the view ``epoch_input`` (``"SELECT user_id, sum(amount) AS total FROM epoch_input
    GROUP BY user_id"``). Either is fitted to the table's schema like the input itself.
    """

    where: str | None = None
    query: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("where", "query") if getattr(self, name) is not None]
        if len(given) != 1:
            raise InvalidSinkConfig(
                f"a table's selection takes exactly one of where= and query=, not {given or 'none'}"
            )
        for name in given:
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InvalidSinkConfig(f"a table's selection: {name} is not a non-empty string: {value!r}")
        if self.query is not None and INPUT_VIEW not in self.query.lower():
            raise InvalidSinkConfig(
                f"a table's selection: query {self.query!r} does not read the epoch's input, the view {INPUT_VIEW!r}"
            )

    def to_dict(self) -> dict[str, str]:
        return {"where": self.where} if self.where is not None else {"query": str(self.query)}


@dataclass(frozen=True)
class IcebergSinkConfig:
    """One or more Iceberg tables written together (fan-out), reached through an Iceberg connection.

    ``select`` maps a table to the part of the input it gets (``TableSelect``); a table it does not
    name gets every row. One Spark write fills every table, so the split lives with the tables.
    """

    sink_id: str
    tables: tuple[str, ...]
    iceberg_conn_id: str = "iceberg_default"
    branch: str = "main"
    allow_schema_evolution: bool = False
    clock_skew: timedelta = timedelta(minutes=10)
    max_commit_attempts: int = 8
    # Out of the hash (a dict has none), so the config stays hashable; equality still compares it.
    select: Mapping[str, TableSelect] = field(default_factory=dict, hash=False)
    #: What a newer generation's write (a cleared run, a reprocess backfill) does to a committed epoch:
    #: ``"replace"`` it atomically (a revision), or ``"keep"`` what was committed, for inputs that
    #: cannot be read again (the write task then skips its Spark job).
    on_reprocess: OnReprocess = "replace"
    #: Every row is a change by key (insert or update, or a delete where the spec's ``op_column``
    #: says so), applied copy-on-write (``core.upserts.UpsertSpec``); ``None``: every row is new.
    upsert: UpsertSpec | None = field(default=None, hash=False)
    #: The earlier spelling of ``upsert`` (``mode="upsert", key=..., op_column=..., op_values=...,
    #: order_by=...``), accepted for one release with a ``DeprecationWarning``.
    mode: InitVar[str | None] = None
    key: InitVar[str | tuple[str, ...] | None] = None
    op_column: InitVar[str | None] = None
    op_values: InitVar[Mapping[str, tuple[str, ...]] | None] = None
    order_by: InitVar[str | None] = None
    kind: Literal["iceberg"] = field(default="iceberg", init=False)

    def __post_init__(
        self,
        mode: str | None,
        key: str | tuple[str, ...] | None,
        op_column: str | None,
        op_values: Mapping[str, tuple[str, ...]] | None,
        order_by: str | None,
    ) -> None:
        _sink_id(self.sink_id)
        if isinstance(self.tables, str):
            object.__setattr__(self, "tables", (self.tables,))
        object.__setattr__(self, "tables", tuple(self.tables))
        if not self.tables:
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: name at least one table")
        for table in self.tables:
            if not isinstance(table, str) or "." not in table.strip(".") or table != table.strip():
                raise InvalidSinkConfig(f"sink {self.sink_id!r}: table {table!r} is not 'namespace.table'")
            _printable(self.sink_id, "table", table)
        if len(set(self.tables)) != len(self.tables):
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: a table is listed twice in {list(self.tables)}")
        if not self.iceberg_conn_id:
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: iceberg_conn_id is empty")
        if not self.branch:
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: branch is empty")
        _printable(self.sink_id, "branch", self.branch)
        if self.clock_skew < timedelta(0):
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: clock_skew {self.clock_skew} is negative")
        if self.max_commit_attempts < 1:
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: max_commit_attempts must be at least 1")
        object.__setattr__(self, "select", _selections(self.sink_id, self.tables, self.select))
        _on_reprocess(self.sink_id, self.on_reprocess)
        given = {"mode": mode, "key": key, "op_column": op_column, "op_values": op_values, "order_by": order_by}
        if any(value is not None for value in given.values()):
            warnings.warn(
                f"sink {self.sink_id!r}: IcebergSinkConfig(mode=, key=, op_column=, op_values=, order_by=) is "
                "deprecated; write upsert=UpsertSpec(key=..., op_column=..., order_by=...) "
                "(from airflow_provider_exactly_once import UpsertSpec)",
                DeprecationWarning,
                stacklevel=3,
            )
            if self.upsert is not None:
                raise InvalidSinkConfig(
                    f"sink {self.sink_id!r}: give upsert=UpsertSpec(...) or mode='upsert', not both"
                )
            object.__setattr__(self, "upsert", _upsert_spec(self.sink_id, given))

    def committer(self, catalog: Catalog, *, fault: FaultHook = no_faults) -> IcebergSinkCommitter:
        from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter

        return IcebergSinkCommitter(
            catalog,
            branch=self.branch,
            clock_skew=self.clock_skew,
            max_attempts=self.max_commit_attempts,
            allow_schema_evolution=self.allow_schema_evolution,
            fault=fault,
        )

    def write_folders(self, committer: SinkCommitter) -> WriteFolderListing:
        """Its write folders as the orphan scan lists them, through the catalog its committer
        (``committer``'s own) commits with: a scan opens nothing of its own."""
        from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
        from airflow_provider_exactly_once.sinks.write_locations import IcebergWriteFolders

        assert isinstance(committer, IcebergSinkCommitter), "the committer of this config (committer)"
        return IcebergWriteFolders(committer.catalog, self.tables)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sink_id": self.sink_id,
            "tables": list(self.tables),
            "iceberg_conn_id": self.iceberg_conn_id,
            "branch": self.branch,
            "allow_schema_evolution": self.allow_schema_evolution,
            "clock_skew_s": self.clock_skew.total_seconds(),
            "max_commit_attempts": self.max_commit_attempts,
            # Left out when empty, so the registered form of a sink without selections is unchanged.
            **({"select": {t: s.to_dict() for t, s in self.select.items()}} if self.select else {}),
            **({"on_reprocess": self.on_reprocess} if self.on_reprocess != "replace" else {}),
            **({"upsert": self.upsert.model_dump(mode="json")} if self.upsert is not None else {}),
        }


#: The earlier, flat spelling of the upsert settings: ``IcebergSinkConfig``'s deprecated arguments,
#: and the registered form of a sink recorded before ``upsert`` (which ``sink_config_from_dict`` reads).
_FLAT_UPSERT = ("mode", "key", "op_column", "op_values", "order_by")


def _upsert_spec(sink_id: str, given: Mapping[str, Any]) -> UpsertSpec | None:
    """The spec the flat settings describe, or ``None`` for an append sink."""
    mode = given.get("mode") or "append"
    if mode not in ("append", "upsert"):
        raise InvalidSinkConfig(f"sink {sink_id!r}: mode must be 'append' or 'upsert', got {mode!r}")
    key = given.get("key") or ()
    extra = [n for n in ("op_column", "order_by", "op_values") if given.get(n)]
    if mode == "append":
        if key or extra:
            raise InvalidSinkConfig(
                f"sink {sink_id!r}: key, op_column, op_values and order_by are for mode='upsert' "
                f"(given: {['key'] * bool(key) + extra}); an append sink adds every row"
            )
        return None
    values = dict(given.get("op_values") or {})
    unknown = sorted(set(values) - {"insert", "update", "delete"})
    if unknown:
        raise InvalidSinkConfig(f"sink {sink_id!r}: op_values keys are insert, update and delete, not {unknown}")
    spec = {
        "key": (key,) if isinstance(key, str) else tuple(key),
        "op_column": given.get("op_column"),
        "order_by": given.get("order_by"),
        **{f"{name}_values": tuple(v) for name, v in values.items()},
    }
    return _validated_spec(sink_id, spec)


def _validated_spec(sink_id: str, spec: Mapping[str, Any]) -> UpsertSpec:
    # The upsert models only for an upsert sink: an append sink's DAG parse need not build them.
    from pydantic import ValidationError

    from airflow_provider_exactly_once.core.upserts import UpsertSpec

    try:
        return UpsertSpec.model_validate(spec)
    except ValidationError as exc:
        faults = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'upsert'}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise InvalidSinkConfig(
            f"sink {sink_id!r}: an upsert sink needs UpsertSpec(key=(column, ...)) naming the primary key; {faults}"
        ) from None


def _on_reprocess(sink_id: str, value: object) -> None:
    from airflow_provider_exactly_once.core.epochs import ON_REPROCESS

    if value not in ON_REPROCESS:
        raise InvalidSinkConfig(
            f"sink {sink_id!r}: on_reprocess must be one of {list(ON_REPROCESS)}, got {value!r}: 'replace' makes a "
            "cleared or reprocessed run replace the epoch it re-writes, 'keep' keeps what was committed"
        )


def _selections(sink_id: str, tables: tuple[str, ...], select: object) -> dict[str, TableSelect]:
    """The per-table selections, each a ``TableSelect`` (its dict form accepted), for tables of the sink."""
    if not isinstance(select, Mapping):
        raise InvalidSinkConfig(f"sink {sink_id!r}: select maps table names to TableSelect, got {select!r}")
    out: dict[str, TableSelect] = {}
    for table, selection in select.items():
        if table not in tables:
            raise InvalidSinkConfig(f"sink {sink_id!r}: select names {table!r}, which is not one of {list(tables)}")
        try:
            if isinstance(selection, Mapping):
                selection = TableSelect(**selection)
        except (TypeError, InvalidSinkConfig) as exc:
            raise InvalidSinkConfig(f"sink {sink_id!r}: select of {table!r}: {exc}") from None
        if not isinstance(selection, TableSelect):
            raise InvalidSinkConfig(f"sink {sink_id!r}: select of {table!r} is not a TableSelect: {selection!r}")
        out[table] = selection
    return out


@dataclass(frozen=True)
class FileSinkConfig:
    """A directory of Parquet files (local path or fsspec URL) with deterministic final names.

    ``storage_conn_id`` names an Airflow connection of type ``aws`` holding the object store's
    credentials; it is read only where the filesystem is opened (the runtime resolves it for
    ``committer``, ``hooks.storage.resolved_storage_options``), so the config that is registered, passed through
    XCom and shown by the UI carries the id, never the secret.
    ``storage_options`` takes the other, non-secret fsspec options and refuses credentials.
    """

    sink_id: str
    root: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    #: Only ``"keep"``: see ``__post_init__``.
    on_reprocess: OnReprocess = "keep"
    storage_conn_id: str | None = None
    kind: Literal["files"] = field(default="files", init=False)

    def __post_init__(self) -> None:
        _sink_id(self.sink_id)
        _on_reprocess(self.sink_id, self.on_reprocess)
        if self.on_reprocess == "replace":
            # Final names are deterministic per epoch, and readers list the directory: a second write's
            # files cannot take the place of the first's in one step a reader could not see half done.
            raise InvalidSinkConfig(
                f"sink {self.sink_id!r}: a file sink cannot replace a committed epoch atomically (readers list "
                "the directory, so they would see the old and new files side by side while they are swapped); "
                "use on_reprocess='keep', or an Iceberg sink for data that is reprocessed"
            )
        if not isinstance(self.root, str) or not self.root.strip():
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: root is empty")
        if has_userinfo(self.root):
            # The root is recorded in the sink registry and shown by the UI, eo-sink and the logs.
            raise InvalidSinkConfig(
                f"sink {self.sink_id!r}: root {mask_userinfo(self.root)!r} holds credentials (user:password@, "
                "or a secret query parameter such as token= or sig=); keep them out of the root and out of "
                "storage_options: put them in an Airflow connection of type 'aws' and name it in storage_conn_id"
            )
        _printable(self.sink_id, "root", self.root)
        if ".." in self.root.replace("\\", "/").split("/"):
            # The registered root would name one directory and the files go to another.
            raise InvalidSinkConfig(
                f"sink {self.sink_id!r}: root {self.root!r} has a '..' segment; give the directory's own path, "
                "without '..'"
            )
        what = f"sink {self.sink_id!r}"
        object.__setattr__(self, "storage_options", refuse_secret_options(self.storage_options, what=what))
        check_storage_conn_id(self.storage_conn_id, what=what)

    def committer(
        self, *, fault: FaultHook = no_faults, storage_options: Mapping[str, Any] | None = None
    ) -> FileSinkCommitter:
        """``storage_options``: resolved by the runtime when ``storage_conn_id`` names a connection."""
        options = given_storage_options(
            self.storage_options, self.storage_conn_id, storage_options, what=f"sink {self.sink_id!r}"
        )
        from airflow_provider_exactly_once.sinks.files import FileSinkCommitter

        return FileSinkCommitter(self.root, storage_options=options, fault=fault)

    def write_folders(self, committer: SinkCommitter) -> WriteFolderListing:
        """Its staging folders as the orphan scan lists them, on the file system of its committer
        (``committer``'s own), the one its deletes use."""
        from airflow_provider_exactly_once.sinks.files import FileSinkCommitter
        from airflow_provider_exactly_once.sinks.write_locations import FileWriteFolders

        assert isinstance(committer, FileSinkCommitter), "the committer of this config (committer)"
        return FileWriteFolders(committer)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sink_id": self.sink_id,
            "root": self.root,
            "storage_options": dict(self.storage_options),
            # Left out when unset, so the registered form of a sink without one is unchanged.
            **({"storage_conn_id": self.storage_conn_id} if self.storage_conn_id is not None else {}),
        }


SinkConfig = IcebergSinkConfig | FileSinkConfig


def sink_config_from_dict(data: Mapping[str, Any]) -> SinkConfig:
    """The inverse of ``to_dict``, refusing unknown kinds and fields by name."""
    values = dict(data)
    kind = values.pop("kind", None)
    try:
        if kind == "iceberg":
            if "clock_skew_s" in values:
                values["clock_skew"] = timedelta(seconds=float(values.pop("clock_skew_s")))
            values["tables"] = tuple(values.get("tables", ()))
            sink_id = str(values.get("sink_id"))
            flat = {name: values.pop(name) for name in _FLAT_UPSERT if name in values}
            if flat:  # registered before the settings were nested
                values["upsert"] = _upsert_spec(sink_id, flat)
            elif values.get("upsert") is not None:
                values["upsert"] = _validated_spec(sink_id, values["upsert"])
            return IcebergSinkConfig(**values)
        if kind == "files":
            return FileSinkConfig(**values)
    except TypeError as exc:
        raise InvalidSinkConfig(mask_userinfo(f"sink configuration {data!r}: {exc}")) from None
    raise InvalidSinkConfig(f"sink configuration has unknown kind {kind!r}; expected 'iceberg' or 'files'")
